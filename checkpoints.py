"""checkpoints.py: checkpoints, resume and the graceful stop for train_gpt.py, which imports this module only
when SAVE_EVERY or RESUME is set (a 10-minute record run never checkpoints) and logs its sha256.

A checkpoint is a folder CHECKPOINT_DIR/<RUN_ID>/step_NNNNNN/ holding state.pt (weights, optimizer states and
EMA: tensors only) and meta.json (the loop state, the data position, every setting). It is written as
step_NNNNNN.tmp/ and renamed once complete, so a killed write leaves the earlier checkpoints as they were.
One that cannot be written (a full disk) is a warning, and training goes on: the earlier checkpoints stand.
A first SIGTERM or SIGINT finishes the step, checkpoints and exits; a second exits at once.

This module imports nothing of train_gpt.py: the trainer hands the Keeper what it uses of it, and acts on
what the Keeper returns (the loop state to go on from; after a signal, the line that names the command which
resumes the run, from settings.py)."""

import errno
import hashlib
import io
import json
import os
import shutil
import signal
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

import settings

# A checkpoint on ARTIFACT_DIR's disk leaves this much free: the artifact (16,000,000 bytes at most, with its
# code) and the log's last lines.
ARTIFACT_ROOM = 17_000_000


def nearest(folder: Path) -> Path:
    """folder, or its nearest parent that exists (one yet to be made is on that one's disk)."""
    return settings.writable(folder)[0]


def checkpoint_folders(root: Path) -> list[Path]:
    """Finished checkpoints, oldest first; a .tmp folder is a write that never completed."""
    found = [p for p in root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp")]
    return sorted(found)


class StopSignal:
    """Records a first SIGTERM or SIGINT for the loop to act on after its step; a second one, later than
    2 s (a scheduler and torchrun may both deliver the first), exits at once."""

    def __init__(self):
        self.signum = 0
        self.first_at = 0.0
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self)

    def __call__(self, signum, frame):
        now = time.monotonic()
        if not self.signum:
            self.signum = signum
            self.first_at = now
        elif now - self.first_at > 2.0:
            os._exit(128 + signum)


def sha256(data) -> str:
    return hashlib.sha256(data).hexdigest()


class Keeper:
    """The checkpoints of one run: the resume (checked at startup), then periodic and signalled saves.
    From the trainer: its source and training shards (a resume's data position is checked against them) and
    the error it prints without a traceback. settings.py has checked that CHECKPOINT_DIR can be written."""

    def __init__(self, hp, source: bytes, shards: list, error):
        self.hp = hp
        self.source_sha256 = sha256(source)
        self.shards = shards
        self.error = error
        self.stop = None
        self.folder = None  # the checkpoint a resume continues from
        self.meta = None
        if hp.resume:
            self.folder, self.meta = self.resolve_resume()

    @property
    def signum(self) -> int:
        return self.stop.signum if self.stop else 0

    def describe(self) -> str:
        code = Path(__file__).read_bytes()
        return f"checkpoints: {Path(__file__).name} bytes:{len(code)} sha256:{sha256(code)}"

    def continues_log(self) -> bool:
        """Whether this run continues its own log: a resume of this RUN_ID by the same script."""
        if not self.meta or self.meta["run_id"] != self.hp.run_id:
            return False
        if self.meta["source_sha256"] != self.source_sha256:
            raise self.error(f"RUN_ID={self.hp.run_id}: its log exists and the script changed since "
                             "the checkpoint; continue it under a new RUN_ID")
        return True

    def resolve_resume(self) -> tuple[Path, dict]:
        """RESUME as a checkpoint folder (latest: the newest of RUN_ID) and its meta, read and checked: a damaged
        checkpoint, another model's (a setting of the model's config, GPTConfig, differs), or one with
        a later history of its own is refused."""
        hp, error = self.hp, self.error
        root = Path(hp.checkpoint_dir) / hp.run_id
        folder = Path(hp.resume)
        if hp.resume == "latest":
            found = checkpoint_folders(root) if hp.run_id else []
            if not found:
                raise error(f"RESUME=latest: no checkpoint of RUN_ID={hp.run_id!r} in {hp.checkpoint_dir}; "
                            "set RUN_ID to the run to resume")
            folder = found[-1]
        if not (folder / "meta.json").is_file():
            raise error(f"RESUME={hp.resume}: {folder / 'meta.json'} does not exist; point RESUME at a "
                        "step_NNNNNN folder of a checkpoint, or use RESUME=latest with the run's RUN_ID")
        try:
            meta = self.read_meta(folder)
        except Exception as e:
            raise error(f"RESUME={folder}: the checkpoint is damaged ({type(e).__name__}: {e}); resume an "
                        "earlier one") from None
        defaults = asdict(type(hp)())  # a checkpoint older than a setting ran its default
        # one written before the settings took the field's names (2026-11-25) has them under their old names
        old_names = {new.lower(): old.lower() for old, new in settings.INSTEAD.items() if new}
        logged = meta["hyperparameters"]
        for name, value in asdict(hp.model_config).items():
            saved = logged.get(name, logged.get(old_names.get(name), defaults[name]))
            if saved != value:
                raise error(f"RESUME={folder}: the checkpoint has {name.upper()}={saved} but this run has "
                            f"{name.upper()}={value}; set it to match")
        newer = [p for p in checkpoint_folders(root) if p.name > folder.name]
        if meta["run_id"] == hp.run_id and newer:  # its next checkpoints would interleave with another history
            raise error(f"RESUME={folder}: RUN_ID={hp.run_id} already has later checkpoints ({newer[-1].name});"
                        " resume the newest with RESUME=latest, or continue this one under a new RUN_ID")
        return folder, meta

    def read_meta(self, folder: Path) -> dict:
        # the tensors are mapped, not read: this finds a damaged file, not a flipped bit
        meta = json.loads((folder / "meta.json").read_text())
        saved = torch.load(folder / "state.pt", map_location="cpu", weights_only=True, mmap=True)
        missing = {"model", "adam", "muon", "ema"} - saved.keys()
        missing |= {"run_id", "source_sha256"} - meta.keys()
        if missing:
            raise ValueError(f"its state.pt holds {sorted(saved)} and its meta.json {sorted(meta)}")
        index, pos = meta["loader"]
        in_data = 0 <= index < len(self.shards) and 0 <= pos <= len(self.shards[index])
        if not in_data:
            raise ValueError(f"its data position {meta['loader']} is not in DATA_PATH's training shards")
        return meta

    def restore(self, run, optimizers: list, ema, loader) -> dict:
        """Log this module's fingerprint and listen for signals; with RESUME, load the checkpoint into this
        run, whatever its world size. Returns what the checkpoint says of the loop state ({}: start afresh)."""
        run.log(self.describe())
        self.stop = StopSignal()
        if not self.meta:
            return {}
        folder = self.folder
        saved = torch.load(folder / "state.pt", map_location=run.layout.device, weights_only=True)
        run.model.load_state_dict(saved["model"])
        if hasattr(run.model, "loop_on"):  # the depth-recurrence phase the checkpoint was saved in
            run.model.set_looping(bool(run.model.loop_on))
        for opt, key in zip(optimizers, ("adam", "muon")):  # the states; the LRs are this run's
            groups = opt.state_dict()["param_groups"]
            opt.load_state_dict({"state": saved[key]["state"], "param_groups": groups})
        if ema.params is not None:  # an EMA turned on at the resume starts from the resumed weights
            torch._foreach_copy_(ema.params, saved["ema"] or [p.detach() for p in run.model.parameters()])
        loader.position = list(self.meta["loader"])
        run.log(f"resume: from {folder} at step:{self.meta['step']} train_time:{self.meta['training_time_ms']:.0f}ms")
        return self.meta

    def due(self, state, signum: int) -> bool:  # a signal, every SAVE_EVERY steps, and at the end
        if signum:
            return True
        every = self.hp.save_every
        return every > 0 and (state.step % every == 0 or state.ended(self.hp))

    def save(self, run, optimizers: list, ema, loader, state, signum: int) -> Path | None:
        """Rank 0 writes the checkpoint; then local rank 0 of each node that cannot see it (no shared file
        system) writes a copy. One that cannot be written is a warning. Returns the newest whole checkpoint,
        which resumes the run (None: there is none); after a signal, it logs the line that names it."""
        layout = run.layout
        root = Path(self.hp.checkpoint_dir) / self.hp.run_id
        folder = root / f"step_{state.step:06d}"
        contents = (run, optimizers, ema, loader, state)
        outcome = [self.write(folder, *contents) if layout.rank == 0 else None]
        if layout.distributed:  # the other nodes copy only a checkpoint that rank 0 could write
            dist.broadcast_object_list(outcome, src=0)
        unwritten = outcome[0]
        if not unwritten and layout.local_rank == 0 and layout.rank != 0 and not folder.exists():
            unwritten = self.write(folder, *contents)
        if layout.distributed:  # one node without its copy: no node keeps it, so every node resumes alike
            found = [None] * layout.world_size
            dist.all_gather_object(found, unwritten)
            unwritten = next((line for line in found if line), None)
            if unwritten and layout.local_rank == 0:
                shutil.rmtree(folder, ignore_errors=True)
        why = signal.Signals(signum).name if signum else "periodic"
        if unwritten:
            run.log(unwritten if signum else f"{unwritten}; training goes on")
        else:
            run.log(f"checkpoint: {folder} step:{state.step} ({why})")
        whole = checkpoint_folders(root)
        newest = whole[-1] if whole else None
        if signum:
            run.log(self.stopped(newest, state.step, signum))
        return newest

    def write(self, folder: Path, run, optimizers: list, ema, loader, state) -> str | None:
        """The checkpoint whole or not at all; returns None, or the warning that says why not."""
        tmp = folder.with_name(folder.name + ".tmp")
        adam, muon = optimizers
        tensors = {"model": run.model.state_dict(), "adam": adam.state_dict(), "muon": muon.state_dict(),
                   "ema": ema.params}  # training draws no random numbers: no generator state
        meta = dict(run_id=self.hp.run_id, source_sha256=self.source_sha256, world_size=run.layout.world_size,
                    loader=loader.position, hyperparameters=asdict(self.hp), **asdict(state))
        state_pt = io.BytesIO()  # made in memory: its size is known before the disk is touched
        torch.save(tensors, state_pt)
        meta_json = json.dumps(meta, indent=1).encode()
        needed = state_pt.tell() + len(meta_json)
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir(parents=True)
            if shutil.disk_usage(tmp).free < needed + self.kept_free(tmp):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            (tmp / "state.pt").write_bytes(state_pt.getbuffer())
            (tmp / "meta.json").write_bytes(meta_json)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            return self.unwritten(folder, needed, e)
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
        root = folder.parent
        stale = [p for p in root.glob("step_*.tmp") if p != tmp]  # writes that were killed halfway
        if self.hp.keep_checkpoints:
            stale += checkpoint_folders(root)[:-self.hp.keep_checkpoints]
        for old in stale:
            shutil.rmtree(old)
        return None

    def kept_free(self, folder: Path) -> int:
        """Bytes a checkpoint leaves free on the disk of ARTIFACT_DIR: the artifact, which is worth more."""
        disks = {os.stat(nearest(Path(path))).st_dev for path in (folder, self.hp.artifact_dir)}
        return ARTIFACT_ROOM if len(disks) == 1 else 0

    def unwritten(self, folder: Path, needed: int, error: OSError) -> str:
        """One line: which folder, the bytes needed and free, the checkpoint that RESUME can still use."""
        existing = nearest(folder)
        free = shutil.disk_usage(existing).free
        kept = self.kept_free(existing)
        also = f" (and {kept} kept free for ARTIFACT_DIR's artifact)" if kept else ""
        whole = checkpoint_folders(folder.parent)  # none where the folder was never made
        newest = f"the newest whole one is {whole[-1]} (RESUME=latest)" if whole else "there is no earlier one"
        return (f"WARNING: checkpoint {folder.name} not written: CHECKPOINT_DIR={self.hp.checkpoint_dir}: "
                f"{error.strerror}: it needs {needed} bytes{also} and {free} are free; {newest}; free space there "
                "or set CHECKPOINT_DIR to another disk")

    def stopped(self, newest: Path | None, step: int, signum: int) -> str:
        """The line of a run that a first SIGTERM or SIGINT checkpointed: the command that resumes it."""
        environ = {**os.environ, "RESUME": str(newest), "RUN_ID": self.hp.run_id}
        then = "no checkpoint to resume from"
        if newest:
            then = f"resume with: {settings.launch_command(self.hp, environ)}"
        return f"stopped by {signal.Signals(signum).name} after step:{step}; {then}"

    def close(self) -> None:  # training is over: a signal now stops the export, with no checkpoint
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)

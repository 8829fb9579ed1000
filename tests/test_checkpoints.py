"""checkpoints.py: periodic checkpoints, exact resume on 1 and 2 processes, a killed write,
refused resumes, and the graceful stop on SIGTERM (with SAVE_EVERY or RESUME set: only then is
it imported)."""

import dataclasses
import errno
import hashlib
import inspect
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import checkpoints
import train_gpt as tg
from conftest import ROOT, TRAINING_LEVERS, Reads, all_on_hp, as_env, new_keeper, run_trainer, tiny_hp

FINAL_RE = re.compile(r"final_int6_zlib_roundtrip_exact val_loss:(\S+) val_bpb:(\S+)")
TTT_RE = re.compile(r"final_int6_zlib_ttt_exact val_loss:(\S+) val_bpb:(\S+)")
# Every lever that shapes training on, over 3 layers, so that its state has to survive the resume too (EMA's,
# Muon's, the loop phase's: the depth recurrence switches on at step 12, between the checkpoint at 10 and the
# end), LQER in the export, and TTT after it; on short_val_data, whose final passes take a second
LONG_RUN = dict(
    as_env(TRAINING_LEVERS, num_layers=3, loop_end=1, num_loops=1, parallel_start_layer=2, enable_looping_at=0.6,
           lqer_enabled=True, lqer_rank=2, lqer_top_k=2, matrix_bits=6, ttt_enabled=True, ttt_lora_rank=4,
           ttt_chunk_size=64, ttt_lora_lr=0.001),
    ITERATIONS="20", SAVE_EVERY="5", KEEP_CHECKPOINTS="3", VAL_LOSS_EVERY="10",
)


def artifact_sha(cwd, run_id) -> str:
    artifact = cwd / "logs" / f"{run_id}_model.int6_zlib.ptz"
    return hashlib.sha256(artifact.read_bytes()).hexdigest()


def final(pattern: re.Pattern, stdout: str) -> float:
    return float(pattern.search(stdout).group(1))


@pytest.fixture(scope="module")
def straight_run(short_val_data, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("straight")
    out = run_trainer(short_val_data.env(RUN_ID="straight", **LONG_RUN), cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    return cwd, out


def test_periodic_checkpoints_keep_the_newest(straight_run):
    cwd, out = straight_run
    folders = checkpoints.checkpoint_folders(cwd / "checkpoints" / "straight")
    assert [f.name for f in folders] == ["step_000010", "step_000015", "step_000020"]
    meta = json.loads((folders[0] / "meta.json").read_text())
    assert meta["step"] == 10
    assert meta["training_time_ms"] > 0
    state = torch.load(folders[0] / "state.pt", weights_only=True)
    assert state["model"]["loop_on"] == 0, "at step 10 the depth recurrence is still off"
    assert TTT_RE.search(out.stdout)
    assert re.search(r"final_int6_zlib_ttt val_loss:\S+ val_bpb:\S+ eval_time:\d+ms", out.stdout)


def test_resume_is_bitwise_identical_on_one_process(straight_run, short_val_data):
    cwd, out = straight_run
    assert "phase: from step:12 depth_recurrence:on" in out.stdout
    env = short_val_data.env(RUN_ID="resumed", RESUME="checkpoints/straight/step_000010", **LONG_RUN)
    resumed = run_trainer(env, cwd)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resume: from checkpoints/straight/step_000010 at step:10" in resumed.stdout
    assert FINAL_RE.search(resumed.stdout).group(0) == FINAL_RE.search(out.stdout).group(0)
    assert TTT_RE.search(resumed.stdout).group(0) == TTT_RE.search(out.stdout).group(0)
    same = artifact_sha(cwd, "resumed") == artifact_sha(cwd, "straight")
    assert same, "the exported weights differ"


def test_a_resumed_run_counts_the_training_time_already_spent(straight_run, short_val_data):
    """The wallclock cap covers the whole run: a checkpoint that already used more than a
    resumed run's cap stops that run at once, at the checkpoint's step, without another
    training step."""
    cwd, _ = straight_run
    meta = cwd / "checkpoints" / "straight" / "step_000010" / "meta.json"
    spent_ms = json.loads(meta.read_text())["training_time_ms"]
    settings = {**LONG_RUN, "ITERATIONS": "1000", "MAX_WALLCLOCK_SECONDS": f"{spent_ms / 2000:.3f}"}
    env = short_val_data.env(RUN_ID="capped", RESUME="checkpoints/straight/step_000010", **settings)
    out = run_trainer(env, cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    stop = r"^stopping_early: wallclock_cap train_time:\d+ms step:10/1000$"
    assert re.search(stop, out.stdout, flags=re.M)
    assert not re.search(r"^step:11/", out.stdout, flags=re.M)


def test_resume_on_two_processes(straight_run, short_val_data, tmp_path):
    _, one = straight_run
    pair = run_trainer(short_val_data.env(RUN_ID="pair", **LONG_RUN), tmp_path, nproc=2)
    assert pair.returncode == 0, pair.stderr[-3000:]
    env = short_val_data.env(RUN_ID="pair2", RESUME="checkpoints/pair/step_000010", **LONG_RUN)
    resumed = run_trainer(env, tmp_path, nproc=2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    straight = final(FINAL_RE, pair.stdout)
    assert abs(straight - final(FINAL_RE, resumed.stdout)) < 1e-6
    one_process = final(FINAL_RE, one.stdout)
    assert abs(straight - one_process) < 1e-4, "1 and 2 processes, every technique on"
    # TTT's score depends on the world size (each rank's A carries over its groups): test_run.py
    # test_two_processes_match_one_with_every_lever_on holds each world size to its one-process rescoring
    assert final(TTT_RE, pair.stdout) != straight, "TTT changed nothing"
    assert final(TTT_RE, one.stdout) != one_process, "TTT changed nothing"
    same = artifact_sha(tmp_path, "pair2") == artifact_sha(tmp_path, "pair")
    assert same, "same world size: bitwise too"


# ---- the Keeper, in this process ----


class Training:
    """A tiny model, its optimizers and loader, as a run holds them; RUN_ID=unit."""

    def __init__(self, tiny_data, tmp_path, **overrides):
        values = dict(vocab_size=tiny_data.vocab_size, run_id="unit", checkpoint_dir=str(tmp_path / "ckpt"),
                      data_path=str(tiny_data.data_path))
        self.hp = tiny_hp(**{**values, **overrides})
        self.run = tg.Run(self.hp, tg.Layout(), None, b"source", model=tg.GPT(self.hp))
        self.optimizers = tg.build_optimizers(self.run.model, self.hp, self.run.layout)
        self.ema = tg.EMA(self.run.model, 0.0)
        self.loader = tg.DistributedTokenLoader(tg.train_pattern(self.hp.data_path))
        self.root = tmp_path / "ckpt" / "unit"

    def step(self) -> None:
        batches = [self.loader.next_batch(512, self.hp.train_seq_len, 1)]
        tg.train_step(self.run.model, batches, self.optimizers, 1.0, 0.0, self.run.layout)

    def save(self, step: int):
        """A periodic checkpoint at step; returns its folder."""
        keeper = new_keeper(self.hp, self.run.source)
        state = tg.LoopState(step=step)
        keeper.save(self.run, self.optimizers, self.ema, self.loader, state, 0)
        return self.root / f"step_{step:06d}"


def keeper_for(hp: tg.Hyperparameters) -> checkpoints.Keeper:
    """The Keeper a run with these settings builds at startup: it resolves RESUME, or refuses."""
    return new_keeper(hp)


def test_a_write_killed_halfway_leaves_the_last_checkpoint(tiny_data, tmp_path, monkeypatch):
    training = Training(tiny_data, tmp_path)
    training.step()
    first = training.save(1)
    training.step()
    real_write = Path.write_bytes

    class Killed(BaseException):  # a kill mid-write: no handler runs
        pass

    def dying_write(path, data):  # the checkpoint's state.pt is half written when the process dies
        real_write(path, bytes(data)[:len(data) // 2])
        raise Killed

    monkeypatch.setattr(Path, "write_bytes", dying_write)
    with pytest.raises(Killed):
        training.save(2)
    monkeypatch.setattr(Path, "write_bytes", real_write)
    folders = checkpoints.checkpoint_folders(training.root)
    assert folders == [first], "the half-written step_000002 must not count"
    assert (training.root / "step_000002.tmp").exists()
    fresh = Training(tiny_data, tmp_path, resume="latest")
    keeper = keeper_for(fresh.hp)
    assert keeper.meta["step"] == 1
    state = keeper.restore(fresh.run, fresh.optimizers, fresh.ema, fresh.loader)
    keeper.close()  # restore() listens for SIGTERM and SIGINT: give them back to pytest
    assert state["step"] == 1
    saved = torch.load(first / "state.pt", weights_only=True)["model"]
    restored = fresh.run.model.state_dict()
    assert all(torch.equal(restored[name], w) for name, w in saved.items()), "the step-1 weights"


def full_disk_write(monkeypatch):
    """Path.write_bytes as a full disk fails it: state.pt gets 100 bytes, then ENOSPC."""
    real_write = Path.write_bytes

    def write(path, data):
        if path.name != "state.pt":
            return real_write(path, data)
        real_write(path, bytes(data)[:100])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_bytes", write)


def contents(folder) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


UNWRITTEN = (r"WARNING: checkpoint step_000002 not written: CHECKPOINT_DIR=.*ckpt: No space left on device: it "
             r"needs (\d+) bytes(?: \(and 17000000 kept free for ARTIFACT_DIR's artifact\))? and \d+ are free; the "
             r"newest whole one is .*step_000001 \(RESUME=latest\); free space there or set CHECKPOINT_DIR to another "
             r"disk")


def test_a_full_disk_at_a_checkpoint_warns_in_one_line_and_training_goes_on(tiny_data, tmp_path, monkeypatch):
    """A periodic checkpoint that cannot be written is a warning, not the end of the run: the line names the
    folder, the bytes needed and free and the checkpoint RESUME can use; the partial folder is removed and
    the earlier checkpoint is untouched. The next checkpoint, with room again, is written."""
    training = Training(tiny_data, tmp_path)
    lines = []
    training.run.log = lambda message, console=True: lines.append(message)
    training.step()
    first = training.save(1)
    kept = contents(first)
    training.step()
    full_disk_write(monkeypatch)
    training.save(2)  # returns: training goes on
    found = re.fullmatch(UNWRITTEN + "; training goes on", lines[-1])
    assert found, lines[-1]
    assert abs(int(found.group(1)) - sum(map(len, kept.values()))) < 200, "needed: about one checkpoint"
    assert checkpoints.checkpoint_folders(training.root) == [first]
    assert sorted(p.name for p in training.root.iterdir()) == ["step_000001"], "the partial folder is left"
    assert contents(first) == kept
    monkeypatch.undo()
    training.step()
    third = training.save(3)
    assert checkpoints.checkpoint_folders(training.root) == [first, third]


def test_a_signalled_checkpoint_on_a_full_disk_stops_with_the_newest_whole_one(tiny_data, tmp_path, monkeypatch):
    """SIGTERM asks for a checkpoint and the disk has no room (found before writing): the run still stops,
    and its resume command names the checkpoint that is whole. Nothing is written."""
    training = Training(tiny_data, tmp_path)
    lines = []
    training.run.log = lambda message, console=True: lines.append(message)
    first = training.save(1)
    kept = contents(first)
    monkeypatch.setattr(checkpoints.shutil, "disk_usage", lambda path: SimpleNamespace(free=1000))
    keeper = new_keeper(training.hp)
    state = tg.LoopState(step=2)
    newest = keeper.save(training.run, training.optimizers, training.ema, training.loader, state, signal.SIGTERM)
    assert newest == first, "the Keeper returns the checkpoint that resumes the run"
    assert re.fullmatch(UNWRITTEN.replace(r"\d+ are free", "1000 are free"), lines[-2]), lines[-2]
    assert re.fullmatch(rf"stopped by SIGTERM after step:2; resume with: .*RESUME={re.escape(str(first))} "
                        r"RUN_ID=unit .*python train_gpt.py", lines[-1]), lines[-1]
    assert sorted(p.name for p in training.root.iterdir()) == ["step_000001"]
    assert contents(first) == kept


def test_a_checkpoint_leaves_room_for_the_artifact_on_its_disk(tiny_data, tmp_path, monkeypatch):
    """On ARTIFACT_DIR's disk a checkpoint that would leave less than the artifact's room is not written:
    the artifact is worth more. With that room to spare, it is."""
    training = Training(tiny_data, tmp_path, artifact_dir=str(tmp_path / "logs"))
    lines = []
    training.run.log = lambda message, console=True: lines.append(message)
    free = [checkpoints.ARTIFACT_ROOM + 1000]
    monkeypatch.setattr(checkpoints.shutil, "disk_usage", lambda path: SimpleNamespace(free=free[0]))
    training.save(1)
    assert re.search(r"it needs \d+ bytes \(and 17000000 kept free for ARTIFACT_DIR's artifact\) and 17001000 "
                     r"are free; there is no earlier one", lines[-1]), lines[-1]
    assert not training.root.exists() or not list(training.root.iterdir())
    free[0] = checkpoints.ARTIFACT_ROOM + 10**7
    second = training.save(2)
    assert checkpoints.checkpoint_folders(training.root) == [second]


def test_a_signalled_stop_with_no_whole_checkpoint_says_there_is_none(tiny_data, tmp_path, monkeypatch):
    training = Training(tiny_data, tmp_path)
    lines = []
    training.run.log = lambda message, console=True: lines.append(message)
    monkeypatch.setattr(checkpoints.shutil, "disk_usage", lambda path: SimpleNamespace(free=1000))
    state = tg.LoopState(step=1)
    keeper = new_keeper(training.hp)
    newest = keeper.save(training.run, training.optimizers, training.ema, training.loader, state, signal.SIGINT)
    assert newest is None
    assert "there is no earlier one" in lines[-2]
    assert lines[-1] == "stopped by SIGINT after step:1; no checkpoint to resume from"


def test_the_keeper_is_handed_no_module_and_calls_nothing_back(tiny_data, tmp_path):
    """The hidden circles of before: setup() handed the Keeper the trainer module itself, then the trainer's
    launch_command and shutdown, which the Keeper called to stop the run. Now it is handed data and the error
    class, and returns what it decided: the trainer stops the run."""
    env = tiny_data.env(SAVE_EVERY="5", CHECKPOINT_DIR=tmp_path / "ckpt", ARTIFACT_DIR=tmp_path / "logs")
    keeper = tg.setup(env).keeper
    assert isinstance(keeper, checkpoints.Keeper)
    handed = {name: value for name, value in vars(keeper).items()
              if inspect.ismodule(value) or inspect.isfunction(value) or inspect.ismethod(value)}
    assert not handed, handed


def test_the_model_reads_exactly_its_config():
    """A resume compares the model's config (GPTConfig) with the checkpoint's: so the model reads nothing else
    (a config of only those fields builds and runs it, every lever on, loops off and on), and every field of it
    (none of them is stale)."""
    hp = Reads(all_on_hp().model_config)
    model = tg.GPT(hp)
    for looping in (False, True):
        model.set_looping(looping)
        x = torch.randint(0, hp.hp.vocab_size, (2, hp.hp.train_seq_len))  # not the model's reads
        model(x, x)
    assert hp.names == {f.name for f in dataclasses.fields(tg.GPTConfig)}


def test_checkpoint_of_another_model_is_refused(tiny_data, tmp_path):
    folder = Training(tiny_data, tmp_path).save(3)
    other = tg.Hyperparameters(vocab_size=tiny_data.vocab_size, num_layers=2, model_dim=64,
                               num_heads=4, num_kv_heads=2, resume=str(folder),
                               data_path=str(tiny_data.data_path))
    refusal = "the checkpoint has MODEL_DIM=32 but this run has MODEL_DIM=64"
    with pytest.raises(tg.ConfigError, match=refusal):
        keeper_for(other)
    missing = tg.Hyperparameters(resume=str(tmp_path / "nowhere"))
    with pytest.raises(tg.ConfigError, match="meta.json does not exist"):
        keeper_for(missing)


def test_resuming_an_older_checkpoint_of_the_same_run_is_refused(tiny_data, tmp_path):
    training = Training(tiny_data, tmp_path)
    older = training.save(1)
    training.save(2)
    hp = training.hp
    hp.resume = str(older)
    refusal = r"RUN_ID=unit already has later checkpoints \(step_000002\)"
    with pytest.raises(tg.ConfigError, match=refusal):
        keeper_for(hp)
    # the same checkpoint under a new RUN_ID is fine
    hp.run_id = "branch"
    hp.resume = str(older)
    assert keeper_for(hp).meta["step"] == 1


def test_sigterm_checkpoints_then_resume_latest_continues_the_log(tiny_data, tmp_path):
    # SAVE_EVERY far beyond the steps it runs: the checkpoint it leaves is the signal's
    env = tiny_data.env(RUN_ID="long", ITERATIONS="100000", TRAIN_LOG_EVERY="1",
                        SAVE_EVERY="100000")
    # stderr to a file: a pipe nobody drains could fill and stall the run
    with open(tmp_path / "stderr.txt", "w") as stderr:
        proc = subprocess.Popen([sys.executable, str(ROOT / "train_gpt.py")], env=env, cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=stderr, text=True)
    deadline = time.time() + 120
    seen = ""
    # until training is under way, or the deadline
    while "step:3/" not in seen and time.time() < deadline:
        if select.select([proc.stdout], [], [], max(0.0, deadline - time.time()))[0]:
            seen += proc.stdout.readline()
    assert "step:3/" in seen, "the run never reached step 3"
    proc.send_signal(signal.SIGTERM)
    stdout = seen + proc.communicate(timeout=120)[0]
    assert proc.returncode == 128 + signal.SIGTERM, (tmp_path / "stderr.txt").read_text()[-3000:]
    match = re.search(r"stopped by SIGTERM after step:(\d+); resume with: (.*)", stdout)
    assert match, stdout[-2000:]
    assert "RESUME=checkpoints/long/step_" in match.group(2)
    assert "RUN_ID=long" in match.group(2)
    stopped_at = int(match.group(1))
    newest = checkpoints.checkpoint_folders(tmp_path / "checkpoints" / "long")[-1]
    assert newest.name == f"step_{stopped_at:06d}"
    # resume the newest checkpoint of the run, this time with an end in sight; its log continues
    end = stopped_at + 3
    out = run_trainer(tiny_data.env(RUN_ID="long", RESUME="latest", ITERATIONS=str(end)), tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    log = (tmp_path / "logs" / "long.txt").read_text()
    headers = re.findall(r"^==== train_gpt.py source bytes:", log, flags=re.M)
    assert len(headers) == 1, "one header, then appended"
    assert f"resume: from checkpoints/long/step_{stopped_at:06d} at step:{stopped_at}" in log
    assert f"step:{end}/{end} val_loss" in log


def test_byte_codec_round_trips(tmp_path):
    """The byte tokenizer's decoder inverts its encoding (id = byte + offset), control ids decode to
    nothing. (About the byte tokenizer, not checkpoints: kept here as it was.)"""
    spec = {"tokenizer_type": "pure_byte", "vocab_size": 260, "config": {"byte_offset": 4}}
    (tmp_path / "byte260.json").write_text(json.dumps(spec))
    _, decode = tg.read_pieces(tmp_path / "byte260.json")
    text = "Fellow citizens — ünïcödé 🚀"
    ids = [4 + b for b in text.encode("utf-8")]
    assert decode([tg.BOS_ID] + ids) == text

"""What the benches share: a run's weights (its artifact, or a checkpoint's floats) and settings, read back,
and a single CPU process's Run of them."""

import dataclasses
import importlib.util
import io
import json
import sys
import zlib
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import settings  # noqa: E402
import train_gpt as tg  # noqa: E402

# The `hyperparameters:` line of a log written before 2026-11-25 names settings as they were then: train_gpt's
# renames (a value with a note, "GPTQ_CALIB_SEQS (sequences)", names no field, so its setting is dropped)
OLD_NAMES = {old.lower(): new.lower() for old, new in settings.INSTEAD.items() if new}


def reader_module(path: Path | None):
    """The train_gpt.py that wrote an artifact of an older format (None: this one)."""
    if path is None:
        return tg
    spec = importlib.util.spec_from_file_location("reader_train_gpt", path)
    reader = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = reader  # dataclasses look it up
    spec.loader.exec_module(reader)
    return reader


def challenge_export_bytes(challenge, state: dict) -> int:
    """Bytes of the challenge's int8+zlib export of state, by its own functions (challenge: its train_gpt.py
    as reader_module loads it)."""
    quantized, _ = challenge.quantize_state_dict_int8(state)
    buffer = io.BytesIO()
    torch.save(quantized, buffer)
    return len(zlib.compress(buffer.getvalue(), level=9))


def add_run_arguments(parser) -> None:
    parser.add_argument("artifact", type=Path,
                        help="logs/<run>_model.<export>.ptz, or a checkpoints/<run>/step_N folder")
    parser.add_argument("log", type=Path,
                        help="the run's log: its hyperparameters line gives the model's shape")
    parser.add_argument("--reader", type=Path,
                        help="the train_gpt.py that wrote the artifact, if its format is older")


def logged_settings(log: Path) -> tg.Hyperparameters:
    """The settings of a run's `hyperparameters:` line, old names as today's; retired ones dropped."""
    prefix = "hyperparameters: "
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.startswith(prefix)]
    if not lines:
        raise SystemExit(f"{log}: no '{prefix}' line; pass the log train_gpt.py wrote for this run")
    logged = json.loads(lines[0].removeprefix(prefix))
    if "lqer_rank" in logged and "lqer_enabled" not in logged:  # then, LQER_RANK=0 was off
        rank = logged.pop("lqer_rank")
        if rank:
            logged.update(lqer_enabled=True, lqer_rank=rank)
    known = {f.name for f in dataclasses.fields(tg.Hyperparameters)}
    settings = {}
    for name, value in logged.items():
        name = OLD_NAMES.get(name, name)
        if name in known:
            settings[name] = value
    return tg.Hyperparameters(**settings)


def read_run(args) -> tuple[tg.Hyperparameters, dict]:
    """(settings, state dict) of the run named by add_run_arguments' arguments."""
    hp = logged_settings(args.log)
    if args.artifact.is_dir():  # a checkpoint: the float weights as trained
        checkpoint = torch.load(args.artifact / "state.pt", map_location="cpu", weights_only=True)
        return hp, checkpoint["model"]
    return hp, reader_module(args.reader).load_artifact(args.artifact)


def cpu_run(hp: tg.Hyperparameters, state: dict, use_compile: bool = False) -> tg.Run:
    """One CPU process's Run of these settings: its validation data, and the model holding state."""
    layout = tg.Layout(use_compile=use_compile)
    try:
        tokenizer = tg.load_tokenizer(hp.tokenizer_path, hp.vocab_size)
        val = tg.load_validation(hp, tokenizer)
    except tg.ConfigError as error:  # the log's paths are as the run saw them
        raise SystemExit(f"{error}\n(DATA_PATH and TOKENIZER_PATH come from the run's log: run this from "
                         "the folder the run ran in)") from None
    run = tg.Run(hp, layout, val, source=b"", log=print)
    load_model(run, state)
    return run


def load_model(run: tg.Run, state: dict) -> None:
    """run.model built afresh from run.hp, holding state; its scorer and trainer, compiled or not."""
    run.model = tg.GPT(run.hp)
    try:
        run.model.load_state_dict(state, strict=True)
    except RuntimeError as error:
        raise SystemExit(f"{error}\nThe weights do not fit the model the log's settings build: pass the log "
                         "of the run that wrote them (or --reader for an older format)") from None
    # the depth-recurrence phase the weights were trained in, which they carry
    run.model.set_looping(bool(state.get("loop_on", 0)))
    run.scorer = run.model
    if run.layout.use_compile:
        run.scorer = torch.compile(run.model, dynamic=False)
    run.trainer = run.scorer

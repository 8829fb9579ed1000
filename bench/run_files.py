"""What the benches share: a run's weights (its artifact, or a checkpoint's floats) and settings, read back."""

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import train_gpt as tg  # noqa: E402


def reader_module(path: Path | None):
    """The train_gpt.py that wrote an artifact of an older format (None: this one)."""
    if path is None:
        return tg
    spec = importlib.util.spec_from_file_location("reader_train_gpt", path)
    reader = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(reader)
    return reader


def add_run_arguments(parser) -> None:
    parser.add_argument("artifact", type=Path, help="logs/<run>_model.<export>.ptz, or a checkpoints/<run>/step_N folder")
    parser.add_argument("log", type=Path, help="the run's log: its hyperparameters line gives the model's shape")
    parser.add_argument("--reader", type=Path, help="the train_gpt.py that wrote the artifact, if its format is older")


def read_run(args) -> tuple["tg.Hyperparameters", dict]:
    """(settings, state dict) of the run named by add_run_arguments' arguments."""
    line = next(l for l in args.log.read_text().splitlines() if l.startswith("hyperparameters: "))
    known = {f.name for f in dataclasses.fields(tg.Hyperparameters)}
    hp = tg.Hyperparameters(**{k: v for k, v in json.loads(line.removeprefix("hyperparameters: ")).items() if k in known})
    if args.artifact.is_dir():  # a checkpoint: the float weights as trained
        return hp, torch.load(args.artifact / "state.pt", map_location="cpu", weights_only=True)["model"]
    return hp, reader_module(args.reader).load_artifact(args.artifact)

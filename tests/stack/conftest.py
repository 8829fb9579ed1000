"""Fixtures for the technique stack's tests: the frontier stack built once a session into a folder beside copies
of settings.py, checkpoints.py and tools/packing.py (so it runs as it does in the repository), imported as a
module of its own (import train_gpt stays the core), and launched as users launch it."""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import settings
from conftest import ROOT, TINY_HP, TRAINING_LEVERS, TinyData

sys.path.insert(0, str(ROOT / "tools"))
import build_trainer  # noqa: E402

# conftest's TRAINING_LEVERS with the stack's levers that shape training on as well
FRONTIER_LEVERS = dict(TRAINING_LEVERS, doc_mask_enabled=True)
# what the folder of a built trainer holds beside it, as the repository does
BESIDE = ("settings.py", "checkpoints.py", "tools/__init__.py", "tools/packing.py")


def build_into(folder: Path, **choice) -> Path:
    """The stack built (build_trainer.build's stack= or techniques=) as folder/train_gpt.py, with BESIDE."""
    script = folder / "train_gpt.py"
    script.write_bytes(build_trainer.build(build_trainer.Tree(ROOT), **choice))
    for name in BESIDE:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, folder / name)
    return script


def import_trainer(script: Path, name: str):
    """A built train_gpt.py as the module `name` (registered first: its dataclasses look themselves up)."""
    spec = importlib.util.spec_from_file_location(name, script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def frontier_script(tmp_path_factory) -> Path:
    return build_into(tmp_path_factory.mktemp("frontier"), stack=build_trainer.FRONTIER)


@pytest.fixture(scope="session")
def fr(frontier_script):
    """The frontier build of train_gpt.py, imported."""
    return import_trainer(frontier_script, "train_gpt_frontier")


def launch(script: Path, env: dict, cwd: Path, nproc: int = 1) -> subprocess.Popen:
    """Start a trainer as users do: `python train_gpt.py`, or torchrun --standalone with nproc processes (gloo on
    the CPU). The caller waits (communicate()), so that runs can go side by side."""
    cmd = [sys.executable, str(script)]
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(script)]
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def built_env(data: TinyData, script: Path, **overrides) -> dict:
    """data.env() for a built trainer (script): none of the stack's settings inherited either."""
    env = data.env(**overrides)
    core = {row[0] for row in settings.rows()}
    for name, _, _ in settings.rows(trainer=script):
        if name not in core and name not in overrides:
            env.pop(name, None)
    return env


def frontier_hp(fr, **overrides):
    """The tests' tiny model (conftest's TINY_HP) in the built trainer's settings."""
    return fr.Hyperparameters(**{**TINY_HP, **overrides})


def frontier_all_on(fr, **overrides):
    """Every lever that shapes training on (FRONTIER_LEVERS), on the tiny model."""
    return frontier_hp(fr, **{**FRONTIER_LEVERS, **overrides})

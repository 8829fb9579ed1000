"""prototypes/*.patch: each applies to the tree as it is, and the tests it adds pass on the patched copy, so a
change that breaks a prototype fails here rather than when someone next tries it (prototypes/README.md)."""

import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

PATCHES = sorted((ROOT / "prototypes").glob("*.patch"))


def added_tests(patch) -> list[str]:
    """The test functions the patch adds, as pytest node ids."""
    ids = []
    path = None
    for line in patch.read_text().splitlines():
        if line.startswith("+++ b/"):
            path = line.removeprefix("+++ b/")
        elif m := re.match(r"\+def (test_\w+)", line):
            ids.append(f"{path}::{m[1]}")
    return ids


def copy_tree(dest) -> None:
    """The files git sees in the working tree (tracked, or untracked and not ignored), copied to dest."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        if (ROOT / name).is_file():  # a tracked file deleted in the working tree is not copied
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)


def test_there_are_prototypes_and_each_adds_tests():
    assert PATCHES, "prototypes/ holds no patch: this test would check nothing"
    for patch in PATCHES:
        assert added_tests(patch), f"{patch.name} adds no test function"


@pytest.mark.parametrize("patch", PATCHES, ids=[p.stem for p in PATCHES])
def test_a_prototype_applies_and_its_tests_pass(patch, tmp_path):
    tree = tmp_path / "tree"
    copy_tree(tree)
    applied = subprocess.run(["git", "apply", "--verbose", str(patch)], cwd=tree, capture_output=True, text=True)
    assert applied.returncode == 0, f"{patch.name} no longer applies: regenerate it\n{applied.stderr[-3000:]}"
    ids = added_tests(patch)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *ids], cwd=tree,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{patch.name}'s tests fail on the patched tree:\n{out.stdout[-4000:]}"
    assert re.search(r"\d+ passed", out.stdout), out.stdout[-2000:]

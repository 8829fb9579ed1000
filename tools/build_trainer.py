"""One self-contained train_gpt.py from the core (the repository's train_gpt.py) and the technique stack (stack/:
one diff of train_gpt.py per technique, applied in the order stack/manifest.json gives).

    python tools/build_trainer.py --list                                    # each technique, its settings, its cost
    python tools/build_trainer.py --stack frontier --out build/train_gpt.py
    python tools/build_trainer.py --techniques global-phases --out build/train_gpt.py
    python tools/build_trainer.py --stack frontier --at <commit> --out FILE  # the core and stack of a commit
    python tools/build_trainer.py --rebase                                  # after a change to the core
    python tools/build_trainer.py --add NAME FILE        # a new technique: FILE is the frontier with it on

The built file's BUILD line names the stack, its techniques and the core's commit (`+uncommitted` when
train_gpt.py or stack/ differ from it); its log repeats it as `build: ...`, and tools/check_record.py rebuilds the
file from that line. A stack that does not apply is refused, naming the diff and its hunk, and nothing is written.
--out replaces only a file that is itself a build, never the repository's train_gpt.py. stack/README.md says how
to add a technique and what --rebase does.
"""

import argparse
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = "train_gpt.py"
STACK = "stack"
MANIFEST = "stack/manifest.json"
FRONTIER = "frontier"  # the stack of every technique
CUSTOM = "custom"  # the stack name of a --techniques build
NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
BLOB = re.compile(r"[0-9a-f]{40}")
CORE_BUILD = re.compile(rb'^BUILD = "core".*$', re.M)
BUILT = re.compile(rb'^BUILD = "stack:', re.M)
LABEL = re.compile(r"stack:(?P<stack>[a-z0-9-]+) techniques:(?P<techniques>[a-z0-9,-]+) "
                   r"core:(?P<commit>[0-9a-f]{40}|unknown)(?P<uncommitted>\+uncommitted)?")
COST_LINE = re.compile(r"^Cost: .*$", re.M)
CONFLICT_MARKER = re.compile(rb"^(<{7}|\|{7}|={7}|>{7})( |$)", re.M)
# Python tokens that are not code: comments and layout
NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER,
            tokenize.ENCODING}
REBASE_HINT = ("the core changed under it: run python tools/build_trainer.py --rebase "
               "(stack/README.md, \"After a change to the core\")")


class StackError(Exception):
    """A stack that cannot be read, built or rebased; the message names the file, the value and the fix."""


# ---- GIT ----

def git(args, cwd, data=None, check=True, alone=False) -> subprocess.CompletedProcess:
    """git ARGS in cwd (bytes in and out). alone: outside any repository and any user's configuration, for the
    file-level commands (apply, diff --no-index, merge-file), whose output must not depend on either."""
    env = None
    if alone:
        env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull,
                   GIT_CEILING_DIRECTORIES=str(Path(cwd).resolve().parent))
    try:
        done = subprocess.run(["git", *args], cwd=cwd, input=data, capture_output=True, env=env)
    except FileNotFoundError:
        raise StackError("git is not installed: the builder applies the stack's diffs with git apply") from None
    if check and done.returncode != 0:
        raise StackError(f"git {' '.join(args)} (in {cwd}) failed: {done.stderr.decode(errors='replace').strip()}")
    return done


def blob_id(text: bytes) -> str:
    """The git blob id of text, as git hash-object gives it."""
    return hashlib.sha1(b"blob %d\0" % len(text) + text).hexdigest()


def full_commit(commit: str, root: Path = ROOT) -> str | None:
    """COMMIT as 40 hex digits, or None where this repository does not hold it."""
    found = git(["rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"], root, check=False)
    return found.stdout.decode().strip() if found.returncode == 0 else None


def committed_core(text: bytes, root: Path = ROOT) -> bool | None:
    """Whether a train_gpt.py of this repository's history (any branch) is text; None without a git history."""
    if full_commit("HEAD", root) is None:
        return None
    found = git(["log", "--all", "--format=%H", f"--find-object={blob_id(text)}", "--", CORE], root, check=False)
    return found.returncode == 0 and bool(found.stdout.strip())


# ---- THE STACK: its manifest and diffs ----

@dataclass
class Tree:
    """The core and the stack as they are in the working tree (commit None), or as they were at a commit."""
    root: Path = ROOT
    commit: str | None = None

    def read(self, path: str) -> bytes:
        if self.commit is None:
            file = self.root / path
            if not file.is_file():
                raise StackError(f"{file}: missing; the stack is train_gpt.py, {MANIFEST} and one diff per "
                                 f"technique (stack/README.md)")
            return file.read_bytes()
        shown = git(["show", f"{self.commit}:{path}"], self.root, check=False)
        if shown.returncode != 0:
            raise StackError(f"commit {self.commit[:12]} has no {path}: it predates the stack, or names "
                             f"another one; build from a commit that holds {MANIFEST}")
        return shown.stdout

    def label_commit(self) -> tuple[str, bool]:
        """(the core's commit, whether train_gpt.py or stack/ differ from it) for the BUILD line."""
        if self.commit is not None:
            return full_commit(self.commit, self.root) or self.commit, False
        head = full_commit("HEAD", self.root)
        if head is None:
            return "unknown", True
        status = git(["status", "--porcelain", "--untracked-files=all", "--", CORE, STACK], self.root)
        return head, bool(status.stdout.strip())


@dataclass
class Manifest:
    """stack/manifest.json: the core the diffs were made against, the techniques in order, the named stacks."""
    base: str  # the git blob id of the train_gpt.py the first diff applies to (what --rebase merges from)
    techniques: list
    stacks: dict


def load_manifest(tree: Tree) -> Manifest:
    try:
        data = json.loads(tree.read(MANIFEST))
    except json.JSONDecodeError as e:
        raise StackError(f"{MANIFEST}: not JSON ({e}); stack/README.md shows its form") from None
    if not isinstance(data, dict) or set(data) != {"base", "techniques", "stacks"}:
        keys = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise StackError(f"{MANIFEST}: holds {keys}; it holds exactly base, techniques and stacks")
    base, names, stacks = data["base"], data["techniques"], data["stacks"]
    if not isinstance(base, str) or not BLOB.fullmatch(base):
        raise StackError(f"{MANIFEST}: base={base!r} is not a git blob id (40 hex digits): "
                         f"python tools/build_trainer.py --rebase records it")
    if not isinstance(names, list) or not all(isinstance(n, str) and NAME.fullmatch(n) for n in names):
        raise StackError(f"{MANIFEST}: techniques={names!r}: a list of names in lower case and '-'")
    if len(set(names)) != len(names) or not names:
        raise StackError(f"{MANIFEST}: techniques={names}: each technique once, at least one")
    if not isinstance(stacks, dict) or stacks.get(FRONTIER) != names:
        raise StackError(f"{MANIFEST}: stacks[{FRONTIER!r}] must be every technique in order: {names}")
    for stack, listed in stacks.items():
        in_order = [n for n in names if n in listed]
        if stack == CUSTOM or not NAME.fullmatch(stack):
            raise StackError(f"{MANIFEST}: stack name {stack!r}: use lower case and '-', and not {CUSTOM!r} "
                             f"(the name of a --techniques build)")
        if not isinstance(listed, list) or listed != in_order or not listed:
            raise StackError(f"{MANIFEST}: stacks[{stack!r}]={listed!r}: list techniques of {names}, "
                             f"in that order")
    return Manifest(base, names, stacks)


def diff_path(name: str) -> str:
    return f"{STACK}/{name}.diff"


def read_diff(tree: Tree, name: str) -> bytes:
    """stack/NAME.diff: a header, then a diff of train_gpt.py and of nothing else."""
    diff = tree.read(diff_path(name))
    touched = re.findall(rb"^diff --git a/(\S+) b/(\S+)$", diff, re.M)
    if not touched:
        raise StackError(f"{diff_path(name)}: no 'diff --git a/{CORE} b/{CORE}' line: not a diff")
    others = sorted({b.decode() for pair in touched for b in pair} - {CORE})
    if others or len(touched) > 1:
        raise StackError(f"{diff_path(name)} changes {others or 'train_gpt.py twice'}: a technique diff changes "
                         f"train_gpt.py and nothing else; its tests go in tests/stack/test_<name>.py")
    return diff


def header(diff: bytes) -> str:
    """The text before the diff: what the technique computes, its settings, evidence and cost."""
    return diff[:diff.index(b"diff --git ")].decode()


# ---- BUILDING ----

def apply(text: bytes, diff: bytes, name: str, onto: str) -> bytes:
    """text with stack/NAME.diff applied (git apply: exact context, offsets allowed), or a refusal naming the hunk.
    onto: what text is, for the message."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / CORE).write_bytes(text)
        (Path(tmp) / "technique.diff").write_bytes(diff)
        done = git(["apply", "--verbose", "technique.diff"], tmp, check=False, alone=True)
        if done.returncode != 0:
            raise StackError(refusal(name, diff, onto, done.stderr.decode(errors="replace")))
        return (Path(tmp) / CORE).read_bytes()


def refusal(name: str, diff: bytes, onto: str, said: str) -> str:
    """What failed: the diff, its hunk's @@ line and first lines, git's words, and the fix."""
    lines = [f"{diff_path(name)} does not apply to {onto}"]
    failed = re.search(r"patch failed: \S+:(\d+)", said)
    hunks = re.split(rb"^(?=@@ )", diff[diff.index(b"diff --git "):], flags=re.M)[1:]
    for hunk in hunks:
        if failed and re.match(rb"@@ -%s(,\d+)? " % failed.group(1).encode(), hunk):
            shown = hunk.decode(errors="replace").splitlines()[:5]
            lines.append("its hunk that failed:\n    " + "\n    ".join(shown))
            break
    if len(lines) == 1:
        lines.append("git apply said:\n    " + "\n    ".join(said.strip().splitlines()[-6:]))
    lines.append(f"Fix: {REBASE_HINT}; nothing was written.")
    return "\n".join(lines)


def chain_name(core: str, names: list) -> str:
    """'the new core + a + b': a step of a chain, for the conflict markers."""
    return " + ".join([core, *names])


def onto_text(names: list) -> str:
    return f"train_gpt.py with {', '.join(names)} on it" if names else "the core train_gpt.py"


def chain(core: bytes, tree: Tree, names: list) -> list:
    """[the core, with the first technique, with the first two, ...]: each step is the step before with its diff."""
    steps = [core]
    for i, name in enumerate(names):
        steps.append(apply(steps[-1], read_diff(tree, name), name, onto_text(names[:i])))
    return steps


def choose(manifest: Manifest, stack: str | None, techniques: list | None) -> tuple[str, list]:
    """(the stack's name, its techniques in manifest order) for --stack or --techniques."""
    if techniques is not None:
        unknown = [t for t in techniques if t not in manifest.techniques]
        if unknown or not techniques:
            what = f"no technique {', '.join(unknown)}" if unknown else "none named"
            raise StackError(f"--techniques {','.join(techniques)}: {what}; the stack's techniques are "
                             f"{', '.join(manifest.techniques)} ({MANIFEST})")
        return CUSTOM, [t for t in manifest.techniques if t in techniques]
    if stack not in manifest.stacks:
        raise StackError(f"--stack {stack}: not a stack of {MANIFEST}; its stacks are {', '.join(manifest.stacks)}")
    return stack, manifest.stacks[stack]


def label(stack: str, names: list, commit: str, uncommitted: bool) -> str:
    """What the built file's BUILD line says, and its log's `build:` line."""
    return f"stack:{stack} techniques:{','.join(names)} core:{commit}" + ("+uncommitted" if uncommitted else "")


def labelled(text: bytes, build: str) -> bytes:
    """text with its BUILD line naming the build."""
    found = CORE_BUILD.findall(text)
    if len(found) != 1:
        raise StackError(f"{CORE}: {len(found)} lines start 'BUILD = \"core\"'; the builder names the build on "
                         f"that one line (its log's build: line): put it back as the core has it")
    return CORE_BUILD.sub(f'BUILD = "{build}"'.encode(), text, count=1)


def build(tree: Tree, stack: str | None = FRONTIER, techniques: list | None = None) -> bytes:
    """The built train_gpt.py: the core with the stack's diffs, its BUILD line naming them."""
    name, names = choose(load_manifest(tree), stack, techniques)
    built = chain(tree.read(CORE), tree, names)[-1]
    return labelled(built, label(name, names, *tree.label_commit()))


def parse_label(text: str) -> dict | None:
    """A build's label (BUILD, the log's `build:`) as stack, techniques, commit and uncommitted; None if it is
    no build's (the core's is `core`)."""
    m = LABEL.fullmatch(text)
    if m is None:
        return None
    return dict(stack=m["stack"], techniques=m["techniques"].split(","), commit=m["commit"],
                uncommitted=bool(m["uncommitted"]))


def rebuild_args(text: str) -> list:
    """The builder's arguments that rebuild a build's label from its commit."""
    found = parse_label(text)
    chosen = ["--stack", found["stack"]]
    if found["stack"] == CUSTOM:
        chosen = ["--techniques", ",".join(found["techniques"])]
    return [*chosen, "--at", found["commit"]]


def rebuild(text: str, root: Path = ROOT) -> bytes:
    """What the builder makes of a committed build's label (the commit must be in root's repository)."""
    found = parse_label(text)
    tree = Tree(root, full_commit(found["commit"], root))
    if found["stack"] == CUSTOM:
        return build(tree, None, found["techniques"])
    return build(tree, found["stack"])


def write_build(out: Path, text: bytes, root: Path = ROOT) -> None:
    """Write the build to out, whole or not at all; out may be a previous build, never the core or another file."""
    if out.resolve() == (root / CORE).resolve():
        raise StackError(f"--out {out} is the repository's core train_gpt.py, which the builder never replaces; "
                         f"write the build elsewhere, e.g. --out build/train_gpt.py")
    if (root / "records").resolve() in out.resolve().parents:
        raise StackError(f"--out {out} is in records/, whose files are what ran; write the build elsewhere, e.g. "
                         f"--out build/train_gpt.py, and let tools/make_record.py copy what the runs logged")
    if out.is_dir() or (out.exists() and not BUILT.search(out.read_bytes())):
        raise StackError(f"--out {out} exists and is not a build (no line BUILD = \"stack:...\"); the builder "
                         f"replaces only its own builds: remove it yourself or choose another path")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        partial.write_bytes(text)
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)


# ---- COST AND SETTINGS ----

def code_tokens(text: bytes) -> int:
    """Python tokens other than comments and layout (NL, NEWLINE, INDENT, DEDENT, ENDMARKER)."""
    try:
        return sum(t.type not in NOT_CODE for t in tokenize.tokenize(io.BytesIO(text).readline))
    except (tokenize.TokenError, SyntaxError) as e:
        raise StackError(f"a step of the stack is not Python that tokenizes ({e}); fix the diff or the merge that "
                         f"made it") from None


def lines(text: bytes) -> int:
    return text.count(b"\n")


def cost(before: bytes, after: bytes) -> tuple[int, int]:
    """(lines, code tokens) that after adds to before."""
    return lines(after) - lines(before), code_tokens(after) - code_tokens(before)


def cost_line(before: bytes, after: bytes) -> str:
    """The header's Cost line, which --rebase rewrites."""
    added_lines, added_tokens = cost(before, after)
    return (f"Cost: {added_lines:+,} lines, {added_tokens:+,} code tokens over train_gpt.py as the diffs before "
            f"it leave it")


def settings_rows(text: bytes) -> list:
    """(NAME, default, meaning) of each setting of a trainer's source, by settings.py's reading of it."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import settings
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / CORE
        path.write_bytes(text)
        return settings.rows(trainer=path)


def added_settings(before: bytes, after: bytes) -> list:
    """The settings rows of after that before lacks."""
    known = {row[0] for row in settings_rows(before)}
    return [row for row in settings_rows(after) if row[0] not in known]


def stack_settings(tree: Tree, stack: str = FRONTIER) -> list:
    """(technique, NAME, default, meaning) of each setting the stack's techniques add, in the stack's order, as
    the built files' Hyperparameters lines give them."""
    names = choose(load_manifest(tree), stack, None)[1]
    steps = chain(tree.read(CORE), tree, names)
    return [(name, *row) for i, name in enumerate(names) for row in added_settings(steps[i], steps[i + 1])]


def describe(tree: Tree) -> str:
    """--list: the core, each technique in order with its cost and settings, and each named stack's build."""
    manifest = load_manifest(tree)
    core = tree.read(CORE)
    steps = chain(core, tree, manifest.techniques)
    shown = [f"core: {CORE}, {lines(core):,} lines, {code_tokens(core):,} code tokens"]
    if blob_id(core) != manifest.base:
        shown.append(f"  (the diffs were made against blob {manifest.base[:12]}; the core is now "
                     f"{blob_id(core)[:12]}: python tools/build_trainer.py --rebase remakes them and their costs)")
    for i, name in enumerate(manifest.techniques):
        added_lines, added_tokens = cost(steps[i], steps[i + 1])
        shown.append(f"{i + 1}. {name}: {added_lines:+,} lines, {added_tokens:+,} code tokens ({diff_path(name)})")
        shown += [f"     {setting}={default}  {meaning}" for setting, default, meaning in
                  added_settings(steps[i], steps[i + 1])]
    for stack, names in manifest.stacks.items():
        try:
            built = chain(core, tree, names)[-1]
        except StackError as e:
            shown.append(f"stack {stack} ({', '.join(names)}): does not build: {str(e).splitlines()[0]}")
            continue
        added_lines, added_tokens = cost(core, built)
        shown.append(f"stack {stack} ({', '.join(names)}): {lines(built):,} lines, {code_tokens(built):,} code "
                     f"tokens ({added_lines:+,}, {added_tokens:+,} over the core)")
    return "\n".join(shown)


# ---- REBASE: the diffs remade on a changed core ----

def make_diff(before: bytes, after: bytes) -> bytes:
    """A diff of train_gpt.py from before to after, as git writes it (full blob ids, 3 lines of context)."""
    with tempfile.TemporaryDirectory() as tmp:
        for side, text in (("a", before), ("b", after)):
            (Path(tmp) / side).mkdir()
            (Path(tmp) / side / CORE).write_bytes(text)
        args = ["diff", "--no-index", "--no-prefix", "--full-index", "--no-color", "--no-ext-diff", "--no-renames",
                "--diff-algorithm=myers", f"a/{CORE}", f"b/{CORE}"]
        done = git(args, tmp, check=False, alone=True)
        if done.returncode not in (0, 1):  # 1: they differ
            raise StackError(f"git diff --no-index failed: {done.stderr.decode(errors='replace').strip()}")
        return done.stdout


def merge(current: bytes, base: bytes, other: bytes, names: tuple) -> tuple[bytes, int]:
    """git merge-file: (the merge, its number of conflicts); names label the three sides in the markers."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for side, text in zip(("current", "base", "other"), (current, base, other)):
            paths.append(str(Path(tmp) / side))
            Path(paths[-1]).write_bytes(text)
        labels = [arg for name in names for arg in ("-L", name)]
        done = git(["merge-file", "-p", "--diff3", *labels, *paths], tmp, check=False, alone=True)
        if done.returncode > 127:  # the conflicts, counted up to 127; above: an error
            raise StackError(f"git merge-file failed: {done.stderr.decode(errors='replace').strip()}")
        return done.stdout, done.returncode


def old_core(manifest: Manifest, root: Path) -> bytes:
    found = git(["cat-file", "blob", manifest.base], root, check=False)
    if found.returncode != 0:
        raise StackError(f"{MANIFEST}: base {manifest.base} is not in this repository's objects; fetch its whole "
                         f"history (git fetch --unshallow), or rebase by hand from the commit that made the diffs")
    return found.stdout


def rebase(root: Path = ROOT, resolved: dict | None = None, conflicts: Path | None = None) -> str:
    """Remake every diff on the core as it is now: the old chain rebuilt from the manifest's base, each step merged
    onto the new chain (git merge-file), the diffs and their Cost lines rewritten and the new base recorded; or
    stop at the first diff that needs hands, its merge with conflict markers in a file the message names, nothing
    in stack/ changed. resolved: {technique: a file that is the new core with it and the ones before it};
    conflicts: the folder for that file (default: a new one in the system's temporary folder)."""
    resolved = resolved or {}
    tree = Tree(root)
    manifest = load_manifest(tree)
    unknown = sorted(set(resolved) - set(manifest.techniques))
    if unknown:
        raise StackError(f"--resolved {unknown}: not techniques of {MANIFEST}: {', '.join(manifest.techniques)}")
    names = manifest.techniques
    try:
        old = chain(old_core(manifest, root), tree, names)
    except StackError as e:
        raise StackError(f"the stack does not apply to its own base (blob {manifest.base[:12]}), so a diff was "
                         f"edited by hand: make it a diff of the base again\n{e}") from None
    core = tree.read(CORE)
    new = [core]
    for i, name in enumerate(names):
        if name in resolved:
            new.append(resolved_step(name, Path(resolved[name])))
            continue
        sides = (chain_name("the new core", names[:i]), chain_name("the old core", names[:i]),
                 chain_name("the old core", names[:i + 1]))
        merged, count = merge(new[-1], old[i], old[i + 1], sides)
        if count:
            raise StackError(conflict_message(name, merged, count, names[:i], conflicts))
        new.append(merged)
    diffs = {}
    for i, name in enumerate(names):
        diff = make_diff(new[i], new[i + 1])
        if not diff:
            raise StackError(f"{diff_path(name)} changes nothing on the new core, which holds it now: remove it "
                             f"from {MANIFEST} and stack/; nothing in stack/ changed")
        old_header = header(read_diff(tree, name))
        if not COST_LINE.search(old_header):
            old_header = old_header.rstrip("\n") + "\nCost: \n\n"
        diffs[name] = COST_LINE.sub(cost_line(new[i], new[i + 1]), old_header, count=1).encode() + diff
    return write_stack(root, manifest, diffs, core, new)


def resolved_step(name: str, path: Path) -> bytes:
    if not path.is_file():
        raise StackError(f"--resolved {name}={path}: no such file")
    text = path.read_bytes()
    if CONFLICT_MARKER.search(text):
        raise StackError(f"--resolved {name}={path}: conflict markers remain (<<<<<<<, |||||||, =======, >>>>>>>); "
                         f"resolve each, then rebase again")
    return text


def conflict_message(name: str, merged: bytes, conflicts: int, before: list, folder: Path | None) -> str:
    folder = folder or Path(tempfile.mkdtemp(prefix="rebase-"))
    path = folder / f"train_gpt.{name}.py"
    path.write_bytes(merged)
    return (f"{diff_path(name)} needs hands: merged onto the new core it has {conflicts} conflict(s), marked in "
            f"{path} (<<<<<<< the new core's side, ||||||| the old core's, >>>>>>> {name}'s). Nothing in stack/ "
            f"changed.\nFix: edit that file until it is the new core with {', '.join(before + [name])} on it and "
            f"no markers remain, then run\n    python tools/build_trainer.py --rebase --resolved {name}={path}")


def write_stack(root: Path, manifest: Manifest, diffs: dict, core: bytes, new: list) -> str:
    """Check the new diffs rebuild the merged chain, then write them and the manifest's new base."""
    steps = [core]
    for name in manifest.techniques:
        steps.append(apply(steps[-1], diffs[name], name, "the new chain"))
    if steps != new:
        raise StackError("the remade diffs do not rebuild the merged files; nothing in stack/ changed (a bug: "
                         "report it with the two cores)")
    git(["hash-object", "-w", CORE], root)  # the new base stays in the object store until committed
    data = dict(base=blob_id(core), techniques=manifest.techniques, stacks=manifest.stacks)
    changed = []
    files = {diff_path(name): diffs[name] for name in manifest.techniques}
    files[MANIFEST] = (json.dumps(data, indent=2) + "\n").encode()
    for path, text in files.items():
        if (root / path).read_bytes() != text:
            changed.append(path)
            partial = root / f"{path}.tmp"
            partial.write_bytes(text)
            os.replace(partial, root / path)
    return f"rebased {len(diffs)} techniques onto blob {blob_id(core)[:12]}; changed: {', '.join(changed) or 'nothing'}"


# ---- ADDING A TECHNIQUE ----

HEADER_SKELETON = """{name}: <what it is, in a line>

Computes: <what it computes, and where>

Settings: {settings}

Evidence: <the field's PR, seeds and p; what was measured here, with its command>

Tests: tests/stack/test_{module}.py
{cost}

"""


def add(root: Path, name: str, path: Path) -> str:
    """stack/NAME.diff from path (the frontier build with the technique on it), with a header to fill in; the
    technique joins the manifest's end and the frontier."""
    tree = Tree(root)
    manifest = load_manifest(tree)
    if not NAME.fullmatch(name) or name == CUSTOM or name in manifest.techniques:
        raise StackError(f"--add {name}: name it in lower case and '-', not {CUSTOM!r} nor a technique of "
                         f"{MANIFEST} ({', '.join(manifest.techniques)})")
    if not path.is_file():
        raise StackError(f"--add {name} {path}: no such file; build the frontier (--out), add the technique to it")
    frontier = chain(tree.read(CORE), tree, manifest.techniques)[-1]
    # the build's BUILD line back to the core's: the diffs apply before the builder names the build
    after = re.sub(rb'^BUILD = .*$', lambda m: CORE_BUILD.search(frontier).group(0), path.read_bytes(), count=1,
                   flags=re.M)
    diff = make_diff(frontier, after)
    if not diff:
        raise StackError(f"--add {name} {path}: the file is the frontier as it is; add the technique to it first")
    settings = ", ".join(f"{setting}={default}" for setting, default, _ in added_settings(frontier, after))
    text = HEADER_SKELETON.format(name=name, settings=settings or "<each setting and its default>",
                                  module=name.replace("-", "_"), cost=cost_line(frontier, after))
    (root / diff_path(name)).write_bytes(text.encode() + diff)
    stacks = {**manifest.stacks, FRONTIER: [*manifest.techniques, name]}
    data = dict(base=manifest.base, techniques=[*manifest.techniques, name], stacks=stacks)
    (root / MANIFEST).write_text(json.dumps(data, indent=2) + "\n")
    return (f"wrote {diff_path(name)} and added {name} to {MANIFEST}; fill in its header's <...>, write "
            f"tests/stack/test_{name.replace('-', '_')}.py, then: python tools/settings_table.py --stack frontier "
            f"--write docs/STACK.md")


# ---- COMMAND LINE ----

def main(argv=None, root: Path = ROOT) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stack", help=f"a stack of {MANIFEST} (default: {FRONTIER}, every technique)")
    parser.add_argument("--techniques", help="a comma-separated subset instead, built in the manifest's order")
    parser.add_argument("--out", type=Path, help="where the built train_gpt.py goes (a new file or a build)")
    parser.add_argument("--at", metavar="COMMIT", help="build from the core and stack/ of this commit")
    parser.add_argument("--list", action="store_true", help="each technique, its settings and cost; each stack")
    parser.add_argument("--rebase", action="store_true", help="remake the diffs on the core as it is now")
    parser.add_argument("--resolved", action="append", default=[], metavar="NAME=FILE",
                        help="with --rebase: the file its conflicts were resolved in")
    parser.add_argument("--add", nargs=2, metavar=("NAME", "FILE"),
                        help="a new technique: FILE is the frontier build with it on")
    args = parser.parse_args(argv)
    try:
        print(run(args, root))
    except StackError as e:
        print(f"build_trainer.py: error: {e}", file=sys.stderr)
        return 1
    return 0


def run(args, root: Path) -> str:
    """What the command line asked for, in the repository at root; returns what to print."""
    tree = Tree(root)
    if args.at:
        commit = full_commit(args.at, root)
        if commit is None:
            raise StackError(f"--at {args.at}: no such commit in {root}; fetch it, or name one of git log's")
        tree = Tree(root, commit)
    if args.rebase:
        pairs = [item.split("=", 1) for item in args.resolved]
        if any(len(pair) != 2 for pair in pairs) or args.at:
            raise StackError("--rebase [--resolved NAME=FILE ...] works on the working tree; no --at")
        return rebase(root, dict(pairs))
    if args.list:
        return describe(tree)
    if args.add:
        return add(root, args.add[0], Path(args.add[1]))
    if args.out is None:
        raise StackError("name the file to write: --out build/train_gpt.py (or --list, or --rebase)")
    if args.stack and args.techniques:
        raise StackError("--stack or --techniques, not both")
    techniques = args.techniques.split(",") if args.techniques else None
    text = build(tree, args.stack or FRONTIER, techniques)
    write_build(args.out, text, root)
    return f"wrote {args.out}: build {build_label(text)}"


def build_label(text: bytes) -> str | None:
    """What a train_gpt.py's BUILD line says: core, or a build's label."""
    found = re.search(rb'^BUILD = "([^"]*)"', text, re.M)
    return found.group(1).decode() if found else None


if __name__ == "__main__":
    sys.exit(main())

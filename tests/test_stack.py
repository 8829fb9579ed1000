"""The technique stack (stack/) and its builder, tools/build_trainer.py: the frontier builds and imports, naming its
build; each diff changes train_gpt.py alone and states its cost; a stack that does not apply is refused, naming
the diff and the hunk, with nothing written; --at builds what a commit held; --rebase merges a core change beside a
hunk and stops at the first diff that conflicts; with every technique off the frontier computes bitwise what the
core computes; and the records tools check that a record's trainer is a committed core or the build it names.
Each technique's own tests are in tests/stack/."""

import json
import re
import shutil
import sys

import pytest

import settings
from conftest import EVERY_LEVER, ROOT, as_env
from stack.conftest import build_into, built_env, import_trainer, launch

sys.path.insert(0, str(ROOT / "tools"))
import build_trainer as bt  # noqa: E402
import check_record  # noqa: E402
import runlog  # noqa: E402
import settings_table  # noqa: E402

MANIFEST = bt.load_manifest(bt.Tree())
NAMES = MANIFEST.techniques


@pytest.fixture(scope="module")
def frontier_script(tmp_path_factory):
    return build_into(tmp_path_factory.mktemp("frontier"), stack="frontier")


def head() -> str:
    return bt.full_commit("HEAD")


def stack_repo(tmp_path):
    """A repository of one commit: the core the diffs were made against (the manifest's base) and stack/."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "stack", repo / "stack")
    (repo / "train_gpt.py").write_bytes(bt.git(["cat-file", "blob", MANIFEST.base], ROOT).stdout)
    bt.git(["init", "-q"], repo)
    bt.git(["add", "-A"], repo)
    who = ["-c", "user.name=tests", "-c", "user.email=tests@example.invalid", "-c", "commit.gpgsign=false"]
    bt.git([*who, "commit", "-q", "-m", "the base"], repo)
    return repo


def cli(argv, root, capsys) -> tuple[int, str, str]:
    code = bt.main([str(a) for a in argv], root=root)
    out = capsys.readouterr()
    return code, out.out, out.err


def without_build_line(text: bytes) -> bytes:
    return re.sub(rb'^BUILD = .*$', b"", text, count=1, flags=re.M)


def hunks(diff: bytes) -> list:
    """The hunks of a diff: each its lines, the @@ line first."""
    found = re.split(rb"^(?=@@ )", diff[diff.index(b"diff --git"):], flags=re.M)[1:]
    return [hunk.decode().splitlines() for hunk in found]


# ---- building ----


def test_the_frontier_builds_imports_and_names_its_build(frontier_script):
    fr = import_trainer(frontier_script, "train_gpt_frontier_imported")
    found = bt.parse_label(fr.BUILD)
    assert found and found["stack"] == "frontier" and found["techniques"] == NAMES
    status = bt.git(["status", "--porcelain", "--", "train_gpt.py", "stack"], ROOT).stdout
    assert (found["commit"], found["uncommitted"]) == (head(), bool(status.strip()))
    core = {row[0] for row in settings.rows()}
    built = {row[0] for row in settings.rows(trainer=frontier_script)}
    assert core < built, "the build keeps every setting of the core and adds the stack's"
    assert set(settings.setting_names(fr.Hyperparameters)) == built


def test_each_diff_changes_train_gpt_py_alone_and_its_header_states_what_it_adds():
    core = bt.Tree().read("train_gpt.py")
    steps = bt.chain(core, bt.Tree(), NAMES)
    first_index = re.search(rb"^index ([0-9a-f]{40})\.\.", bt.read_diff(bt.Tree(), NAMES[0]), re.M)
    assert first_index, "a diff names its blobs in full (git diff --full-index; --add and --rebase write so)"
    assert first_index.group(1).decode() == MANIFEST.base, "the manifest's base is what the first diff applies to"
    for i, name in enumerate(NAMES):
        header = bt.header(bt.read_diff(bt.Tree(), name))
        assert header.startswith(f"{name}: "), f"stack/{name}.diff opens with its name and what it is"
        for part in ("Computes: ", "Settings: ", "Evidence: ", "Tests: ", "Cost: "):
            assert re.search(rf"^{part}", header, re.M), f"stack/{name}.diff's header has no {part!r}"
        assert bt.cost_line(steps[i], steps[i + 1]) in header, f"stack/{name}.diff's Cost line is stale: --rebase"
        added = bt.added_settings(steps[i], steps[i + 1])
        assert added, f"{name} adds no setting: a technique is off by default behind one"
        settings_part = header.split("Settings", 1)[1].split("\n\n", 1)[0]
        assert all(setting in settings_part for setting, _, _ in added), f"{name}'s header names each setting"
        assert "<" not in header.split("\n", 1)[0] and not re.search(r"^\w+: <", header, re.M), "--add's <...>"
        tests = ROOT / "tests" / "stack" / f"test_{name.replace('-', '_')}.py"
        assert tests.is_file() and f"tests/stack/{tests.name}" in header, f"{name}'s tests: {tests}"


def test_list_shows_each_technique_its_settings_and_cost(capsys):
    code, out, err = cli(["--list"], ROOT, capsys)
    assert code == 0, err
    core = bt.Tree().read("train_gpt.py")
    steps = bt.chain(core, bt.Tree(), NAMES)
    for i, name in enumerate(NAMES):
        lines, tokens = bt.cost(steps[i], steps[i + 1])
        assert f"{i + 1}. {name}: {lines:+,} lines, {tokens:+,} code tokens" in out
        for setting, default, _ in bt.added_settings(steps[i], steps[i + 1]):
            assert f"     {setting}={default}  " in out
    total = f"stack frontier ({', '.join(NAMES)}): {bt.lines(steps[-1]):,} lines, {bt.code_tokens(steps[-1]):,} code"
    assert total in out


def test_a_listed_subset_builds_in_the_manifests_order(tmp_path, capsys, frontier_script):
    out = tmp_path / "build" / "train_gpt.py"
    code, said, err = cli(["--techniques", ",".join(reversed(NAMES)), "--out", out], ROOT, capsys)
    assert code == 0, err
    built = out.read_bytes()
    assert bt.parse_label(bt.build_label(built))["techniques"] == NAMES
    assert bt.build_label(built).startswith(f"stack:custom techniques:{','.join(NAMES)} core:")
    assert without_build_line(built) == without_build_line(frontier_script.read_bytes())
    for k in range(1, len(NAMES)):  # every prefix builds: the chain is made of them
        assert bt.parse_label(bt.build_label(bt.build(bt.Tree(), None, NAMES[:k])))["techniques"] == NAMES[:k]
    for name in NAMES:  # each alone builds where its diff allows, or is refused for a hunk
        try:
            assert bt.parse_label(bt.build_label(bt.build(bt.Tree(), None, [name])))["techniques"] == [name]
        except bt.StackError as e:
            assert "does not apply" in str(e) and "its hunk that failed:" in str(e)
    code, _, err = cli(["--techniques", "no-such", "--out", out], ROOT, capsys)
    assert code == 1 and "--techniques no-such: no technique no-such; the stack's techniques are" in err


def test_a_stack_that_does_not_apply_is_refused_naming_the_diff_and_hunk_and_writes_nothing(tmp_path, capsys):
    """The core changed under a later diff: a context line of one of its hunks, which no earlier diff touches."""
    root = tmp_path / "tree"
    shutil.copytree(ROOT / "stack", root / "stack")
    core = (ROOT / "train_gpt.py").read_text()

    def untouched_hunk(i):
        earlier = b"".join(bt.read_diff(bt.Tree(), name) for name in NAMES[:i]).decode()
        return next((h for h in hunks(bt.read_diff(bt.Tree(), NAMES[i])) if h[1].startswith(" ")
                     and h[1][1:] not in earlier and core.count(h[1][1:] + "\n") == 1), None)
    i = next(i for i in reversed(range(1, len(NAMES))) if untouched_hunk(i))
    hunk = untouched_hunk(i)
    context = hunk[1][1:]
    (root / "train_gpt.py").write_text(core.replace(context + "\n", context + "  # changed\n", 1))
    out = tmp_path / "build" / "train_gpt.py"
    code, said, err = cli(["--out", out], root, capsys)
    assert code == 1 and said == ""
    assert f"stack/{NAMES[i]}.diff does not apply to train_gpt.py with {', '.join(NAMES[:i])} on it" in err
    assert hunk[0] in err and context in err, "the hunk: its @@ line and its first lines"
    assert "python tools/build_trainer.py --rebase" in err
    assert not out.parent.exists(), "nothing written"
    earlier_build = bt.build(bt.Tree(), None, NAMES[:1])
    out.parent.mkdir()
    out.write_bytes(earlier_build)
    assert cli(["--out", out], root, capsys)[0] == 1
    assert out.read_bytes() == earlier_build and list(out.parent.iterdir()) == [out], "no partial file beside it"


def test_out_never_replaces_the_core_nor_a_file_that_is_not_a_build(tmp_path, capsys):
    root = tmp_path / "tree"
    shutil.copytree(ROOT / "stack", root / "stack")
    core = (ROOT / "train_gpt.py").read_bytes()
    (root / "train_gpt.py").write_bytes(core)
    code, _, err = cli(["--out", root / "train_gpt.py"], root, capsys)
    assert code == 1 and "is the repository's core train_gpt.py, which the builder never replaces" in err
    assert (root / "train_gpt.py").read_bytes() == core
    record = root / "records" / "track_cpu" / "2026-01-01_Built" / "train_gpt.py"
    code, _, err = cli(["--out", record], root, capsys)
    assert code == 1 and "is in records/, whose files are what ran" in err and not record.parent.exists()
    notes = tmp_path / "notes.py"
    notes.write_text("print('mine')\n")
    code, _, err = cli(["--out", notes], root, capsys)
    assert code == 1 and "exists and is not a build" in err and notes.read_text() == "print('mine')\n"
    previous = tmp_path / "previous.py"
    previous.write_bytes(bt.build(bt.Tree(root), None, NAMES[:1]))
    code, said, err = cli(["--out", previous], root, capsys)
    assert code == 0 and "build stack:frontier" in said, err
    assert bt.parse_label(bt.build_label(previous.read_bytes()))["techniques"] == NAMES, "a build is replaced"


def test_at_a_commit_builds_its_core_and_stack(tmp_path, capsys):
    repo = stack_repo(tmp_path)
    first = bt.full_commit("HEAD", repo)
    built = bt.build(bt.Tree(repo))
    assert bt.build_label(built) == f"stack:frontier techniques:{','.join(NAMES)} core:{first}"
    broken = repo / "stack" / f"{NAMES[0]}.diff"
    broken.write_bytes(broken.read_bytes().replace(b"\n+", b"\n-", 1))
    with pytest.raises(bt.StackError, match=f"stack/{NAMES[0]}.diff does not apply"):
        bt.build(bt.Tree(repo))
    out = tmp_path / "at.py"
    code, _, err = cli(["--at", first[:10], "--out", out], repo, capsys)
    assert code == 0 and out.read_bytes() == built, err
    broken.write_bytes((ROOT / "stack" / f"{NAMES[0]}.diff").read_bytes() + b"\n")
    assert bt.build_label(bt.build(bt.Tree(repo))).endswith(f"core:{first}+uncommitted")
    code, _, err = cli(["--at", "f" * 40, "--out", out], repo, capsys)
    assert code == 1 and f"--at {'f' * 40}: no such commit" in err


def test_add_makes_a_new_technique_from_a_frontier_build(tmp_path, capsys):
    repo = stack_repo(tmp_path)
    out = tmp_path / "build" / "train_gpt.py"
    assert cli(["--out", out], repo, capsys)[0] == 0
    text = out.read_text()
    setting = "    optimize_ddp: bool = True"
    out.write_text(text.replace(setting, "    tiny_trick_enabled: bool = False  # a trick, off\n" + setting, 1))
    code, said, err = cli(["--add", "tiny-trick", out], repo, capsys)
    assert code == 0 and "tests/stack/test_tiny_trick.py" in said, err
    manifest = bt.load_manifest(bt.Tree(repo))
    assert manifest.techniques == manifest.stacks["frontier"] == [*NAMES, "tiny-trick"]
    diff = bt.read_diff(bt.Tree(repo), "tiny-trick")
    header = bt.header(diff)
    assert header.startswith("tiny-trick: <") and "Settings: TINY_TRICK_ENABLED=False" in header
    assert "Cost: +1 lines, +5 code tokens over" in header and b"BUILD" not in diff[len(header):]
    assert "tiny_trick_enabled" in bt.build(bt.Tree(repo)).decode()
    code, _, err = cli(["--add", "tiny-trick", out], repo, capsys)
    assert code == 1 and "--add tiny-trick: name it" in err


# ---- rebase ----


def changed_line(text: str, line: str, new: str) -> str:
    assert text.count(line + "\n") == 1, line
    return text.replace(line + "\n", new + "\n")


def test_rebase_merges_a_change_beside_a_hunk(tmp_path):
    """A core change to a hunk's context: git apply refuses it, the three-way merge takes it; the new diffs build
    the old frontier with that line changed, their Cost lines hold, and the manifest records the new core."""
    repo = stack_repo(tmp_path)
    old_frontier = bt.build(bt.Tree(repo))
    context = next(line[1:] for line in hunks(bt.read_diff(bt.Tree(repo), NAMES[0]))[0][1:] if line[0] == " ")
    core = (repo / "train_gpt.py").read_text()
    (repo / "train_gpt.py").write_text(changed_line(core, context, context + "  # the core's new comment"))
    with pytest.raises(bt.StackError, match="does not apply"):
        bt.build(bt.Tree(repo))
    said = bt.rebase(repo)
    assert said.startswith(f"rebased {len(NAMES)} techniques") and "stack/manifest.json" in said
    new_frontier = bt.build(bt.Tree(repo))
    expected = changed_line(old_frontier.decode(), context, context + "  # the core's new comment")
    assert without_build_line(new_frontier) == without_build_line(expected.encode())
    manifest = bt.load_manifest(bt.Tree(repo))
    assert manifest.base == bt.blob_id((repo / "train_gpt.py").read_bytes())
    steps = bt.chain((repo / "train_gpt.py").read_bytes(), bt.Tree(repo), NAMES)
    for i, name in enumerate(NAMES):
        assert bt.cost_line(steps[i], steps[i + 1]) in bt.header(bt.read_diff(bt.Tree(repo), name))
    assert bt.rebase(repo).endswith("changed: nothing"), "a second rebase changes nothing"


def test_rebase_stops_at_the_first_diff_that_conflicts_and_changes_nothing(tmp_path):
    """The core changes a line the last diff removes: the diffs before it merge, it needs hands. Its merge, with
    markers, goes to the file the message names; resolved there, --resolved finishes the rebase."""
    repo = stack_repo(tmp_path)
    core = (repo / "train_gpt.py").read_text()
    # a line of the core's that the last diff removes (the lines it removes that earlier diffs added do not count)
    removed = next(line[1:] for hunk in hunks(bt.read_diff(bt.Tree(repo), NAMES[-1])) for line in hunk[1:]
                   if line.startswith("-") and line[1:].strip() and core.count(line[1:] + "\n") == 1)
    (repo / "train_gpt.py").write_text(changed_line(core, removed, removed + "  # and the core's change"))
    before = {path: path.read_bytes() for path in (repo / "stack").iterdir()}
    with pytest.raises(bt.StackError) as stopped:
        bt.rebase(repo, conflicts=tmp_path)
    message = str(stopped.value)
    assert message.startswith(f"stack/{NAMES[-1]}.diff needs hands"), message
    assert {path: path.read_bytes() for path in (repo / "stack").iterdir()} == before, "nothing in stack/ changed"
    merged = tmp_path / f"train_gpt.{NAMES[-1]}.py"
    assert str(merged) in message and f"--resolved {NAMES[-1]}={merged}" in message
    text = merged.read_text()
    assert "<<<<<<< " in text and "the core's change" in text
    # resolved: the technique's side of each conflict
    merged.write_text(re.sub(r"<<<<<<< .*?\n=======\n(.*?)>>>>>>> [^\n]*\n", r"\1", text, flags=re.S))
    assert "rebased" in bt.rebase(repo, {NAMES[-1]: merged})
    assert bt.build_label(bt.build(bt.Tree(repo))).startswith("stack:frontier")


# ---- the built frontier, every technique off, against the core ----

COMPARED = re.compile(r"^(step:\d+/\d+ (?:train_loss|val_loss):\S+(?: val_bpb:\S+)?|final_\w+ val_loss:\S+ "
                      r"val_bpb:\S+|artifact: \S+ bytes:\d+ sha256:\w+)", re.M)


def test_with_every_technique_off_the_frontier_computes_what_the_core_computes(frontier_script, short_val_data,
                                                                               tmp_path):
    """Two tiny CPU runs, the default and every lever (with a TTT group a document), each by the core and by the
    frontier, side by side: every loss line, every final line and the artifact's sha256 the same. Eight steps
    (the loop switch at the fourth) keep the four launches near half a minute on two cores."""
    steps = dict(ITERATIONS="8", WARMDOWN_ITERS="4", VAL_LOSS_EVERY="4")
    shapes = dict(default=steps, every_lever=dict(as_env(EVERY_LEVER, ttt_batch_size=1), **steps))
    procs = {}
    for shape, levers in shapes.items():
        for name, script in (("core", ROOT / "train_gpt.py"), ("frontier", frontier_script)):
            cwd = tmp_path / f"{shape}_{name}"
            cwd.mkdir()
            env = built_env(short_val_data, frontier_script, RUN_ID=shape, **levers)
            procs[shape, name] = launch(script, env, cwd)
    outs = {key: proc.communicate(timeout=300) for key, proc in procs.items()}
    for key, proc in procs.items():
        assert proc.returncode == 0, (key, outs[key][1][-3000:])
    for shape in shapes:
        core, frontier = outs[shape, "core"][0], outs[shape, "frontier"][0]
        assert "build: core" in core and f"build: stack:frontier techniques:{','.join(NAMES)}" in frontier
        compared = COMPARED.findall(core)
        assert len([line for line in compared if line.startswith("final_")]) >= 2 and "artifact: " in core
        assert compared == COMPARED.findall(frontier), shape
    assert "final_int6_brotli_ttt_exact" in outs["every_lever", "core"][0]


# ---- records of builds ----


def build_logs(tmp_path, source: bytes, build_line: str | None):
    """Three seeds' logs in the trainer's format (tests/test_records.py's), of source, with a build: line."""
    from test_records import seed_logs
    logs = seed_logs(tmp_path, source=source)
    if build_line is not None:
        for log in logs:
            text = log.read_bytes()
            text = re.sub(rb"^(command: .*\n)", lambda m: m.group(1) + f"build: {build_line}\n".encode(), text,
                          count=1, flags=re.M)
            log.write_bytes(text)
    return logs


def test_a_record_of_a_build_names_it_and_is_checked_against_its_commit(tmp_path):
    from test_records import make
    built = bt.build(bt.Tree(ROOT, head()))
    label = bt.build_label(built)
    folder = make(build_logs(tmp_path / "good", built, label), tmp_path / "good")
    sub = json.loads((folder / "submission.json").read_text())
    assert sub["build"] == label
    rebuild = f"python tools/build_trainer.py --stack frontier --at {head()} --out build/train_gpt.py"
    assert rebuild in (folder / "README.md").read_text()
    assert check_record.check_folder(folder) == []
    sub["build"] = "core"
    (folder / "submission.json").write_text(json.dumps(sub))
    assert check_record.check_folder(folder) == [f"submission.json: build='core' but the logs say {label}"]


@pytest.mark.parametrize("case", ["edited", "unknown commit", "uncommitted", "unnamed"])
def test_a_build_that_its_commit_does_not_rebuild_is_refused(tmp_path, case):
    from test_records import forge
    built = bt.build(bt.Tree(ROOT, head()))
    label = bt.build_label(built)
    source, expected = {
        "edited": (built + b"# edited\n", "is not what python tools/build_trainer.py --stack frontier --at"),
        "unknown commit": (built, "its core commit ffff"),
        "uncommitted": (built, "built from a train_gpt.py or stack/ that differed"),
        "unnamed": (built, "is neither core nor a stack's build"),
    }[case]
    label = {"unknown commit": label.replace(head(), "f" * 40), "uncommitted": label + "+uncommitted",
             "unnamed": "frontier"}.get(case, label)
    problems = check_record.check_folder(forge(build_logs(tmp_path, source, label), tmp_path))
    assert len(problems) == 1 and expected in problems[0], problems


def test_a_core_must_be_one_of_this_repositorys_history(tmp_path):
    """`build: core` from a train_gpt.py no commit holds is refused; a log from before the build: line is taken
    as a core, and its absence from the history is a note."""
    from test_records import FAKE_SOURCE, forge
    problems = check_record.check_folder(forge(build_logs(tmp_path / "a", FAKE_SOURCE, "core"), tmp_path / "a"))
    assert len(problems) == 1 and "build: core, but its train_gpt.py" in problems[0], problems
    notes = []
    folder = forge(build_logs(tmp_path / "b", FAKE_SOURCE, None), tmp_path / "b")
    assert check_record.check_folder(folder, notes=notes) == []
    assert any("logged before train_gpt.py named its build" in note for note in notes), notes


def test_the_repositorys_records_hold_cores_of_its_history():
    for folder in sorted((ROOT / "records").glob("*/*/")):
        for path in runlog.log_paths(folder):
            run = runlog.parse_log(path)
            if run.ours:
                notes = []
                assert check_record.provenance_problems(run, {}, notes) == [] and notes == [], path


def test_the_stack_settings_page_is_the_built_files_table():
    """DOCS CHECK: docs/STACK.md's table is what tools/settings_table.py --stack frontier makes (its --write
    mends it)."""
    page = (ROOT / "docs" / "STACK.md").read_text()
    assert settings_table.stack_table("frontier") in page, "python tools/settings_table.py --stack frontier " \
                                                           "--write docs/STACK.md"

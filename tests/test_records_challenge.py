"""tools/ on records/ in the challenge's format: the log lines train_gpt.py gained (final_eval_total, packed code size,
`error: rank` failures, progress lines), the evaluation-time rules per track, the track's spelling, authors
that come from the user and are never invented, requirements.txt, the README's sections, and compare.py
against a record folder written as the challenge's accepted folders are. Synthetic logs only: milliseconds."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_records import (FAKE_SOURCE, ROOT, TRACKS, edit_json, make, make_record, only_problem,  # noqa: E402
                          seed_logs, write_log)

import check_record  # noqa: E402  (tools/ is on sys.path through test_records)
import compare  # noqa: E402
import runlog  # noqa: E402
import summarize  # noqa: E402

CPU_OK = {"DATA_PATH": "./data/datasets/sotu_sp1024", "TOKENIZER_PATH": "./data/tokenizers/sotu_1024_bpe.model",
          "ITERATIONS": "300", "TRAIN_BATCH_TOKENS": "8192"}
CPU_RUN = dict(model_bytes=100_000, train_time_ms=590_000.0, device="cpu",
               hardware="cpu: AMD EPYC, 2 logical cores, 2 torch threads per process x 1 processes")


# ---- THE NEW LOG LINES ----

def test_parser_reads_final_eval_total_packed_code_and_ignores_progress(tmp_path):
    log = write_log(tmp_path / "a.txt", family="int6_brotli", sliding=(1.98, 1.1725, 60_000.0),
                    ttt=(1.95, 1.155, 300_000.0), eval_total=True, val_every=10_000)
    text = log.read_text()
    size = len(FAKE_SOURCE)
    log.write_text(text.replace(f"Code size: {size} bytes", f"Code size: 1234 bytes (packed from {size}: PACK_CODE=1)"))
    run = runlog.parse_log(log)
    assert run.eval_total == {"eval_time_ms": 361_500.0, "limit_ms": 600_000.0, "graphs_compiled_inside": 0,
                              "passes": {"roundtrip": 1500.0, "sliding_window": 60_000.0, "ttt": 300_000.0}}
    assert run.eval_total_ms == 361_500.0 and run.eval_time_ms == 300_000.0  # all of it; the scoring pass
    assert (run.code_bytes, run.code_packed_from) == (1234, size)
    assert run.score_name == "int6_brotli_ttt_exact" and run.finished and run.errors == []
    assert run.prequant_val_bpb == 1.2144 and run.quant_gap_bpb == pytest.approx(0.0)
    # without the total line (older logs) the passes are summed
    old = write_log(tmp_path / "old.txt", sliding=(1.98, 1.1725, 60_000.0))
    assert runlog.parse_log(old).eval_total_ms == 61_500.0


def test_parser_reads_the_artifact_line_with_its_export_time(tmp_path):
    log = write_log(tmp_path / "a.txt")
    text = log.read_text()
    line = next(l for l in text.splitlines() if l.startswith("artifact: "))
    log.write_text(text.replace(line, line + " export_time:239ms"))
    run = runlog.parse_log(log)
    assert run.artifact_path == "logs/a_model.ptz" and len(run.artifact_sha256) == 64


def test_a_failed_run_is_not_finished_make_refuses_it_and_summarize_shows_its_error(tmp_path):
    failed = write_log(tmp_path / "logs" / "oom.txt", error="torch.OutOfMemoryError: CUDA out of memory. Tried 2 GiB")
    run = runlog.parse_log(failed)
    assert not run.finished and run.error.startswith("rank 0: Traceback")
    assert run.error.splitlines()[-1] == "torch.OutOfMemoryError: CUDA out of memory. Tried 2 GiB"
    # a rank's error after the score line still fails the run
    late = write_log(tmp_path / "logs" / "late.txt")
    with late.open("a") as f:
        f.write("error: rank 3: RuntimeError: NCCL watchdog timeout\n")
    assert runlog.parse_log(late).score_name is not None and not runlog.parse_log(late).finished
    with pytest.raises(SystemExit, match=r"late.txt: the run failed \(error: rank 3: RuntimeError: NCCL"):
        make([late], tmp_path)
    text, _, _ = summarize.report(*summarize.results_from_runs([run]), grouped=False)
    assert "failed oom" in text and "CUDA out of memory" in text


# ---- EVALUATION TIME: ALL OF IT ON THE GPU TRACKS, THE SCORING PASS ON THE CPU TRACK ----

def test_gpu_tracks_limit_the_total_evaluation_time(tmp_path):
    heavy = dict(sliding=(1.98, 1.1725, 90_000.0), ttt=(1.95, 1.155, 520_000.0))
    with_total = runlog.parse_log(write_log(tmp_path / "a.txt", eval_total=True, **heavy))
    only_problem(check_record.check_run(with_total, "track_10min_16mb", TRACKS["track_10min_16mb"]),
                 r"total eval_time \(final_eval_total\) 611500ms exceeds the track_10min_16mb evaluation limit of 600 s")
    without = runlog.parse_log(write_log(tmp_path / "b.txt", **heavy))
    only_problem(check_record.check_run(without, "track_non_record_16mb", TRACKS["track_non_record_16mb"]),
                 r"total eval_time \(the sum of the final passes\) 611500ms exceeds")
    assert not check_record.run_compliance(with_total, TRACKS["track_10min_16mb"])["eval_under_limit"]
    cpu = runlog.parse_log(write_log(tmp_path / "c.txt", settings=CPU_OK, eval_total=True, **CPU_RUN, **heavy))
    assert check_record.check_run(cpu, "track_cpu", TRACKS["track_cpu"]) == []  # the 520 s scoring pass is the rule


def test_final_eval_total_must_add_up_the_passes(tmp_path):
    log = write_log(tmp_path / "a.txt", sliding=(1.98, 1.1725, 60_000.0), eval_total=True)
    text = log.read_text()
    log.write_text(text.replace("passes:roundtrip:1500ms,sliding_window:60000ms", "passes:roundtrip:1500ms")
                   .replace("eval_time:61500ms limit", "eval_time:1500ms limit"))
    only_problem(check_record.check_run(runlog.parse_log(log), "track_10min_16mb", TRACKS["track_10min_16mb"]),
                 r"final_eval_total lists the passes \['roundtrip'\]")


# ---- TRACK, AUTHOR, REQUIREMENTS, README ----

def test_track_is_spelled_as_the_challenge_does_and_the_folder_still_checked(tmp_path):
    folder = make(seed_logs(tmp_path), tmp_path)
    assert json.loads((folder / "submission.json").read_text())["track"] == "10min_16mb"
    edit_json(folder / "submission.json", lambda s: s.update(track="track_10min_16mb"))
    only_problem(check_record.check_folder(folder), r"spell it as the challenge does: '10min_16mb'")
    edit_json(folder / "submission.json", lambda s: s.update(track="non_record_16mb"))
    assert any("move the folder to records/track_non_record_16mb/" in p for p in check_record.check_folder(folder))


def git_env(monkeypatch, tmp_path, **config) -> None:
    """git config as a user with only these settings would have it (no system or global file of this machine)."""
    path = tmp_path / "gitconfig"
    path.write_text("".join(f"[{key.split('.')[0]}]\n\t{key.split('.')[1]} = {value}\n" for key, value in config.items()))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(path))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")


def make_without_flags(logs, tmp_path, *extra) -> Path:
    make_record.main([*map(str, logs), "--track", "track_10min_16mb", "--name", "Who", "--blurb", "b",
                      "--date", "2026-01-02", "--records-dir", str(tmp_path / "records"), *extra])
    return tmp_path / "records" / "track_10min_16mb" / "2026-01-02_Who"


def test_author_comes_from_the_flags_or_git_config_and_is_never_invented(tmp_path, monkeypatch):
    logs = seed_logs(tmp_path)
    git_env(monkeypatch, tmp_path)
    with pytest.raises(SystemExit, match="no author: pass --author"):
        make_without_flags(logs, tmp_path)
    git_env(monkeypatch, tmp_path, **{"user.name": "Grace Hopper"})
    with pytest.raises(SystemExit, match="no GitHub login: pass --github-id"):
        make_without_flags(logs, tmp_path)
    with pytest.raises(SystemExit, match="is not a GitHub login"):
        make_without_flags(logs, tmp_path, "--github-id", "grace@navy.mil")
    git_env(monkeypatch, tmp_path, **{"user.name": "Grace Hopper", "github.user": "ghopper"})
    sub = json.loads((make_without_flags(logs, tmp_path) / "submission.json").read_text())
    assert (sub["author"], sub["github_id"]) == ("Grace Hopper", "ghopper")


def test_the_unattributed_placeholder_is_only_for_the_historical_records(tmp_path):
    folder = make(seed_logs(tmp_path), tmp_path)
    edit_json(folder / "submission.json", lambda s: s.update(author=check_record.UNATTRIBUTED))
    only_problem(check_record.check_folder(folder), r"author '\(unattributed\)' is kept only for the records made")
    for committed in (ROOT / "records" / "track_cpu").glob("*/submission.json"):
        sub = json.loads(committed.read_text())
        assert sub["author"] == sub["github_id"] == check_record.UNATTRIBUTED
        assert "maintainers" not in (committed.parent / "README.md").read_text()
        assert f"track_cpu/{committed.parent.name}" in check_record.UNATTRIBUTED_FOLDERS


def test_requirements_name_the_compressors_package(tmp_path):
    logs = [write_log(tmp_path / "logs" / f"b{s}.txt", settings={"SEED": str(s), "COMPRESSOR": "brotli"},
                      val_loss=2.05 + s / 1000) for s in (1, 2, 3)]
    folder = make(logs, tmp_path)
    requirements = (folder / "requirements.txt").read_text().splitlines()
    assert requirements[1:] == ["numpy", "sentencepiece", "brotli"]
    (folder / "requirements.txt").write_text("numpy\nsentencepiece\n")
    only_problem(check_record.check_folder(folder), "requirements.txt: lacks brotli")


def test_a_folders_command_runs_its_packed_script_without_the_packer():
    """A record folder holds train_gpt.py packed and no tools/packing.py: its rerun command drops
    PACK_CODE=1 (the packed file's own bytes are the packed code) and re-roots the data paths."""
    logged = "DATA_PATH=./data/datasets/x PACK_CODE=1 SEED=2 torchrun --nproc_per_node=8 train_gpt.py"
    assert make_record.from_folder(logged) == (
        "DATA_PATH=../../../data/datasets/x SEED=2 torchrun --nproc_per_node=8 train_gpt.py")


def test_readme_says_where_the_data_comes_from_and_how_to_rerun_from_the_folder(tmp_path):
    data = {"DATA_PATH": "./data/datasets/fineweb10B_sp8192", "TOKENIZER_PATH": "./data/tokenizers/fineweb_8192_bpe.model"}
    logs = [write_log(tmp_path / "logs" / f"r{s}.txt", settings={"SEED": str(s), **data}, val_loss=2.05 + s / 1000)
            for s in (1, 2, 3)]
    readme = (make(logs, tmp_path) / "README.md").read_text()
    assert "python data/download_challenge.py --variant sp8192" in readme and "kevclark/parameter-golf" in readme
    assert "DATA_PATH=../../../data/datasets/fineweb10B_sp8192" in readme  # from the record folder
    assert "records/track_10min_16mb/" in readme and "openai/parameter-golf" in readme
    cpu = [write_log(tmp_path / "cpu" / f"c{s}.txt", settings={**CPU_OK, "SEED": str(s)}, val_loss=2.9 + s / 1000,
                     **CPU_RUN) for s in (1, 2, 3)]
    readme = (make(cpu, tmp_path, track="track_cpu", short_name="Cpu") / "README.md").read_text()
    assert "python data/build_sotu.py --variant sp1024" in readme and "no pull request" in readme


# ---- COMPARE AGAINST THE CHALLENGE'S OWN FOLDERS ----

def challenge_folder(root: Path, bpbs, losses=None) -> Path:
    """A record folder as the challenge's accepted ones are written (seed_results keyed by seed, logs of their own
    format, which compare.py does not read)."""
    folder = root / "records" / "track_10min_16mb" / "2026-04-27_Leader"
    folder.mkdir(parents=True)
    seeds = [42, 0, 1234]
    results = {str(s): {"val_bpb": b, "artifact_bytes": 15_900_000, "steps": 4900, "eval_time_s": 500.0,
                        **({"val_loss": losses[i]} if losses else {})} for i, (s, b) in enumerate(zip(seeds, bpbs))}
    sub = {"name": "Leader", "author": "Someone", "github_id": "someone", "date": "2026-04-27", "track": "10min_16mb",
           "val_bpb": sum(bpbs) / 3, "seeds": seeds, "seed_results": results, "hardware": "8xH100 80GB SXM"}
    (folder / "submission.json").write_text(json.dumps(sub))
    (folder / "train_seed42.log").write_text("a log in the entrant's own format\n")
    return folder


def test_compare_reads_the_challenges_folders_per_byte(tmp_path, capsys):
    # CaseOps sp8192 tokens: val_loss per token is not comparable with ours, val_bpb is
    leader = challenge_folder(tmp_path / "c", [1.0599, 1.0612, 1.0621], losses=[2.3194, 2.3224, 2.3242])
    sample = compare.load_sample(str(leader))
    assert (sample.kind, sample.bpbs, sample.tokenizer) == ("challenge", [1.0599, 1.0612, 1.0621], None)
    better = [write_log(tmp_path / "ours" / f"m{s}.txt", settings={"SEED": str(s)}, val_loss=2.9, val_bpb=b)
              for s, b in zip((1, 2, 3), (1.0480, 1.0490, 1.0485))]
    ours = make(better, tmp_path, short_name="Mine")
    assert compare.main([str(ours), str(leader)]) == 0
    out = capsys.readouterr().out
    assert "unit: nats per byte (val_bpb * ln 2; the tokenizer of 2026-04-27_Leader is unknown)" in out
    improvement = (sum((1.0599, 1.0612, 1.0621)) - sum((1.0480, 1.0490, 1.0485))) / 3 * math.log(2)
    assert f"improvement {improvement:+.6f} nats" in out and "SIGNIFICANT" in out
    # a folder that gives val_bpb only, against per-seed values
    bpb_only = challenge_folder(tmp_path / "d", [1.0599, 1.0612, 1.0621])
    assert compare.load_sample(str(bpb_only)).losses is None
    assert compare.main(["--per-byte", "1.0595,1.0600,1.0605", str(bpb_only)]) == 1  # 0.001 bpb is no record
    with pytest.raises(SystemExit, match="no val_bpb to compare per byte"):
        compare.main(["2.30,2.31,2.32", str(bpb_only)])


def test_check_record_command_line_passes_on_the_committed_records():
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "check_record.py"),
                           *map(str, sorted((ROOT / "records" / "track_cpu").glob("*/")))],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.count("OK ") == 4, proc.stdout + proc.stderr

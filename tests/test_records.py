"""tools/ on records/: make, check, compare and summarize. Three seeds of a real tiny run (made here, on the conftest data,
with PACK_CODE=1) go through make -> check -> tamper -> check; synthetic logs in the exact log format cover the
rules a tiny run cannot reach (16 MB caps, 10-minute limits, 8xH100 hardware)."""

import base64
import dataclasses
import hashlib
import json
import lzma
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import check_record  # noqa: E402
import compare  # noqa: E402
import make_record  # noqa: E402
import runlog  # noqa: E402
import summarize  # noqa: E402

TRACKS = runlog.load_tracks()

# ---- SYNTHETIC LOGS ----

FAKE_SOURCE = b'''"""A stand-in train_gpt.py: only its bytes and its defaults matter to the records tools."""
from dataclasses import dataclass


@dataclass
class Hyperparameters:
    data_path: str = "./data/datasets/fineweb10B_sp1024"
    tokenizer_path: str = "./data/tokenizers/fineweb_1024_bpe.model"
    run_id: str = ""
    seed: int = 1337
    iterations: int = 20_000
    train_batch_tokens: int = 524_288
    num_layers: int = 9
    matrix_lr: float = 0.04
    compressor: str = "zlib"
'''
FAKE_DEFAULTS = dict(data_path="./data/datasets/fineweb10B_sp1024", tokenizer_path="./data/tokenizers/fineweb_1024_bpe.model",
                     run_id="", seed=1337, iterations=20_000, train_batch_tokens=524_288, num_layers=9, matrix_lr=0.04,
                     compressor="zlib")
H100 = "cuda: 8x NVIDIA H100 80GB HBM3"


def write_log(path: Path, *, source=FAKE_SOURCE, settings=None, val_loss=2.05, val_bpb=1.2144,
              model_bytes=15_000_000, train_time_ms=599_500.0, steps=None, hardware=H100, device="cuda",
              family="int8_zlib", sliding=None, eval_time_ms=1500.0, finished=True, val_every=0, ttt=None,
              eval_total=False, error=None) -> Path:
    """A log in train_gpt.py's format; `settings` are the env vars the command set, e.g. {"SEED": "7"}.
    sliding/ttt: (val_loss, val_bpb, eval_time_ms) of those passes; eval_total: end with final_eval_total;
    error: the run fails with this message (an `error: rank 0:` line and a traceback) instead of exporting."""
    settings = {"RUN_ID": path.stem, **(settings or {})}
    hp = dict(FAKE_DEFAULTS)
    for name, value in settings.items():
        default = FAKE_DEFAULTS[name.lower()]
        hp[name.lower()] = type(default)(value)
    iterations = hp["iterations"]
    steps = iterations if steps is None else steps
    step_avg = train_time_ms / steps
    lines = ["versions: python:3.11.7 torch:2.13.0", f"hardware: {hardware}",
             "command: " + " ".join(f"{k}={v}" for k, v in sorted(settings.items()))
             + " torchrun --standalone --nproc_per_node=8 train_gpt.py",
             f"hyperparameters: {json.dumps(hp)}",
             f"world_size:8 grad_accum_steps:1 device:{device} compile:True bf16:True", "model_params:17059912"]
    for step in range(0, steps, val_every or steps):
        lines.append(f"step:{step}/{iterations} val_loss:{val_loss + 1 / (step + 1):.4f} "
                     f"val_bpb:{val_bpb + 0.5 / (step + 1):.4f} train_time:{step * step_avg:.0f}ms step_avg:{step_avg:.2f}ms")
    lines.append(f"step:{steps}/{iterations} train_loss:{val_loss:.4f} train_time:{train_time_ms:.0f}ms "
                 f"step_avg:{step_avg:.2f}ms tok/s:12000000 mfu:41.2%")
    lines.append(f"step:{steps}/{iterations} val_loss:{val_loss:.4f} val_bpb:{val_bpb:.4f} "
                 f"train_time:{train_time_ms:.0f}ms step_avg:{step_avg:.2f}ms")
    if steps < iterations:
        lines.append(f"stopping_early: wallclock_cap train_time:{train_time_ms:.0f}ms step:{steps}/{iterations}")
    if error is not None:
        lines += ["error: rank 0: Traceback (most recent call last):", '  File "train_gpt.py", line 1500, in main',
                  "    train_and_score(run, source)", error]
    elif finished:
        label = family.replace("_", "+")
        model_sha = hashlib.sha256(f"{path.stem}:{model_bytes}".encode()).hexdigest()
        lines += [f"Serialized model {label}: {model_bytes} bytes", f"Code size: {len(source)} bytes",
                  f"Total submission size {label}: {model_bytes + len(source)} bytes",
                  f"artifact: logs/{path.stem}_model.ptz bytes:{model_bytes} sha256:{model_sha}",
                  f"final_{family}_roundtrip val_loss:{val_loss:.4f} val_bpb:{val_bpb:.4f} eval_time:{eval_time_ms:.0f}ms",
                  f"final_{family}_roundtrip_exact val_loss:{val_loss:.8f} val_bpb:{val_bpb:.8f}"]
        passes = {"roundtrip": eval_time_ms}
        for name, scored in (("sliding_window", sliding), ("ttt", ttt)):
            if scored is not None:
                loss, bpb, ms = (*scored, 90_000.0)[:3]
                passes[name] = ms
                lines += [f"progress: final_{family}_{name} 1024/2048 tokens/s:1000 left:1s",
                          f"final_{family}_{name} val_loss:{loss:.4f} val_bpb:{bpb:.4f} eval_time:{ms:.0f}ms",
                          f"final_{family}_{name}_exact val_loss:{loss:.8f} val_bpb:{bpb:.8f}"]
        if eval_total:
            lines.append(f"final_eval_total eval_time:{sum(passes.values()):.0f}ms limit:600000ms passes:"
                         + ",".join(f"{name}:{ms:.0f}ms" for name, ms in passes.items()) + " graphs_compiled_inside:0")
    header = f"==== train_gpt.py source bytes:{len(source)} sha256:{hashlib.sha256(source).hexdigest()} ====\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header.encode() + source + b"\n==== end of source ====\n" + "\n".join(lines).encode() + b"\n")
    return path


def seed_logs(tmp_path, seeds=(1, 2, 3), losses=(2.050, 2.052, 2.048), **kwargs) -> list[Path]:
    return [write_log(tmp_path / "logs" / f"run_seed{s}.txt", settings={"SEED": str(s)}, val_loss=loss,
                      val_bpb=loss / 1.69, **kwargs) for s, loss in zip(seeds, losses)]


def make(logs, tmp_path, track="track_10min_16mb", short_name="Test", **kwargs) -> Path:
    """make_record.py's command line, with an author, into tmp_path/records."""
    argv = [*map(str, logs), "--track", track, "--name", "Test Record", "--short-name", short_name,
            "--author", "Ada Lovelace", "--github-id", "ada", "--blurb", "A record made by the tests.",
            "--date", "2026-01-02", "--records-dir", str(tmp_path / "records")]
    argv += [f"--{k.replace('_', '-')}" for k, v in kwargs.items() if v is True]
    make_record.main(argv)
    return tmp_path / "records" / track / f"2026-01-02_{short_name}"


def forge(logs, tmp_path, track="track_10min_16mb") -> Path:
    """A record folder assembled by hand, as a user might, without make's refusal of bad runs."""
    runs = [runlog.parse_log(p) for p in logs]
    meta = dict(author="Ada", github_id="ada", name="Forged", blurb="By hand.", date="2026-01-02")
    folder = tmp_path / "records" / track / "2026-01-02_Forged"
    folder.mkdir(parents=True)
    (folder / "train_gpt.py").write_bytes(runs[0].source)
    for p in logs:
        shutil.copyfile(p, folder / p.name)
    sub = make_record.submission_for(runs, meta, runs[0].source, TRACKS[track])
    (folder / "submission.json").write_text(json.dumps(sub, indent=2))
    (folder / "README.md").write_text(make_record.readme_for(runs, sub, track, TRACKS[track], folder.name))
    return folder


def edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=2))


def only_problem(problems: list[str], pattern: str) -> str:
    assert len(problems) == 1 and re.search(pattern, problems[0]), problems
    return problems[0]


# ---- THE LOG PARSER ----


def test_parser_reads_every_interface_line(tmp_path):
    log = write_log(tmp_path / "a.txt", settings={"SEED": "7", "NUM_LAYERS": "11"}, steps=13780,
                    train_time_ms=600_038.0, val_every=5000)
    run = runlog.parse_log(log)
    assert run.source == FAKE_SOURCE and run.seed == 7 and run.hyperparameters["num_layers"] == 11
    assert run.env == {"NUM_LAYERS": "11", "RUN_ID": "a", "SEED": "7"}
    assert (run.last_step, run.iterations, run.train_time_ms) == (13780, 20000, 600_038.0)
    assert run.stopping_early["train_time_ms"] == 600_038.0
    assert run.steps[-2]["mfu_pct"] == 41.2 and run.steps[-2]["tok/s"] == 12_000_000
    assert [step for step, _, _ in run.val_curve] == [0, 5000, 10000, 13780]
    assert (run.score_name, run.val_loss, run.eval_time_ms) == ("int8_zlib_roundtrip_exact", 2.05, 1500.0)
    assert (run.export_family, run.code_bytes, run.total_bytes) == ("int8+zlib", len(FAKE_SOURCE),
                                                                     15_000_000 + len(FAKE_SOURCE))


def test_score_is_the_sliding_window_line_when_present(tmp_path):
    run = runlog.parse_log(write_log(tmp_path / "a.txt", family="int6_lzma", sliding=(1.98, 1.1725)))
    assert run.score_name == "int6_lzma_sliding_window_exact" and run.val_bpb == 1.1725
    assert run.roundtrip_val_bpb == 1.2144  # still shown by summarize
    assert run.export_family == "int6+lzma" and run.eval_time_ms == 90_000.0


def test_score_is_the_test_time_training_line_when_present(tmp_path):
    path = write_log(tmp_path / "a.txt", family="int6_lzma", sliding=(1.98, 1.1725))
    with path.open("a") as f:
        f.write("final_int6_lzma_ttt val_loss:1.9500 val_bpb:1.1550 eval_time:400000ms\n"
                "final_int6_lzma_ttt_exact val_loss:1.95000000 val_bpb:1.15500000\n")
    run = runlog.parse_log(path)
    assert (run.score_name, run.val_bpb, run.eval_time_ms) == ("int6_lzma_ttt_exact", 1.155, 400000.0)
    assert run.roundtrip_val_bpb == 1.2144


def test_check_refuses_calibration_on_training_data_past_its_reserve(tmp_path):
    for spent, problems in ((25_000, 1), (15_000, 0)):
        path = write_log(tmp_path / f"a{spent}.txt")
        with path.open("a") as f:
            f.write(f"gptq: matrices:55 calib:train sequences:64 calibration_time:{spent}ms reserved:20000ms\n")
        found = check_record.check_run(runlog.parse_log(path), "track_10min_16mb", runlog.load_tracks()["track_10min_16mb"])
        assert len(found) == problems and all("over the 20000ms reserved" in p for p in found), found


def test_parser_rejects_a_log_whose_source_was_edited(tmp_path):
    log = write_log(tmp_path / "a.txt")
    log.write_bytes(log.read_bytes().replace(b"num_layers: int = 9", b"num_layers: int = 8"))
    with pytest.raises(runlog.LogError, match="does not match its header"):
        runlog.parse_log(log)


# ---- CHECK, ON SYNTHETIC RECORDS ----


def test_a_valid_synthetic_record_passes(tmp_path):
    folder = make(seed_logs(tmp_path), tmp_path)
    assert check_record.check_folder(folder) == []
    sub = json.loads((folder / "submission.json").read_text())
    assert sub["seeds"] == [1, 2, 3] and sub["val_loss"] == pytest.approx(2.05, abs=1e-9)
    assert sub["track"] == "10min_16mb" and list(sub["seed_results"]) == ["1", "2", "3"]
    assert sub["val_loss_std"] == pytest.approx(0.002, abs=1e-9)  # sample std of 2.050, 2.052, 2.048
    assert sub["bytes_code"] == len(FAKE_SOURCE) == (folder / "train_gpt.py").stat().st_size


def test_check_catches_an_oversized_artifact(tmp_path):
    logs = seed_logs(tmp_path, model_bytes=16_000_001 - len(FAKE_SOURCE))
    only_problem(check_record.check_folder(forge(logs[:1], tmp_path)),
                 r"16,000,001 bytes exceeds the track_10min_16mb cap of 16,000,000 bytes by 1")
    with pytest.raises(SystemExit, match="exceeds the track_10min_16mb cap"):
        make(logs, tmp_path)


def test_check_catches_an_over_time_log_and_allows_the_last_step(tmp_path):
    over = write_log(tmp_path / "logs" / "over.txt", train_time_ms=601_000.0, steps=13780)
    only_problem(check_record.check_folder(forge([over], tmp_path)), r"train_time 601000ms exceeds .* 600 s")
    capped = write_log(tmp_path / "logs" / "capped.txt", train_time_ms=600_043.0, steps=13780)  # stopped on the cap
    assert check_record.check_run(runlog.parse_log(capped), "track_10min_16mb", TRACKS["track_10min_16mb"]) == []


def test_check_enforces_track_hardware_and_the_cpu_budget(tmp_path):
    a100 = runlog.parse_log(write_log(tmp_path / "a100.txt", hardware="cuda: 8x NVIDIA A100-SXM4-80GB"))
    only_problem(check_record.check_run(a100, "track_10min_16mb", TRACKS["track_10min_16mb"]), "hardware")
    assert check_record.check_run(a100, "track_non_record_16mb", TRACKS["track_non_record_16mb"]) == []
    cpu = TRACKS["track_cpu"]
    ok = {"DATA_PATH": "./data/datasets/sotu_sp1024", "TOKENIZER_PATH": "./data/tokenizers/sotu_1024_bpe.model",
          "ITERATIONS": str(cpu["max_steps"]), "TRAIN_BATCH_TOKENS": str(cpu["train_batch_tokens"])}
    two_cores = "cpu: Intel(R) Xeon(R), 2 logical cores, 1 torch threads per process x 2 processes"
    small = dict(model_bytes=100_000, train_time_ms=1000.0 * cpu["train_time_limit_s"] - 5000, device="cpu",
                 hardware=two_cores)
    good = runlog.parse_log(write_log(tmp_path / "good.txt", settings=ok, **small))
    assert check_record.check_run(good, "track_cpu", cpu) == []
    wide = runlog.parse_log(write_log(tmp_path / "wide.txt", settings=ok,
                                      **{**small, "hardware": two_cores.replace("1 torch", "8 torch")}))
    only_problem(check_record.check_run(wide, "track_cpu", cpu), "shows 16 threads")
    capped = runlog.parse_log(write_log(tmp_path / "capped.txt", settings=ok, steps=cpu["max_steps"] - 50, **small))
    only_problem(check_record.check_run(capped, "track_cpu", cpu), "MAX_WALLCLOCK_SECONDS=0")
    long = runlog.parse_log(write_log(tmp_path / "long.txt", settings={**ok, "ITERATIONS": str(cpu["max_steps"] + 1)},
                                      **small))
    assert any("at most" in p for p in check_record.check_run(long, "track_cpu", cpu))
    fineweb = runlog.parse_log(write_log(tmp_path / "fw.txt", settings={**ok, "DATA_PATH": "./data/fineweb10B_sp1024"},
                                         **small))
    only_problem(check_record.check_run(fineweb, "track_cpu", cpu), "DATA_PATH")


def test_check_reports_every_problem_not_just_the_first(tmp_path):
    folder = make(seed_logs(tmp_path), tmp_path)
    (folder / "README.md").unlink()
    edit_json(folder / "submission.json", lambda s: s.update(bytes_code=1, val_bpb=1.0, author=""))
    problems = check_record.check_folder(folder)
    for pattern in ("README.md: missing", "bytes_code=1", "val_bpb=1.0 but the mean", "author is empty"):
        assert any(pattern in p for p in problems), (pattern, problems)


def test_make_never_overwrites_and_refuses_mixed_or_duplicate_runs(tmp_path):
    folder = make(seed_logs(tmp_path), tmp_path)
    before = (folder / "submission.json").read_text()
    with pytest.raises(SystemExit, match="already exists"):
        make(seed_logs(tmp_path, losses=(1.0, 1.0, 1.0)), tmp_path)
    assert (folder / "submission.json").read_text() == before
    other = write_log(tmp_path / "other" / "x.txt", source=FAKE_SOURCE + b"# changed\n", settings={"SEED": "9"})
    with pytest.raises(SystemExit, match="differ in source"):
        make([*seed_logs(tmp_path)[:1], other], tmp_path, short_name="Mixed")
    twin = write_log(tmp_path / "other" / "twin.txt", settings={"SEED": "1"})
    with pytest.raises(SystemExit, match="own SEED"):
        make([*seed_logs(tmp_path)[:1], twin], tmp_path, short_name="Twins")
    assert not (tmp_path / "records" / "track_10min_16mb" / "2026-01-02_Mixed").exists()


# ---- MAKE AND CHECK ON A REAL TINY RUN ----

TINY_ENV = dict(NUM_LAYERS="2", MODEL_DIM="64", NUM_HEADS="2", NUM_KV_HEADS="1", MLP_MULT="2", TRAIN_SEQ_LEN="64",
                TRAIN_BATCH_TOKENS="1024", VAL_BATCH_SIZE="8192", ITERATIONS="6", WARMUP_STEPS="0",
                VAL_LOSS_EVERY="3", TRAIN_LOG_EVERY="1", MAX_WALLCLOCK_SECONDS="0", TTT_ENABLED="1", TTT_LORA_RANK="4",
                TTT_CHUNK_SIZE="64", TTT_LORA_LR="0.001", PACK_CODE="1")  # the score is TTT's, which a deep check must re-run; the code is packed


@pytest.fixture(scope="module")
def tiny_runs(short_val_data, tmp_path_factory) -> list[Path]:
    """Three seeds of a real train_gpt.py run on the tiny data (its short validation), as a record has them;
    returns their logs."""
    import train_gpt

    cwd = tmp_path_factory.mktemp("tiny_runs")
    hparam_names = {f.name.upper() for f in dataclasses.fields(train_gpt.Hyperparameters)}
    procs = {}
    for seed in (7, 8, 9):  # side by side, one thread each
        env = {k: v for k, v in os.environ.items() if k not in hparam_names}
        data = short_val_data
        env.update(TINY_ENV, DATA_PATH=str(data.data_path), TOKENIZER_PATH=str(data.tokenizer_path),
                   VOCAB_SIZE=str(data.vocab_size), SEED=str(seed), RUN_ID=f"tiny_seed{seed}",
                   OMP_NUM_THREADS="1", DEVICE="cpu", COMPILE="0", BF16="0")
        procs[seed] = subprocess.Popen([sys.executable, str(ROOT / "train_gpt.py")], env=env, cwd=cwd,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for proc in procs.values():
        _, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
    return [cwd / "logs" / f"tiny_seed{seed}.txt" for seed in procs]


@pytest.fixture
def tiny_record(tiny_runs, tmp_path) -> Path:
    return make(tiny_runs, tmp_path, track="track_non_record_16mb", copy_artifacts=True)


def test_real_run_makes_a_record_that_passes(tiny_record, tiny_runs):
    assert check_record.check_folder(tiny_record) == []
    script = (tiny_record / "train_gpt.py").read_bytes()
    logged = runlog.parse_log(tiny_runs[0]).source
    shown = re.search(r"^val_tokens:(\d+) val_bytes:\d+ train_shards:(\d+)$", tiny_runs[0].read_text(), re.M)
    assert runlog.parse_log(tiny_runs[0]).fingerprints == dict(zip(("val_tokens", "train_shards"),
                                                                  map(int, shown.groups())))
    # the packed file the runs counted (PACK_CODE=1), decoded here by hand: the logged program, docstrings aside
    size, packed_from = map(int, re.search(r"^Code size: (\d+) bytes \(packed from (\d+): PACK_CODE=1\)$",
                                           tiny_runs[0].read_text(), re.M).groups())
    assert (len(script), packed_from) == (size, len(logged)) and size < len(logged) / 2
    head, payload, tail = re.fullmatch(rb'(import lzma as L,base64 as B\nexec\(L\.decompress\(B\.b85decode\(")(.*)'
                                       rb'("\)\)\)\n)', script, re.S).groups()
    program = lzma.decompress(base64.b85decode(payload)).decode()
    assert '"""train_gpt.py:' not in program and "def final_passes" in program and "def main" in program
    sub = json.loads((tiny_record / "submission.json").read_text())
    for seed, log in zip((7, 8, 9), tiny_runs):  # the claims, read from the logs by a separate regex
        result, text = sub["seed_results"][str(seed)], log.read_text()
        loss, bpb = re.search(r"^final_\w+_ttt_exact val_loss:(\S+) val_bpb:(\S+)$", text, re.M).groups()
        total = re.search(r"^Total submission size \S+: (\d+) bytes$", text, re.M).group(1)
        eval_ms = re.search(r"^final_eval_total eval_time:(\d+)ms", text, re.M).group(1)
        assert (result["val_loss"], result["val_bpb"], result["artifact_bytes"]) == (float(loss), float(bpb), int(total))
        assert result["eval_time_s"] == int(eval_ms) / 1000
        model = tiny_record / Path(re.search(r"^artifact: (\S+) bytes:", text, re.M).group(1)).name
        assert result["model_sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
    assert sub["bytes_code"] == len(script)
    readme = (tiny_record / "README.md").read_text()
    command = re.search(r"^command: (.*)$", tiny_runs[0].read_text(), re.M).group(1)
    rerun = command.replace("PACK_CODE=1 ", "")  # the folder's train_gpt.py is packed already
    assert rerun != command and rerun in readme and "SEED=7" in command and f"{sub['val_bpb']:.4f}" in readme


def test_a_tiny_record_has_every_field_of_the_challenges_folders(tiny_record):
    """What the challenge's accepted folders hold (records/track_10min_16mb/* of openai/parameter-golf)."""
    sub = json.loads((tiny_record / "submission.json").read_text())
    for key in ("name", "author", "github_id", "date", "track", "blurb", "val_bpb", "val_loss", "val_bpb_std",
                "val_loss_std", "seeds", "seed_results", "hardware", "pytorch_version", "compliance", "bytes_total",
                "bytes_code", "eval_time_s_mean"):
        assert sub[key] is not None, key
    assert sub["track"] == "non_record_16mb" and sub["seeds"] == [7, 8, 9]
    assert (sub["author"], sub["github_id"]) == ("Ada Lovelace", "ada")
    for seed in ("7", "8", "9"):
        challenge_fields = {"val_loss", "val_bpb", "artifact_bytes", "steps", "step_avg_ms", "eval_time_s"}
        assert challenge_fields <= set(sub["seed_results"][seed])
    bpbs = [sub["seed_results"][s]["val_bpb"] for s in ("7", "8", "9")]
    assert sub["val_bpb_std"] == pytest.approx(statistics.stdev(bpbs), abs=1e-8)
    assert sub["compliance"] == dict(train_under_limit=True, artifact_under_cap=True, eval_under_limit=True,
                                     score_first_ttt=True, calibration_inside_budget=True, three_seeds=True)
    assert (tiny_record / "requirements.txt").read_text().split("\n")[1:3] == ["numpy", "sentencepiece"]
    readme = (tiny_record / "README.md").read_text()
    for section in ("## Results", "## What changed", "## Data", "## Install", "## Compliance", "## Reproduction",
                    "## Opening the pull request"):
        assert section in readme, section
    assert "score-first" in readme and "records/track_non_record_16mb/" in readme and "*.ptz" in readme
    assert "pip install torch==2.13" in readme and "pip install -r requirements.txt" in readme


def test_check_catches_a_tampered_submission(tiny_record):
    edit_json(tiny_record / "submission.json",
              lambda s: s["seed_results"]["7"].update(val_bpb=s["seed_results"]["7"]["val_bpb"] - 0.01))
    only_problem(check_record.check_folder(tiny_record), r"seed 7 claims val_bpb=.* but tiny_seed7\.txt shows")


def repack(script: bytes, edit) -> bytes:
    """A packed file of another program: `edit` changes the unpacked code."""
    head, payload, tail = re.fullmatch(rb'(.*?b85decode\(")(.*)("\)\)\)\n)', script, re.S).groups()
    program = edit(lzma.decompress(base64.b85decode(payload)))
    return head + base64.b85encode(lzma.compress(program)) + tail


def test_check_catches_a_packed_script_of_another_program(tiny_record):
    script = (tiny_record / "train_gpt.py").read_bytes()
    other = repack(script, lambda program: program.replace(b"def main", b"def main_", 1))
    (tiny_record / "train_gpt.py").write_bytes(other)
    edit_json(tiny_record / "submission.json", lambda s: s.update(script_sha256=hashlib.sha256(other).hexdigest(),
                                                                  bytes_code=len(other)))
    problems = check_record.check_folder(tiny_record)
    assert any("is not the logged source (AST dumps differ" in p for p in problems), problems
    assert any("re-packing the logged source with its own pack_source gives" in p for p in problems), problems
    # the same program with anything after its two lines is not the logged packing either
    extra = script + b"print('and more')\n"
    (tiny_record / "train_gpt.py").write_bytes(extra)
    edit_json(tiny_record / "submission.json", lambda s: s.update(script_sha256=hashlib.sha256(extra).hexdigest(),
                                                                  bytes_code=len(extra)))
    assert any("not exactly its two lines" in p for p in check_record.check_folder(tiny_record))


def test_check_refuses_the_readable_source_where_the_runs_counted_it_packed(tiny_record, tiny_runs):
    readable = runlog.parse_log(tiny_runs[0]).source
    (tiny_record / "train_gpt.py").write_bytes(readable)
    edit_json(tiny_record / "submission.json", lambda s: s.update(script_sha256=hashlib.sha256(readable).hexdigest(),
                                                                  bytes_code=len(readable)))
    problems = check_record.check_folder(tiny_record)
    assert len(problems) == 3 and all("must be that packed file" in p for p in problems), problems


def test_deep_check_recomputes_the_score_and_catches_a_forged_claim(tiny_record):
    notes = []
    assert check_record.check_folder(tiny_record, deep=True, notes=notes) == []
    assert len(notes) == 6 and all("recomputed" in n for n in notes)  # round trip and TTT, of each seed
    assert sum("test-time-training val_bpb" in n for n in notes) == 3
    # Forge a better score in the log and in submission.json alike: only re-scoring can tell.
    log = tiny_record / "tiny_seed7.txt"
    text = log.read_text()
    m = re.search(r"^final_\w+_ttt_exact val_loss:\S+ val_bpb:(\S+)$", text, re.M)
    claimed = float(m.group(1))
    log.write_text(text[:m.start(1)] + f"{claimed - 0.05:.8f}" + text[m.end(1):])

    def forge_claim(sub):
        sub["seed_results"]["7"]["val_bpb"] = round(claimed - 0.05, 8)
        bpbs = [r["val_bpb"] for r in sub["seed_results"].values()]
        sub["val_bpb"], sub["val_bpb_std"] = round(statistics.fmean(bpbs), 8), round(statistics.stdev(bpbs), 8)
    edit_json(tiny_record / "submission.json", forge_claim)
    assert check_record.check_folder(tiny_record) == []
    only_problem(check_record.check_folder(tiny_record, deep=True), r"tiny_seed7\.txt: reloading \S+ gives")


def test_deep_check_is_skipped_cleanly_without_data(tiny_record, tmp_path):
    notes = []
    assert check_record.check_folder(tiny_record, deep=True, data_path=tmp_path / "absent", notes=notes) == []
    assert notes and all("skipped" in n and "data_path" in n for n in notes)


# ---- COMPARE ----


def student_t4_sf(t: float) -> float:
    """P(T > t) for Student's t with 4 degrees of freedom, in closed form (no library)."""
    u = t / math.sqrt(1 + t * t / 4)
    return 0.5 - 3 / 8 * u * (1 - u * u / 12)


def test_welch_test_matches_a_worked_example():
    # By hand: means 1.21 and 1.24, both stds 0.01, n = 3 each. The improvement 0.03 minus the 0.005
    # margin is 0.025; SE = sqrt(0.01^2/3 + 0.01^2/3) = 0.0081650; t = 3.0619; Welch df = 4 exactly.
    c = compare.compare(compare.Sample("cand", [1.20, 1.21, 1.22]), compare.Sample("best", [1.23, 1.24, 1.25]))
    assert c.t == pytest.approx(3.0619, abs=1e-4) and c.df == pytest.approx(4.0)
    assert c.p == pytest.approx(student_t4_sf(3.0619), abs=1e-4) and c.p == pytest.approx(0.01880, abs=1e-4)
    assert not c.significant
    # n per side at these stds: n=3 gives t 3.06 < 3.747 (t table, df 4, one-sided 0.01); n=4 gives
    # t = 0.025 / sqrt(2e-4/4) = 3.536 > 3.143 (df 6), so 4 seeds each would do.
    assert c.seeds_needed_both == 4
    # Candidate seeds alone never do: as their n grows, t tends to 0.025 / (0.01/sqrt(3)) = 4.33 while
    # Welch's df falls to the best's n - 1 = 2, whose one-sided 0.01 critical value is 6.965.
    assert c.seeds_needed is None
    # Shift the candidate down 0.01: t = 0.035 / 0.0081650 = 4.2866, p = 0.0064 < 0.01.
    c = compare.compare(compare.Sample("cand", [1.19, 1.20, 1.21]), compare.Sample("best", [1.23, 1.24, 1.25]))
    assert c.t == pytest.approx(4.2866, abs=1e-4) and c.p == pytest.approx(student_t4_sf(4.2866), abs=1e-4)
    assert c.significant


def test_welch_not_student_when_spreads_differ():
    # By hand: candidate std 0.005, best std 0.01, n = 3 each; a = 0.005^2/3, b = 0.01^2/3.
    # t = (1.24 - 1.205 - 0.005) / sqrt(a + b) = 0.030 / 0.0064550 = 4.6476;
    # Welch df = (a + b)^2 / (a^2/2 + b^2/2) = 2.941, where a pooled test would use 4.
    c = compare.compare(compare.Sample("cand", [1.20, 1.205, 1.21]), compare.Sample("best", [1.23, 1.24, 1.25]))
    assert c.t == pytest.approx(4.6476, abs=1e-4) and c.df == pytest.approx(2.941, abs=1e-3)
    t2_sf = 0.5 - c.t / (2 * math.sqrt(2 + c.t ** 2))  # Student t, df 2, in closed form
    assert student_t4_sf(c.t) < c.p < t2_sf


def test_compare_reads_record_folders_and_refuses_a_single_seed(tmp_path, capsys):
    best = make(seed_logs(tmp_path / "b", losses=(2.050, 2.052, 2.048)), tmp_path, short_name="Best")
    cand = make(seed_logs(tmp_path / "c", losses=(2.030, 2.031, 2.029)), tmp_path, short_name="Cand")
    assert compare.main([str(cand), str(best)]) == 0
    assert "SIGNIFICANT" in capsys.readouterr().out
    assert compare.main([str(best), str(cand)]) == 1  # the other way round is no record
    with pytest.raises(SystemExit, match="at least 2"):
        compare.main(["2.01", str(best)])


def vocab_logs(folder, vocab, losses, bpbs):
    tokenizer = f"./data/tokenizers/fineweb_{vocab}_bpe.model"
    return [write_log(folder / "logs" / f"sp{vocab}_seed{s}.txt", settings={"SEED": str(s), "TOKENIZER_PATH": tokenizer},
                      val_loss=loss, val_bpb=bpb) for s, loss, bpb in zip((1, 2, 3), losses, bpbs)]


def test_compare_across_tokenizers_uses_nats_per_byte(tmp_path, capsys):
    # sp8192 has fewer, harder tokens: more nats per token, yet fewer bits per byte
    best = make(vocab_logs(tmp_path / "b", 1024, (2.050, 2.052, 2.048), (1.2140, 1.2150, 1.2130)), tmp_path,
                short_name="Sp1024")
    cand = make(vocab_logs(tmp_path / "c", 8192, (2.900, 2.902, 2.898), (1.1940, 1.1950, 1.1930)), tmp_path,
                short_name="Sp8192")
    assert compare.main([str(cand), str(best)]) == 0
    out = capsys.readouterr().out
    assert "unit: nats per byte (val_bpb * ln 2; the tokenizers differ)" in out
    assert f"improvement {+0.02 * math.log(2):+.6f} nats" in out
    assert "fineweb_8192_bpe.model" in out  # the tokenizer file (VOCAB_SIZE when logged)
    # in nats per token the same records would be compared the wrong way round
    assert not compare.compare(compare.load_sample(str(cand)), compare.load_sample(str(best))).significant
    # the margin is converted at the candidate's bytes per token: 2.9 nats per token at 1.194 bpb is
    # 3.504 bytes per token, so 0.005 nats per token is 0.001427 nats per byte
    assert "needs > 0.001427 nats per byte: 0.005 nats per token at the candidate's 3.504 bytes" in out
    assert "nats per token: improvement -0.850000" in out and "not comparable: the tokenizers differ" in out
    # 0.001 bpb better is 0.000693 nats per byte, under the converted margin
    close = make(vocab_logs(tmp_path / "d", 8192, (2.9, 2.902, 2.898), (1.2130, 1.2140, 1.2120)), tmp_path,
                 short_name="Close")
    assert compare.main([str(close), str(best)]) == 1
    assert "not above 0.001449" in capsys.readouterr().out  # 0.005 / 3.449 bytes per token


def test_compare_same_tokenizer_stays_per_token_and_values_per_byte(tmp_path, capsys):
    best = make(vocab_logs(tmp_path / "b", 1024, (2.050, 2.052, 2.048), (1.2140, 1.2150, 1.2130)), tmp_path,
                short_name="A")
    cand = make(vocab_logs(tmp_path / "c", 1024, (2.030, 2.031, 2.029), (1.2020, 1.2030, 1.2010)), tmp_path,
                short_name="B")
    assert compare.main([str(cand), str(best)]) == 0
    out = capsys.readouterr().out
    assert "unit: nats per token (val_loss); both used fineweb_1024_bpe.model\n" in out
    assert "the same test per byte, at the converted margin" in out  # the other reading
    assert compare.main(["--per-byte", "1.194,1.195,1.193", str(best)]) == 0
    assert "unit: nats per byte (val_bpb * ln 2; asked for)" in capsys.readouterr().out
    compare.main(["2.03,2.031,2.029", str(best)])
    assert "tokenizer is unknown" in capsys.readouterr().out


# ---- SUMMARIZE ----


def test_summarize_sorts_by_score_and_shows_only_changed_settings(tmp_path):
    logs = tmp_path / "logs"
    write_log(logs / "deep.txt", settings={"NUM_LAYERS": "11", "ITERATIONS": "500"}, val_bpb=1.20, steps=500)
    write_log(logs / "base.txt", settings={"NUM_LAYERS": "9", "ITERATIONS": "500"}, val_bpb=1.25, steps=500)
    write_log(logs / "crashed.txt", settings={"MATRIX_LR": "0.06", "ITERATIONS": "500"}, finished=False, steps=200)
    (logs / "notes.txt").write_text("not a run log\n")
    runs, skipped = summarize.load_runs(logs)
    assert len(runs) == 3 and len(skipped) == 1
    text, _, _ = summarize.report(*summarize.results_from_runs(runs), grouped=False)
    lines = text.splitlines()
    assert lines[0] == "every run: ITERATIONS=500"  # shared by all runs, printed once
    rows = [line.split() for line in lines[2:5]]
    assert [r[0] for r in rows] == ["deep", "base", "crashed"]
    assert rows[0][1] == "NUM_LAYERS=11" and rows[1][1] == "(defaults)"  # NUM_LAYERS=9 is the default
    assert rows[2][1] == "MATRIX_LR=0.06" and "unfinished" in rows[2]


def test_summarize_writes_validation_curves(tmp_path):
    pytest.importorskip("matplotlib")
    for name, bpb in (("a", 1.20), ("b", 1.25)):
        write_log(tmp_path / "logs" / f"{name}.txt", val_bpb=bpb, steps=300, val_every=100,
                  settings={"ITERATIONS": "300"})
    assert summarize.main([str(tmp_path / "logs"), "--plots", str(tmp_path / "plots")]) == 0
    for name in ("val_bpb_vs_step.png", "val_bpb_vs_wallclock.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- THE TRACKS AND THE COMMITTED RECORDS ----


def test_tracks_table_and_folders_agree():
    track_dirs = {p.name for p in (ROOT / "records").glob("track_*") if p.is_dir()}
    assert track_dirs == set(TRACKS)
    for name, track in TRACKS.items():
        assert (ROOT / "records" / name / "README.md").is_file()
        assert isinstance(track["artifact_cap_bytes"], int)
    for name in ("track_10min_16mb", "track_non_record_16mb"):
        assert TRACKS[name]["artifact_cap_bytes"] == 16_000_000
    assert TRACKS["track_10min_16mb"]["train_time_limit_s"] == 600
    cpu_rules = (ROOT / "records" / "track_cpu" / "README.md").read_text()
    for key in ("artifact_cap_bytes", "max_steps", "train_batch_tokens", "train_time_limit_s"):
        assert f"{TRACKS['track_cpu'][key]:,}" in cpu_rules, key  # the rules state the table's numbers


@pytest.mark.parametrize("folder", sorted(p.parent for p in (ROOT / "records").glob("track_*/*/submission.json")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_records_pass_the_checker(folder):
    assert check_record.check_folder(folder) == []

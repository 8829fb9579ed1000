"""tools/sweep.py and summarize.py's tables: a sweep of two settings x two seeds with a fake trainer (a script
written here that writes train_gpt.py's log format in milliseconds, its numbers set by SEED and MATRIX_LR),
reruns that skip finished runs, failures reported with their error, and one real tiny train_gpt.py run."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import summarize  # noqa: E402
import sweep  # noqa: E402
from conftest import CPU_PINNED, TINY_RUN_ENV  # noqa: E402

FAKE_TRAINER = r'''"""A stand-in for train_gpt.py: its log format, numbers from SEED and MATRIX_LR; MATRIX_LR > 1 diverges
(an `error: rank 0:` line and a traceback), MATRIX_LR < 0 dies before writing a log."""
import hashlib
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class Hyperparameters:
    run_id: str = ""
    seed: int = 1337
    artifact_dir: str = "logs"
    iterations: int = 20
    matrix_lr: float = 0.04


def main():
    hp = Hyperparameters(**{k: type(v)(os.environ[k.upper()]) for k, v in asdict(Hyperparameters()).items()
                            if k.upper() in os.environ})
    with open(Path(__file__).with_name("launches.txt"), "a") as f:
        f.write(f"{hp.run_id} OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}\n")
    if hp.matrix_lr < 0:
        sys.exit("boom: MATRIX_LR must be positive")
    source = Path(__file__).read_bytes()
    bpb = 1.30 + 2 * abs(hp.matrix_lr - 0.03) + 0.001 * hp.seed
    command = " ".join(f"{k}={os.environ[k]}" for k in sorted(os.environ) if k.lower() in asdict(hp))
    lines = ["versions: python:3.11.7 torch:2.13.0",
             "hardware: cpu: fake, 2 logical cores, 1 torch threads per process x 1 processes",
             f"command: {command} python fake_trainer.py", f"hyperparameters: {json.dumps(asdict(hp))}",
             "world_size:1 grad_accum_steps:8 device:cpu compile:False bf16:False"]
    for step in (0, 10, 20):
        lines.append(f"step:{step}/20 val_loss:{2 * bpb + 0.1 * (20 - step):.4f} val_bpb:{bpb + 0.05 * (20 - step):.4f} "
                     f"train_time:{step * 50}ms step_avg:{50.0 if step else 0:.2f}ms")
    if hp.matrix_lr > 1:
        lines += ["error: rank 0: Traceback (most recent call last):", '  File "fake_trainer.py", line 9, in main',
                  f"FloatingPointError: training diverged at MATRIX_LR={hp.matrix_lr}"]
    else:
        rt, ttt = bpb + 0.01, bpb + 0.005  # round trip and TTT scores
        lines += ["Serialized model int8+zlib: 1000 bytes", f"Code size: {len(source)} bytes",
                  f"Total submission size int8+zlib: {1000 + len(source)} bytes",
                  f"artifact: logs/{hp.run_id}.ptz bytes:1000 sha256:{hashlib.sha256(source).hexdigest()} export_time:5ms",
                  f"final_int8_zlib_roundtrip val_loss:{2 * rt:.4f} val_bpb:{rt:.4f} eval_time:100ms",
                  f"final_int8_zlib_roundtrip_exact val_loss:{2 * rt:.8f} val_bpb:{rt:.8f}",
                  f"final_int8_zlib_ttt val_loss:{2 * ttt:.4f} val_bpb:{ttt:.4f} eval_time:300ms",
                  f"final_int8_zlib_ttt_exact val_loss:{2 * ttt:.8f} val_bpb:{ttt:.8f}",
                  "final_eval_total eval_time:400ms limit:600000ms passes:roundtrip:100ms,ttt:300ms"]
    log = Path(hp.artifact_dir) / f"{hp.run_id}.txt"
    log.parent.mkdir(parents=True, exist_ok=True)
    header = f"==== train_gpt.py source bytes:{len(source)} sha256:{hashlib.sha256(source).hexdigest()} ====\n"
    log.write_bytes(header.encode() + source + b"\n==== end of source ====\n" + "\n".join(lines).encode() + b"\n")
    sys.exit(1 if hp.matrix_lr > 1 else 0)


if __name__ == "__main__":
    main()
'''


@pytest.fixture
def fake_trainer(tmp_path) -> Path:
    path = tmp_path / "fake_trainer.py"
    path.write_text(FAKE_TRAINER)
    return path


def launches(trainer: Path) -> list[str]:
    path = trainer.with_name("launches.txt")
    return path.read_text().splitlines() if path.exists() else []


def test_a_sweep_of_two_settings_and_two_seeds(fake_trainer, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "sweeps" / "lr"
    argv = ["--grid", "MATRIX_LR=0.02,0.03", "--seeds", "1,2", "--baseline", "MATRIX_LR=0.02", "--parallel", "2",
            "--cpu-threads", "1", "--out", str(out), "--", sys.executable, str(fake_trainer)]
    assert sweep.main(argv) == 0
    text = capsys.readouterr().out
    ids = {f"lr_matrix_lr={lr}_s{s}" for lr in ("0.02", "0.03") for s in (1, 2)}
    assert {line.split()[0] for line in launches(fake_trainer)} == ids
    assert all(line.endswith("OMP_NUM_THREADS=1") for line in launches(fake_trainer))
    # the table: the better configuration first, mean ± std of the TTT score, its verdict against the baseline
    table = (out / "summary.txt").read_text()
    assert table.strip() in text
    rows = {line.split()[0]: line for line in table.splitlines() if line.startswith("MATRIX_LR=")}
    assert list(rows) == ["MATRIX_LR=0.03", "MATRIX_LR=0.02"]
    assert "1.3065 ± 0.0007" in rows["MATRIX_LR=0.03"] and "SIGNIFICANT" in rows["MATRIX_LR=0.03"]
    assert "-0.0200" in rows["MATRIX_LR=0.03"] and "baseline" in rows["MATRIX_LR=0.02"]
    # pre-quant (the last step:N/N val line), round trip, their gap, train and eval time, artifact bytes
    assert "1.3015" in rows["MATRIX_LR=0.03"] and "1.3115" in rows["MATRIX_LR=0.03"] and "+0.0100" in rows["MATRIX_LR=0.03"]
    assert " 1.0 " in rows["MATRIX_LR=0.03"] and " 0.4 " in rows["MATRIX_LR=0.03"]
    with (out / "summary.csv").open() as f:
        csv_rows = list(csv.DictReader(f))
    assert [r["config"] for r in csv_rows] == ["MATRIX_LR=0.03", "MATRIX_LR=0.02"]
    assert float(csv_rows[0]["score_bpb_mean"]) == pytest.approx(1.3065) and csv_rows[0]["verdict"] == "SIGNIFICANT"
    assert float(csv_rows[0]["p_value"]) < 0.01 and float(csv_rows[0]["quant_gap_bpb"]) == pytest.approx(0.01)
    data = json.loads((out / "summary.json").read_text())
    assert data["baseline"] == "MATRIX_LR=0.02" and data["seeds"] == [1, 2]
    assert [r["seed"] for r in data["configs"][0]["results"]] == [1, 2]
    assert data["configs"][0]["results"][0]["score_line"] == "int8_zlib_ttt_exact"
    if "plots skipped" not in text:
        assert (out / "val_bpb_vs_step.png").is_file() and (out / "val_bpb_vs_wallclock.png").is_file()
    # the same command again: every run has its score, so nothing is launched and the table is the same
    assert sweep.main(argv) == 0
    assert len(launches(fake_trainer)) == 4 and capsys.readouterr().out.count("skipped (finished before)") == 4
    assert (out / "summary.txt").read_text() == table


def test_failures_are_reported_with_their_error_and_rerun(fake_trainer, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    configs = tmp_path / "configs.txt"
    configs.write_text("# one good, one that diverges, one that dies before its log\n-\nMATRIX_LR=5\nMATRIX_LR=-1\n")
    out = tmp_path / "sweeps" / "bad"
    argv = ["--configs", str(configs), "--seeds", "1", "--out", str(out), "--", sys.executable, str(fake_trainer)]
    assert sweep.main(argv) == 1
    text = capsys.readouterr().out
    assert "FloatingPointError: training diverged at MATRIX_LR=5.0" in text  # the log's error and traceback
    assert "it wrote no log" in text and "boom: MATRIX_LR must be positive" in text  # the console's tail
    assert "no finished run" in text
    runs = {r["run_id"]: r for c in json.loads((out / "summary.json").read_text())["configs"] for r in c["results"]}
    assert runs["bad_s1"]["status"] == "finished"  # the base command alone ('-')
    assert runs["bad_matrix_lr=5_s1"]["status"] == runs["bad_matrix_lr=-1_s1"]["status"] == "failed"
    # a rerun starts the failed runs again and keeps their old logs aside
    assert sweep.main(argv) == 1
    assert len(launches(fake_trainer)) == 5
    assert (out / "failed" / "bad_matrix_lr=5_s1.1.txt").is_file()


def test_cli_pieces():
    assert sweep.parse_grid("A=1,2 B=x") == [{"A": "1", "B": "x"}, {"A": "2", "B": "x"}]
    assert sweep.run_id_for("my sweep", {"DATA_PATH": "./data/x y", "MATRIX_LR": "0.02"}, 3) == \
        "my_sweep_data_path=._data_x_y_matrix_lr=0.02_s3"
    long = sweep.run_id_for("s", {f"K{i}": "v" * 20 for i in range(10)}, 1)
    assert len(long) <= sweep.MAX_RUN_ID and long.endswith("_s1")
    assert sweep.slot_envs(2, ["0", "1", "2", "3"], None) == [{"CUDA_VISIBLE_DEVICES": "0,1"},
                                                              {"CUDA_VISIBLE_DEVICES": "2,3"}]
    with pytest.raises(ValueError, match="evenly"):
        sweep.slot_envs(3, ["0", "1"], None)
    with pytest.raises(SystemExit, match="matches 0 configurations"):
        sweep.main(["--grid", "A=1,2", "--baseline", "A=3", "--", "true"])
    with pytest.raises(SystemExit, match="after --"):
        sweep.main(["--grid", "A=1"])


def test_summarize_groups_logs_it_did_not_launch(fake_trainer, tmp_path, capsys):
    """Logs from a shell loop: the same table, CSV and JSON by configuration."""
    logs = tmp_path / "logs"
    for lr in ("0.02", "0.03"):
        for seed in ("1", "2"):
            env = {"PATH": "/usr/bin:/bin", "MATRIX_LR": lr, "SEED": seed, "RUN_ID": f"lr{lr}_{seed}", "ARTIFACT_DIR": str(logs)}
            subprocess.run([sys.executable, str(fake_trainer)], env=env, cwd=tmp_path, check=True)
    assert summarize.main([str(logs), "--baseline", "MATRIX_LR=0.02", "--csv", str(tmp_path / "t.csv"),
                           "--json", str(tmp_path / "t.json")]) == 0
    text = capsys.readouterr().out
    assert "MATRIX_LR=0.03" in text and "SIGNIFICANT" in text and "1.3065 ± 0.0007" in text
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["baseline"] == "MATRIX_LR=0.02" and len(data["configs"]) == 2
    assert (tmp_path / "t.csv").read_text().startswith("config,runs,seeds,score_bpb_mean,score_bpb_std")


def test_a_sweep_of_the_real_trainer(tiny_data, tmp_path, capsys, monkeypatch):
    """One real tiny train_gpt.py run through the sweep: its log is what the table reads."""
    import settings
    import train_gpt

    for name in settings.setting_names(train_gpt.Hyperparameters):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # the run's cwd: nothing lands in the repository
    base = {**TINY_RUN_ENV, **CPU_PINNED, "DATA_PATH": tiny_data.data_path, "TOKENIZER_PATH": tiny_data.tokenizer_path,
            "VOCAB_SIZE": tiny_data.vocab_size, "ITERATIONS": 4, "WARMDOWN_ITERS": 2, "VAL_LOSS_EVERY": 2}
    out = tmp_path / "sweeps" / "real"
    assert sweep.main(["--grid", "MATRIX_LR=0.02", "--seeds", "5", "--cpu-threads", "1", "--out", str(out),
                       "--base", " ".join(f"{k}={v}" for k, v in base.items()),
                       "--", sys.executable, str(ROOT / "train_gpt.py")]) == 0
    capsys.readouterr()
    result = json.loads((out / "summary.json").read_text())["configs"][0]["results"][0]
    assert result["status"] == "finished" and result["seed"] == 5 and result["steps"] == 4
    assert result["quant_gap_bpb"] == pytest.approx(result["roundtrip_bpb"] - result["prequant_bpb"])
    assert result["eval_time_s"] > 0 and result["artifact_bytes"] > 0
    log = Path(result["log"])
    assert log.parent == out / "logs" and log.name == "real_matrix_lr=0.02_s5.txt"

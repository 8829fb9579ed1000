"""bench/gpu_check.py's CPU dry run: the same runs and table as on a GPU, at tiny shapes, so that the first GPU hour
starts from a script that already works."""

import json
import subprocess
import sys

from conftest import ROOT


def test_the_dry_run_fills_every_row(tmp_path):
    # the offline corpus's sp1024 variant from its first 30 speeches, built here: a fresh clone has no data
    build = subprocess.run([sys.executable, str(ROOT / "data" / "build_sotu.py"), "--documents", "30", "--variant",
                            "sp1024", "--data-dir", str(tmp_path / "data")], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--dry-run", "--data-dir",
                          str(tmp_path / "data"), "--out", str(tmp_path / "check.json")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "check.json").read_text())
    assert report["bitwise"] is True, "two identical runs must agree bit for bit"
    assert report["eval"]["graphs_compiled_inside"] == 0, "nothing compiles inside a timed final pass"
    assert set(report["eval"]["passes_ms"]) == {"roundtrip", "sliding_window", "ttt"}
    assert report["eval"]["export_ms"] > 0 and report["eval"]["calibration_ms"] > 0, "export with GPTQ"
    assert report["record"]["ms_per_step_before_loop"] and report["record"]["ms_per_step_after_loop"]
    after_warmup, at_exit = report["compile_counts"]
    assert at_exit == after_warmup, "warmup compiles every graph that training and the final passes use"
    assert "| check |" in out.stdout.replace("  ", "") or "| check" in out.stdout
    assert len(report["rows"]) >= 11
    assert list(report["attention_ms"]) == ["sdpa (cpu)"] and report["attention_ms"]["sdpa (cpu)"] > 0

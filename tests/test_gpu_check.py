"""bench/gpu_check.py's CPU dry run: the same parts and rows as on a GPU, at tiny shapes, so that a GPU lease
starts from a script that already works; and its budget, which skips by name what would not fit."""

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.fixture(scope="module")
def sotu_data(tmp_path_factory):
    # the offline corpus's sp1024 variant from its first 30 speeches, built here: a fresh clone has no data
    data = tmp_path_factory.mktemp("gpu_check_data")
    build = subprocess.run([sys.executable, str(ROOT / "data" / "build_sotu.py"), "--documents", "30", "--variant",
                            "sp1024", "--data-dir", str(data)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    return data


def dry_run(data, tmp_path, *args):
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--dry-run", "--data-dir", str(data),
                          "--out", str(tmp_path / "check.json"), *args], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout, json.loads((tmp_path / "check.json").read_text())


def test_the_dry_run_measures_parity_the_record_shape_and_the_artifact(sotu_data, tmp_path):
    stdout, report = dry_run(sotu_data, tmp_path, "--parts", "parity,record,artifact", "--budget-s", "600")
    rows = report["rows"]
    assert not [row for row in rows if "failed" in row[0]], rows
    assert report["bitwise"] is True, "two identical launches must agree bit for bit"
    assert len(report["parity"]["ours"]) == len(report["parity"]["challenge"]) == 2, "two launches each"
    assert all(r["ms_per_step"] > 0 and "launch_to_first_timed_step_s" in r for r in report["parity"]["ours"])
    assert "profile" in report["parity"]["ours"][1], "the warm launch is profiled"
    assert report["graphs_compiled_inside"] == 0, "nothing compiles inside a timed final pass"
    assert set(report["record"]["passes_ms"]) == {"roundtrip", "ttt"}, "the record command's passes"
    assert report["record"]["ms_before"] and report["record"]["ms_after"]
    assert report["record"]["first_step_s"] > 0 and report["record"]["ttt_groups"] >= 1 and report["record"].get("peak_mib") is None
    assert report["artifact"]["ours_total"] > report["artifact"]["ours_bytes"] > 0
    # each row is printed the moment it is measured, stamped with the seconds since the start
    stamps = [float(s) for s in re.findall(r"^\[ *([\d.]+) s\]", stdout, flags=re.M)]
    assert len(stamps) == len(rows) >= 10 and stamps == sorted(stamps) and stamps[-1] > stamps[0] + 1
    assert [row[3] for row in rows] == stamps


def test_the_budget_skips_by_name_what_would_not_fit(sotu_data, tmp_path):
    stdout, report = dry_run(sotu_data, tmp_path, "--parts", "record_warm,attention", "--budget-s", "10")
    assert list(report["skipped"]) == ["record_warm"], report["skipped"]
    assert "would not fit" in report["skipped"]["record_warm"] and "[skipped] record_warm" in stdout
    assert [row[0].split(":")[0] for row in report["rows"]] == ["attention"]
    assert report["attention_ms"]["sdpa (cpu)"] > 0


def test_step_ops_names_what_ours_runs_beyond_the_reference(tmp_path):
    """bench/step_ops.py against a reference whose MLP skips its output projection: ours then runs one more matmul
    a layer, a kernel of its own that no reason covers, and the bench says so and fails."""
    source = (ROOT / "train_gpt.py").read_text()
    projection = "return self.proj(F.leaky_relu(self.fc(x), self.leaky_slope).square())"
    assert projection in source
    reference = tmp_path / "reference_train_gpt.py"
    reference.write_text(source.replace(projection, "return F.leaky_relu(self.fc(x), self.leaky_slope).square()[..., :x.size(-1)]"))
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "step_ops.py"), "--reference", str(reference),
                          "--seq-len", "32", "--num-layers", "2"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 1, out.stdout + out.stderr[-2000:]
    assert "ours runs more forward matmul, backward matmul ops" in out.stderr, out.stderr[-2000:]
    rows = re.findall(r"^\| (forward|backward) \| (ours|challenge) \| (\d+) \|", out.stdout, flags=re.M)
    matmuls = {(graph, script): int(n) for graph, script, n in rows}
    assert matmuls[("forward", "ours")] == matmuls[("forward", "challenge")] + 2, "one more a layer"

"""Validate a record folder and print every problem found, not only the first.

    python records/check_record.py records/track_cpu/2026-01-01_Baseline
    python records/check_record.py --deep records/track_cpu/2026-01-01_Baseline   # also re-scores the artifacts

Checks: the required files exist; submission.json has the challenge's fields and agrees with every log
it cites; bytes_code is the size of the folder's train_gpt.py, which is byte-identical to the source
embedded in each log; bytes_total and every run fit the track's artifact cap; every run trained and
evaluated within the track's time limits and its budget (tracks.json); copied model files match the
sha256 their logs recorded. --deep reloads each model file with the record's own train_gpt.py and
recomputes the round-trip val_bpb on the validation data (skipped, with a note, when the data or
the file is absent).
Exit status 0 when the record passes, 1 otherwise.
"""

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from runlog import LogError, find_artifact, load_tracks, parse_log, sha256_hex

REQUIRED_FILES = ("README.md", "submission.json", "train_gpt.py")
FIELD_TYPES = {  # the challenge's fields, then ours
    "author": str, "github_id": str, "name": str, "blurb": str, "date": str,
    "val_loss": float, "val_bpb": float, "bytes_total": int, "bytes_code": int,
    "track": str, "seeds": list, "results": list, "score_line": str,
    "hardware": str, "pytorch_version": str, "script_sha256": str,
}
RESULT_FIELDS = ("seed", "log", "val_loss", "val_bpb", "artifact_bytes", "model_bytes", "model_sha256",
                 "steps", "step_avg_ms", "train_time_ms")
FOLDER_NAME = re.compile(r"(\d{4}-\d{2}-\d{2})_([A-Za-z0-9][A-Za-z0-9_-]*)")
MEAN_TOLERANCE = 1e-8  # submission.json stores means rounded to the logs' 8 decimals


def check_run(run, track_name: str, track: dict) -> list[str]:
    """Problems with one parsed run log against a track's rules (also used by make_record)."""
    name, problems = run.path.name, []
    if not run.finished:
        return [f"{name}: no final_*_roundtrip_exact line; the run did not finish, rerun it to completion"]
    for what, value in (("Code size", run.code_bytes), ("Total submission size", run.total_bytes),
                        ("Serialized model", run.model_bytes), ("artifact", run.artifact_sha256)):
        if value is None:
            problems.append(f"{name}: no '{what}' line; the run was cut short before export, rerun it")
    if problems:
        return problems
    if run.code_bytes != len(run.source):
        problems.append(f"{name}: 'Code size: {run.code_bytes} bytes' but the embedded source is "
                        f"{len(run.source)} bytes; the log was edited")
    if run.total_bytes != run.code_bytes + run.model_bytes:
        problems.append(f"{name}: total {run.total_bytes} bytes != code {run.code_bytes} + model "
                        f"{run.model_bytes}; the log was edited")
    if run.artifact_bytes != run.model_bytes:
        problems.append(f"{name}: artifact file is {run.artifact_bytes} bytes but the serialized model "
                        f"is {run.model_bytes}; the log was edited")
    cap = track["artifact_cap_bytes"]
    if run.total_bytes > cap:
        problems.append(f"{name}: total submission size {run.total_bytes:,} bytes exceeds the {track_name} "
                        f"cap of {cap:,} bytes by {run.total_bytes - cap:,}; shrink the model or compress harder")
    limit_s = track.get("train_time_limit_s")
    # The wallclock cap is checked after each step, so a capped run ends part of a step past it;
    # the challenge accepted that and rejected runs a full second over.
    grace_ms = track.get("train_time_grace_ms", 0)
    if limit_s is not None and run.train_time_ms is not None and run.train_time_ms >= 1000 * limit_s + grace_ms:
        problems.append(f"{name}: train_time {run.train_time_ms:.0f}ms exceeds the {track_name} limit of "
                        f"{limit_s} s (+{grace_ms:.0f}ms for the last step); "
                        + ("make each step cheaper: the step cap is the budget, the time limit a ceiling"
                           if "max_steps" in track else f"set MAX_WALLCLOCK_SECONDS={limit_s}"))
    spent, reserved = (run.calibration.get(key, 0.0) for key in ("calibration_time_ms", "reserved_ms"))
    if run.calibration.get("calib") == "train" and spent > reserved:
        problems.append(f"{name}: GPTQ calibration read training data for {spent:.0f}ms after training, over the "
                        f"{reserved:.0f}ms reserved from the budget; raise GPTQ_RESERVE_SECONDS, or use GPTQ_CALIB=selfgen")
    eval_limit_s = track.get("eval_time_limit_s")
    if eval_limit_s is not None and run.eval_time_ms is not None and run.eval_time_ms > 1000 * eval_limit_s:
        problems.append(f"{name}: eval_time {run.eval_time_ms:.0f}ms of {run.score_name} exceeds the "
                        f"{track_name} evaluation limit of {eval_limit_s} s")
    if "hardware_regex" in track and not re.search(track["hardware_regex"], run.hardware):
        problems.append(f"{name}: hardware {run.hardware!r} is not what {track_name} requires "
                        f"(/{track['hardware_regex']}/); use track_non_record_16mb for other hardware")
    if "device" in track and run.layout.get("device") != track["device"]:
        problems.append(f"{name}: device {run.layout.get('device')!r}, but {track_name} runs on "
                        f"{track['device']!r}")
    hp = run.hyperparameters
    if "max_steps" in track:
        cap_steps = track["max_steps"]
        if run.iterations is None or run.iterations > cap_steps:
            problems.append(f"{name}: ITERATIONS={run.iterations} but {track_name} allows at most "
                            f"{cap_steps} steps; set ITERATIONS={cap_steps}")
        if run.last_step is not None and run.last_step > cap_steps:
            problems.append(f"{name}: the run took {run.last_step} steps, over the {track_name} cap of {cap_steps}")
        if run.stopping_early is not None:
            problems.append(f"{name}: stopped by the wallclock cap at step {run.last_step}; on {track_name} the step "
                            f"cap ends training, so the score does not depend on the machine's load: set "
                            f"MAX_WALLCLOCK_SECONDS=0")
    if "max_cpu_threads" in track:
        m = re.search(r"(\d+) torch threads per process x (\d+) processes", run.hardware)
        threads = int(m.group(1)) * int(m.group(2)) if m else None
        if threads is None or threads > track["max_cpu_threads"]:
            problems.append(f"{name}: hardware line {run.hardware!r} shows {threads or 'no readable'} threads; "
                            f"{track_name} runs on at most {track['max_cpu_threads']} (e.g. OMP_NUM_THREADS=1 "
                            f"torchrun --nproc_per_node=2, or python train_gpt.py on 2 cores)")
    if "train_batch_tokens" in track and hp.get("train_batch_tokens") != track["train_batch_tokens"]:
        problems.append(f"{name}: TRAIN_BATCH_TOKENS={hp.get('train_batch_tokens')} but {track_name} fixes "
                        f"it at {track['train_batch_tokens']}")
    if "datasets" in track:  # {dataset folder name: its tokenizer file name}, as data/build_sotu.py names them
        dataset, tokenizer = Path(str(hp.get("data_path"))).name, Path(str(hp.get("tokenizer_path"))).name
        if dataset not in track["datasets"]:
            problems.append(f"{name}: DATA_PATH={hp.get('data_path')!r}, but {track_name} trains and scores on one "
                            f"of {', '.join(track['datasets'])} (python data/build_sotu.py)")
        elif tokenizer != track["datasets"][dataset]:
            problems.append(f"{name}: TOKENIZER_PATH={hp.get('tokenizer_path')!r} does not go with {dataset}; "
                            f"use {track['datasets'][dataset]}")
    return problems


def check_submission_fields(sub: dict) -> list[str]:
    problems = []
    for key, kind in FIELD_TYPES.items():
        if key not in sub:
            problems.append(f"submission.json: missing field {key!r}")
        elif kind is float and isinstance(sub[key], (int, float)) and not isinstance(sub[key], bool):
            continue
        elif not isinstance(sub[key], kind) or isinstance(sub[key], bool):
            problems.append(f"submission.json: {key}={sub[key]!r} should be of type {kind.__name__}")
        elif kind is str and not sub[key].strip():
            problems.append(f"submission.json: {key} is empty; fill it in")
    for i, result in enumerate(sub.get("results", []) if isinstance(sub.get("results"), list) else []):
        missing = [k for k in RESULT_FIELDS if not isinstance(result, dict) or k not in result]
        if missing:
            problems.append(f"submission.json: results[{i}] lacks {', '.join(missing)}")
    return problems


def differs(claimed, actual, tolerance=0.0) -> bool:
    if actual is None or not isinstance(claimed, (int, float)):
        return claimed != actual
    return abs(claimed - actual) > tolerance


def check_folder(folder, tracks=None, deep=False, data_path=None, tokenizer_path=None,
                 deep_tolerance=1e-3, notes=None) -> list[str]:
    """Every problem with a record folder; informational lines (deep check results) go to `notes`."""
    folder = Path(folder)
    tracks = load_tracks() if tracks is None else tracks
    notes = [] if notes is None else notes
    if not folder.is_dir():
        return [f"{folder}: not a directory"]
    problems = [f"{folder / f}: missing" for f in REQUIRED_FILES if not (folder / f).is_file()]
    if not (folder / "submission.json").is_file():
        return problems
    try:
        sub = json.loads((folder / "submission.json").read_text())
    except json.JSONDecodeError as e:
        return problems + [f"submission.json: not valid JSON ({e})"]
    problems += check_submission_fields(sub)
    listed = sub.get("results") if isinstance(sub.get("results"), list) else []
    results = [r for r in listed if isinstance(r, dict) and all(k in r for k in RESULT_FIELDS)]

    track_name = sub.get("track")
    if track_name not in tracks:
        problems.append(f"submission.json: track {track_name!r} is not one of {', '.join(tracks)} (records/tracks.json)")
    elif folder.resolve().parent.name != track_name:
        problems.append(f"{folder}: lives in {folder.resolve().parent.name}/ but submission.json says track "
                        f"{track_name!r}; move the folder to records/{track_name}/")
    m = FOLDER_NAME.fullmatch(folder.resolve().name)
    if m is None:
        problems.append(f"{folder}: folder name should be YYYY-MM-DD_ShortName")
    elif m.group(1) != sub.get("date"):
        problems.append(f"submission.json: date {sub.get('date')!r} but the folder is dated {m.group(1)}")

    script = (folder / "train_gpt.py").read_bytes() if (folder / "train_gpt.py").is_file() else None
    if script is not None:
        if sub.get("bytes_code") != len(script):
            problems.append(f"submission.json: bytes_code={sub.get('bytes_code')} but train_gpt.py is "
                            f"{len(script)} bytes")
        if sub.get("script_sha256") != sha256_hex(script):
            problems.append("submission.json: script_sha256 does not match train_gpt.py")

    seeds = [r["seed"] for r in results]
    if sub.get("seeds") != seeds:
        problems.append(f"submission.json: seeds={sub.get('seeds')} but results list seeds {seeds}")
    if len(set(seeds)) != len(seeds):
        problems.append(f"submission.json: repeated seeds {seeds}; each run needs its own SEED")
    if not results:
        problems.append("submission.json: no per-seed results; a record cites at least one log")

    runs = []
    for result in results:
        log_path = folder / result["log"]
        if Path(result["log"]).name != result["log"] or not log_path.is_file():
            problems.append(f"submission.json: cites log {result['log']!r}, which is not a file in {folder}")
            continue
        try:
            run = parse_log(log_path)
        except LogError as e:
            problems.append(str(e))
            continue
        runs.append(run)
        problems += check_result(result, run)
        if track_name in tracks:
            problems += check_run(run, track_name, tracks[track_name])
        if script is not None and run.source != script:
            problems.append(f"{run.path.name}: its embedded source (sha256 {run.source_sha256[:12]}) differs from "
                            f"train_gpt.py (sha256 {sha256_hex(script)[:12]}); the folder's script is not what ran")
        model_file = folder / Path(run.artifact_path or "").name
        if run.artifact_path and model_file.is_file() and sha256_hex(model_file.read_bytes()) != run.artifact_sha256:
            problems.append(f"{model_file.name}: sha256 differs from the one {run.path.name} recorded; "
                            f"copy the model file the run wrote")

    if runs and len(runs) == len(results) and all(run.finished for run in runs):
        problems += check_aggregates(sub, runs)
    if deep and runs:
        problems += deep_check(folder, runs, data_path, tokenizer_path, deep_tolerance, notes)
    return problems


def check_result(result: dict, run) -> list[str]:
    """One per-seed entry of submission.json against the log it cites."""
    name, problems = run.path.name, []
    actual = {"seed": run.seed, "val_loss": run.val_loss, "val_bpb": run.val_bpb,
              "artifact_bytes": run.total_bytes, "model_bytes": run.model_bytes,
              "model_sha256": run.artifact_sha256, "steps": run.last_step,
              "step_avg_ms": run.step_avg_ms, "train_time_ms": run.train_time_ms}
    for key, value in actual.items():
        if differs(result[key], value):
            problems.append(f"submission.json: seed {result['seed']} claims {key}={result[key]!r} but "
                            f"{name} shows {value!r}")
    return problems


def check_aggregates(sub: dict, runs: list) -> list[str]:
    """The record-wide fields of submission.json against all of its logs."""
    problems = []
    for key in ("val_loss", "val_bpb"):
        mean = statistics.fmean(getattr(run, key) for run in runs)
        if differs(sub.get(key), mean, MEAN_TOLERANCE):
            problems.append(f"submission.json: {key}={sub.get(key)!r} but the mean over the cited logs is {mean:.8f}")
    largest = max(run.total_bytes or 0 for run in runs)
    if sub.get("bytes_total") != largest:
        problems.append(f"submission.json: bytes_total={sub.get('bytes_total')} but the largest run's total "
                        f"submission size is {largest}")
    for key, values in (("score_line", {r.score_name for r in runs}), ("hardware", {r.hardware for r in runs}),
                        ("pytorch_version", {r.pytorch_version for r in runs})):
        if values != {sub.get(key)}:
            problems.append(f"submission.json: {key}={sub.get(key)!r} but the logs show {sorted(map(str, values))}")
    return problems


def deep_check(folder, runs, data_path, tokenizer_path, tolerance, notes) -> list[str]:
    """Re-score each run's model file with the record's own script; missing inputs are notes, not problems."""
    from deep_eval import evaluate_artifact, DeepCheckUnavailable
    problems = []
    for run in runs:
        model_file = find_artifact(run, folder)
        if model_file is None:
            notes.append(f"deep check of {run.path.name} skipped: model file {run.artifact_path} not found "
                         f"(make the record with --copy-artifacts, or put it in the folder)")
            continue
        threads = re.search(r"(\d+) torch threads per process", run.hardware)
        # the round-trip line always; the sliding-window or test-time-training line too when it is the score
        checks = [("roundtrip", run.roundtrip_val_bpb, "round-trip")]
        for mode, what in (("sliding", "sliding-window"), ("ttt", "test-time-training")):
            if ("_ttt_" if mode == "ttt" else "sliding_window") in (run.score_name or ""):
                checks.append((mode, run.val_bpb, what))
        for mode, claimed, what in checks:
            try:
                _, val_bpb = evaluate_artifact(folder / "train_gpt.py", model_file, run.hyperparameters,
                                               run.layout, data_path, tokenizer_path, mode=mode,
                                               cpu_threads=int(threads.group(1)) if threads else None)
            except DeepCheckUnavailable as e:
                notes.append(f"deep check of {run.path.name} ({what}) skipped: {e}")
                continue
            notes.append(f"deep check of {run.path.name}: {what} val_bpb {val_bpb:.8f} recomputed, "
                         f"{claimed:.8f} claimed")
            if abs(val_bpb - claimed) > tolerance:
                problems.append(f"{run.path.name}: reloading {model_file.name} gives {what} val_bpb {val_bpb:.6f}, "
                                f"but the log claims {claimed:.6f} (tolerance {tolerance})")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="record folder(s) to check")
    parser.add_argument("--deep", action="store_true", help="reload each model file and recompute val_bpb")
    parser.add_argument("--data-path", help="shards folder for --deep (default: the run's DATA_PATH)")
    parser.add_argument("--tokenizer-path", help="tokenizer for --deep (default: the run's TOKENIZER_PATH)")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="allowed |recomputed - claimed| val_bpb")
    args = parser.parse_args(argv)
    failed = 0
    for folder in args.folders:
        notes = []
        problems = check_folder(folder, deep=args.deep, data_path=args.data_path,
                                tokenizer_path=args.tokenizer_path, deep_tolerance=args.tolerance, notes=notes)
        for note in notes:
            print(f"note: {note}")
        if problems:
            failed += 1
            print(f"FAIL {folder}: {len(problems)} problem{'s' * (len(problems) != 1)}")
            for problem in problems:
                print(f"  - {problem}")
        else:
            print(f"OK   {folder}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

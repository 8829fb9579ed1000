"""Validate a record folder and print every problem found, not only the first.

    python records/check_record.py records/track_cpu/2026-01-01_Baseline
    python records/check_record.py --deep records/track_cpu/2026-01-01_Baseline   # also re-scores the artifacts

Checks: the required files exist; submission.json has the challenge's fields (track spelled as the challenge
spells it, seed_results keyed by seed) and agrees with every log it cites, compliance included; bytes_code is the
size of the folder's train_gpt.py, which is the source embedded in each log, byte for byte, or (PACK_CODE=1) that
source's packing: re-packed with the logged script's own pack_source it gives the same bytes, and the program it
unpacks to is the logged source's, docstrings aside (AST dumps compared); bytes_total and every run fit the
track's artifact cap; every run trained and evaluated within the track's limits and its budget (tracks.json);
copied model files match the sha256 their logs recorded; requirements.txt, when present, lists what the run
imports. --deep reloads each model file with the record's own code and recomputes the round-trip val_bpb on the
validation data (skipped, with a note, when the data or the file is absent).
Exit status 0 when the record passes, 1 otherwise.
"""

import argparse
import ast
import json
import platform
import re
import statistics
import sys
from pathlib import Path

from runlog import (PACKED_HEAD, LogError, find_artifact, load_tracks, pack_logged_source, parse_log, sha256_hex,
                    track_by_challenge_name, unpack_code)

REQUIRED_FILES = ("README.md", "submission.json", "train_gpt.py")
NUMBER = (int, float)
FIELD_TYPES = {  # the challenge's fields, then ours
    "name": str, "author": str, "github_id": str, "date": str, "track": str, "blurb": str,
    "val_loss": NUMBER, "val_bpb": NUMBER, "val_loss_std": NUMBER, "val_bpb_std": NUMBER,
    "seeds": list, "seed_results": dict, "eval_time_s_mean": NUMBER, "bytes_total": int, "bytes_code": int,
    "compliance": dict, "hardware": str, "pytorch_version": str, "score_line": str, "script_sha256": str,
}
NULL_WITH_ONE_SEED = ("val_loss_std", "val_bpb_std")  # a sample std needs two seeds
SEED_FIELDS = ("log", "val_loss", "val_bpb", "artifact_bytes", "steps", "step_avg_ms", "eval_time_s", "train_time_s",
               "model_bytes", "model_sha256")
COMPLIANCE_KEYS = ("train_under_limit", "artifact_under_cap", "eval_under_limit", "score_first_ttt",
                   "calibration_inside_budget", "three_seeds")
FOLDER_NAME = re.compile(r"(\d{4}-\d{2}-\d{2})_([A-Za-z0-9][A-Za-z0-9_-]*)")
GITHUB_LOGIN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9]|-(?=[A-Za-z0-9])){0,38}")
TOLERANCE = 1e-8  # submission.json rounds to the logs' 8 decimals
UNATTRIBUTED = "(unattributed)"  # no GitHub login can be spelled so: it names nobody
# Made before make_record.py took the author from the user: they said "Parameter Golf maintainers (@maintainers)",
# an identity nobody holds, and the repository's git history names only a placeholder committer. The placeholder
# above is accepted here and nowhere else.
UNATTRIBUTED_FOLDERS = {"track_cpu/2026-11-22_CpuBaseline", "track_cpu/2026-11-22_Int6Qat7LayersSliding",
                        "track_cpu/2026-11-23_Sp4096Stack4LayersTTT"}
COMPRESSOR_PACKAGES = {"zstd": "zstandard", "brotli": "brotli", "zpaq": "zpaq"}  # COMPRESSOR -> the package it imports
ALWAYS_REQUIRED = ("numpy", "sentencepiece")  # train_gpt.py imports numpy, and sentencepiece for SentencePiece models


def seconds(ms) -> float | None:
    return None if ms is None else round(ms / 1000, 3)


def rounded(x, digits=8):
    return None if x is None else round(x, digits)


def eval_time_for_rule(run, track: dict) -> tuple[float | None, str]:
    """(milliseconds, what they are) that the track's evaluation limit applies to."""
    if track.get("eval_time_rule") == "scoring_pass":
        return run.eval_time_ms, f"eval_time of the scoring pass {run.score_name}"
    return run.eval_total_ms, ("total eval_time (final_eval_total)" if run.eval_total is not None
                               else "total eval_time (the sum of the final passes)")


def run_compliance(run, track: dict) -> dict:
    """The challenge's compliance statements for one run, from its log alone."""
    limit_s, grace_ms = track.get("train_time_limit_s"), track.get("train_time_grace_ms", 0)
    eval_limit_s = track.get("eval_time_limit_s")
    eval_ms, _ = eval_time_for_rule(run, track)
    spent, reserved = (run.calibration.get(key, 0.0) for key in ("calibration_time_ms", "reserved_ms"))
    return {
        # the wallclock cap is checked after each step: a capped run ends part of a step past it
        "train_under_limit": limit_s is None or (run.train_time_ms is not None
                                                 and run.train_time_ms < 1000 * limit_s + grace_ms),
        "artifact_under_cap": run.total_bytes is not None and run.total_bytes <= track["artifact_cap_bytes"],
        "eval_under_limit": eval_limit_s is None or (eval_ms is not None and eval_ms <= 1000 * eval_limit_s),
        "score_first_ttt": True,  # train_gpt.py's only TTT scores each chunk before training on it (or TTT is off)
        "calibration_inside_budget": run.calibration.get("calib") != "train" or spent <= reserved,
    }


def compliance_for(runs, track: dict) -> dict:
    per_run = [run_compliance(run, track) for run in runs]
    return {**{key: all(c[key] for c in per_run) for key in per_run[0]}, "three_seeds": len(runs) >= 3}


def seed_result(run) -> dict:
    """One seed's entry of seed_results, from its log."""
    return {"log": run.path.name, "val_loss": run.val_loss, "val_bpb": run.val_bpb, "artifact_bytes": run.total_bytes,
            "steps": run.last_step, "step_avg_ms": run.step_avg_ms, "eval_time_s": seconds(run.eval_total_ms),
            "train_time_s": seconds(run.train_time_ms), "model_bytes": run.model_bytes,
            "model_sha256": run.artifact_sha256}


def record_summary(runs, track: dict) -> dict:
    """The record-wide numbers of submission.json, from all of its logs."""
    def std(key):
        return rounded(statistics.stdev(getattr(r, key) for r in runs)) if len(runs) > 1 else None
    return {
        "val_loss": rounded(statistics.fmean(r.val_loss for r in runs)),
        "val_bpb": rounded(statistics.fmean(r.val_bpb for r in runs)),
        "val_loss_std": std("val_loss"), "val_bpb_std": std("val_bpb"),
        "eval_time_s_mean": round(statistics.fmean(r.eval_total_ms for r in runs) / 1000, 3),
        "bytes_total": max(r.total_bytes for r in runs),
        "compliance": compliance_for(runs, track),
        "score_line": runs[0].score_name, "hardware": runs[0].hardware, "pytorch_version": runs[0].pytorch_version,
    }


def required_packages(runs) -> list[str]:
    """What the runs import beyond torch and the standard library."""
    extra = {COMPRESSOR_PACKAGES.get(run.hyperparameters.get("compressor")) for run in runs} - {None}
    return [*ALWAYS_REQUIRED, *sorted(extra)]


def check_run(run, track_name: str, track: dict) -> list[str]:
    """Problems with one parsed run log against a track's rules (also used by make_record)."""
    name, problems = run.path.name, []
    if run.errors:
        first = run.error.splitlines()[0]
        return [f"{name}: the run failed (error: {first[:200]}); a failed run is no record: fix the cause and rerun"]
    if not run.finished:
        return [f"{name}: no final_*_roundtrip_exact line; the run did not finish, rerun it to completion"]
    for what, value in (("Code size", run.code_bytes), ("Total submission size", run.total_bytes),
                        ("Serialized model", run.model_bytes), ("artifact", run.artifact_sha256)):
        if value is None:
            problems.append(f"{name}: no '{what}' line; the run was cut short before export, rerun it")
    if problems:
        return problems
    if run.code_packed_from is not None:
        if run.code_packed_from != len(run.source):
            problems.append(f"{name}: 'Code size: ... (packed from {run.code_packed_from})' but the embedded source is "
                            f"{len(run.source)} bytes; the log was edited")
    elif run.code_bytes != len(run.source):
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
    compliance = run_compliance(run, track)
    limit_s, grace_ms = track.get("train_time_limit_s"), track.get("train_time_grace_ms", 0)
    if not compliance["train_under_limit"]:
        problems.append(f"{name}: train_time {run.train_time_ms:.0f}ms exceeds the {track_name} limit of "
                        f"{limit_s} s (+{grace_ms:.0f}ms for the last step); "
                        + ("make each step cheaper: the step cap is the budget, the time limit a ceiling"
                           if "max_steps" in track else f"set MAX_WALLCLOCK_SECONDS={limit_s}"))
    if not compliance["calibration_inside_budget"]:
        spent, reserved = run.calibration.get("calibration_time_ms", 0.0), run.calibration.get("reserved_ms", 0.0)
        problems.append(f"{name}: GPTQ calibration read training data for {spent:.0f}ms after training, over the "
                        f"{reserved:.0f}ms reserved from the budget; raise GPTQ_RESERVE_SECONDS")
    eval_ms, what = eval_time_for_rule(run, track)
    if not compliance["eval_under_limit"]:
        problems.append(f"{name}: {what} {eval_ms:.0f}ms exceeds the {track_name} evaluation limit of "
                        f"{track['eval_time_limit_s']} s")
    problems += check_eval_total(run)
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


def check_eval_total(run) -> list[str]:
    """final_eval_total must add up the final passes the log shows, every one of them (1 ms of rounding each)."""
    if run.eval_total is None:
        return []
    passes, lines = run.eval_total["passes"], run.pass_times_ms
    by_pass = {name: ms for line, ms in lines.items() for name in passes if line.endswith("_" + name)}
    problems = []
    if set(by_pass) != set(passes) or len(lines) != len(passes):
        problems.append(f"{run.path.name}: final_eval_total lists the passes {sorted(passes)} but the log's final "
                        f"lines are {sorted(lines)}; the log was edited")
    elif any(abs(passes[name] - by_pass[name]) > 1 for name in passes) or \
            abs(run.eval_total["eval_time_ms"] - sum(passes.values())) > len(passes):
        problems.append(f"{run.path.name}: final_eval_total eval_time:{run.eval_total['eval_time_ms']:.0f}ms does not "
                        f"add up its passes {passes} and the final lines {lines}; the log was edited")
    return problems


def program_dump(source: bytes) -> str:
    """The program a source runs, as an AST dump without module, class and function docstrings."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and ast.get_docstring(node) is not None:
            node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree)


def check_packed(script: bytes, run, notes: list) -> list[str]:
    """A packed train_gpt.py (PACK_CODE=1) must be what the logged script's own pack_source makes of the logged
    source, and must run the same program."""
    name, problems = run.path.name, []
    if run.code_packed_from is None:
        return [f"{name}: train_gpt.py is packed, but the run counted its readable source (no PACK_CODE=1); put "
                f"the logged source in the folder (make_record.py does)"]
    inner = unpack_code(script)
    if inner is None:
        problems.append("train_gpt.py starts as a packed file but is not exactly its two lines (base85 of lzma, "
                        "nothing before or after); re-make it with make_record.py")
    else:
        try:
            same_program = program_dump(inner) == program_dump(run.source)
        except SyntaxError as e:
            same_program = False
            notes.append(f"{name}: the packed or the logged program does not parse here: {e}")
        if not same_program:
            problems.append(f"{name}: the program packed in train_gpt.py is not the logged source (AST dumps differ, "
                            f"docstrings aside); the folder's script is not what ran")
    try:
        repacked = pack_logged_source(run.source, f"<{name}: train_gpt.py>")
    except Exception as e:  # the logged script's own import or pack_source failed here
        return problems + [f"{name}: cannot re-pack the logged source with its own pack_source here "
                           f"({type(e).__name__}: {e}); install what it imports (requirements.txt) and check again"]
    if repacked != script:
        logged_python = run.versions.get("python", "")
        if logged_python.rsplit(".", 1)[0] == platform.python_version().rsplit(".", 1)[0]:
            problems.append(f"{name}: re-packing the logged source with its own pack_source gives {len(repacked)} "
                            f"bytes that differ from train_gpt.py ({len(script)} bytes); the folder's script is not "
                            f"the logged source's packing")
        else:  # ast.unparse's output differs across Python versions; the AST check above still holds
            notes.append(f"{name}: re-packed here with Python {platform.python_version()}, not the run's {logged_python}: "
                         f"the bytes differ ({len(repacked)} vs {len(script)}), as ast.unparse's output may across "
                         f"versions; the program is checked by its AST")
    if len(script) != run.code_bytes:
        problems.append(f"{name}: the log counted {run.code_bytes} bytes of packed code but train_gpt.py is "
                        f"{len(script)} bytes")
    return problems


def check_submission_fields(sub: dict) -> list[str]:
    problems = []
    n_seeds = len(sub["seeds"]) if isinstance(sub.get("seeds"), list) else 0
    for key, kind in FIELD_TYPES.items():
        value = sub.get(key)
        if key not in sub:
            problems.append(f"submission.json: missing field {key!r}")
        elif value is None and key in NULL_WITH_ONE_SEED and n_seeds < 2:
            continue
        elif not isinstance(value, kind) or isinstance(value, bool):
            kinds = "number" if kind is NUMBER else kind.__name__
            problems.append(f"submission.json: {key}={value!r} should be of type {kinds}")
        elif kind is str and not value.strip():
            problems.append(f"submission.json: {key} is empty; fill it in")
    return problems


def check_identity(sub: dict, folder_key: str) -> list[str]:
    """Authors are people: the historical placeholder only where it is documented, and real GitHub logins."""
    problems = []
    for key in ("author", "github_id"):
        if sub.get(key) == UNATTRIBUTED and folder_key not in UNATTRIBUTED_FOLDERS:
            problems.append(f"submission.json: {key} {UNATTRIBUTED!r} is kept only for the records made before the "
                            f"author came from the user; name the author (make_record.py --author, --github-id)")
    github_id = sub.get("github_id")
    if isinstance(github_id, str) and github_id and github_id != UNATTRIBUTED and not GITHUB_LOGIN.fullmatch(github_id):
        problems.append(f"submission.json: github_id {github_id!r} is not a GitHub login (letters, digits, single "
                        f"hyphens, at most 39 characters, no '@')")
    return problems


def differs(claimed, actual, tolerance=0.0) -> bool:
    if actual is None or isinstance(claimed, bool) or not isinstance(claimed, (int, float)) \
            or not isinstance(actual, (int, float)):
        return claimed != actual
    return abs(claimed - actual) > tolerance


def resolve_track(sub: dict, folder: Path, tracks: dict) -> tuple[str | None, list[str]]:
    """Our track key for submission.json's `track` (the challenge's spelling), checked against the folder's place."""
    spelled = sub.get("track")
    track_name = track_by_challenge_name(tracks, spelled)
    if track_name is None:
        if isinstance(spelled, str) and spelled in tracks:
            return None, [f"submission.json: track {spelled!r} is our folder's name; spell it as the challenge does: "
                          f"{tracks[spelled]['challenge_name']!r}"]
        known = ", ".join(repr(t["challenge_name"]) for t in tracks.values())
        return None, [f"submission.json: track {spelled!r} is not one of {known} (records/tracks.json)"]
    if folder.resolve().parent.name != track_name:
        return track_name, [f"{folder}: lives in {folder.resolve().parent.name}/ but submission.json says track "
                            f"{spelled!r}; move the folder to records/{track_name}/"]
    return track_name, []


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
    track_name, found = resolve_track(sub, folder, tracks)
    problems += found
    m = FOLDER_NAME.fullmatch(folder.resolve().name)
    if m is None:
        problems.append(f"{folder}: folder name should be YYYY-MM-DD_ShortName")
    elif m.group(1) != sub.get("date"):
        problems.append(f"submission.json: date {sub.get('date')!r} but the folder is dated {m.group(1)}")
    problems += check_identity(sub, f"{folder.resolve().parent.name}/{folder.resolve().name}")

    script = (folder / "train_gpt.py").read_bytes() if (folder / "train_gpt.py").is_file() else None
    if script is not None:
        if sub.get("bytes_code") != len(script):
            problems.append(f"submission.json: bytes_code={sub.get('bytes_code')} but train_gpt.py is "
                            f"{len(script)} bytes")
        if sub.get("script_sha256") != sha256_hex(script):
            problems.append("submission.json: script_sha256 does not match train_gpt.py")

    seeds = sub.get("seeds") if isinstance(sub.get("seeds"), list) else []
    seed_results = sub.get("seed_results") if isinstance(sub.get("seed_results"), dict) else {}
    if len(set(map(str, seeds))) != len(seeds):
        problems.append(f"submission.json: repeated seeds {seeds}; each run needs its own SEED")
    if set(seed_results) != {str(s) for s in seeds}:
        problems.append(f"submission.json: seed_results is keyed {sorted(seed_results)} but seeds are {seeds}; "
                        f"one entry per seed, keyed by the seed as a string")
    if not seeds:
        problems.append("submission.json: no seeds; a record cites at least one log")

    runs, checked_sources = [], {}
    for seed in seeds:
        entry = seed_results.get(str(seed))
        if not isinstance(entry, dict):
            continue
        missing = [k for k in SEED_FIELDS if k not in entry]
        if missing:
            problems.append(f"submission.json: seed_results[{str(seed)!r}] lacks {', '.join(missing)}")
            continue
        log_path = folder / str(entry["log"])
        if Path(str(entry["log"])).name != entry["log"] or not log_path.is_file():
            problems.append(f"submission.json: seed {seed} cites log {entry['log']!r}, which is not a file in {folder}")
            continue
        try:
            run = parse_log(log_path)
        except LogError as e:
            problems.append(str(e))
            continue
        runs.append(run)
        problems += check_seed_entry(seed, entry, run)
        if track_name is not None:
            problems += check_run(run, track_name, tracks[track_name])
        if script is not None and script.startswith(PACKED_HEAD):
            if run.source_sha256 not in checked_sources:  # the same source packs the same way for every seed
                checked_sources[run.source_sha256] = check_packed(script, run, notes)
                problems += checked_sources[run.source_sha256]
        elif script is not None and run.source != script:
            problems.append(f"{run.path.name}: its embedded source (sha256 {run.source_sha256[:12]}) differs from "
                            f"train_gpt.py (sha256 {sha256_hex(script)[:12]}); the folder's script is not what ran")
        elif script is not None and run.code_packed_from is not None:
            problems.append(f"{run.path.name}: the run counted its code packed (PACK_CODE=1), so the folder's "
                            f"train_gpt.py must be that packed file; re-make the record with make_record.py")
        model_file = folder / Path(run.artifact_path or "").name
        if run.artifact_path and model_file.is_file() and sha256_hex(model_file.read_bytes()) != run.artifact_sha256:
            problems.append(f"{model_file.name}: sha256 differs from the one {run.path.name} recorded; "
                            f"copy the model file the run wrote")

    if runs and len(runs) == len(seeds) and all(run.finished for run in runs) and track_name is not None:
        problems += check_aggregates(sub, runs, tracks[track_name])
        problems += check_requirements(folder, runs)
    if deep and runs:
        problems += deep_check(folder, runs, data_path, tokenizer_path, deep_tolerance, notes)
    return problems


def check_seed_entry(seed, entry: dict, run) -> list[str]:
    """One seed's entry of seed_results against the log it cites."""
    problems = []
    if run.seed != seed:
        problems.append(f"submission.json: seed_results[{str(seed)!r}] cites {run.path.name}, which ran SEED={run.seed}")
    for key, value in seed_result(run).items():
        if differs(entry[key], value, TOLERANCE):
            problems.append(f"submission.json: seed {seed} claims {key}={entry[key]!r} but {run.path.name} shows {value!r}")
    return problems


def check_aggregates(sub: dict, runs: list, track: dict) -> list[str]:
    """The record-wide fields of submission.json against all of its logs."""
    problems = []
    for key, actual in record_summary(runs, track).items():
        claimed = sub.get(key)
        if key == "compliance":
            if claimed != actual:
                problems.append(f"submission.json: compliance={claimed!r} but the logs show {actual!r}")
        elif key in ("score_line", "hardware", "pytorch_version"):
            values = {getattr(r, {"score_line": "score_name"}.get(key, key)) for r in runs}
            if values != {claimed}:
                problems.append(f"submission.json: {key}={claimed!r} but the logs show {sorted(map(str, values))}")
        elif differs(claimed, actual, TOLERANCE):
            what = {"val_loss": "the mean", "val_bpb": "the mean", "val_loss_std": "the sample std",
                    "val_bpb_std": "the sample std", "eval_time_s_mean": "the mean total eval time",
                    "bytes_total": "the largest run's total submission size"}[key]
            problems.append(f"submission.json: {key}={claimed!r} but {what} over the cited logs is {actual!r}")
    return problems


def check_requirements(folder: Path, runs) -> list[str]:
    """requirements.txt, when the folder has one, names every package the runs import beyond torch."""
    path = folder / "requirements.txt"
    if not path.is_file():
        return []
    listed = {re.split(r"[<>=!~\[; ]", line.strip(), maxsplit=1)[0].lower()
              for line in path.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")}
    missing = [p for p in required_packages(runs) if p not in listed]
    return [f"requirements.txt: lacks {', '.join(missing)}, which the runs import"] if missing else []


def deep_check(folder, runs, data_path, tokenizer_path, tolerance, notes) -> list[str]:
    """Re-score each run's model file with the record's own code; missing inputs are notes, not problems.
    A packed train_gpt.py is scored through the logged source it was proven to pack."""
    from deep_eval import DeepCheckUnavailable, evaluate_artifact
    problems = []
    script = (folder / "train_gpt.py").read_bytes()
    for run in runs:
        model_file = find_artifact(run, folder)
        if model_file is None:
            notes.append(f"deep check of {run.path.name} skipped: model file {run.artifact_path} not found "
                         f"(make the record with --copy-artifacts, or put it in the folder)")
            continue
        code = (run.source, f"<{run.path.name}: train_gpt.py>") if script.startswith(PACKED_HEAD) else \
            (script, str(folder / "train_gpt.py"))
        threads = re.search(r"(\d+) torch threads per process", run.hardware)
        # the round-trip line always; the sliding-window or test-time-training line too when it is the score
        checks = [("roundtrip", run.roundtrip_val_bpb, "round-trip")]
        for mode, what in (("sliding", "sliding-window"), ("ttt", "test-time-training")):
            if ("_ttt_" if mode == "ttt" else "sliding_window") in (run.score_name or ""):
                checks.append((mode, run.val_bpb, what))
        for mode, claimed, what in checks:
            try:
                _, val_bpb = evaluate_artifact(code, model_file, run.hyperparameters, run.layout, data_path,
                                               tokenizer_path, mode=mode,
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

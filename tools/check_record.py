"""Check a record folder, ours or the challenge's, and print every finding, not only the first.

    python tools/check_record.py records/track_cpu/2026-01-01_Baseline
    python tools/check_record.py --deep records/track_cpu/2026-01-01_Baseline  # re-score too
    python tools/check_record.py ../parameter-golf/records/track_10min_16mb/*/

A folder is ours when its logs embed train_gpt.py's source (our header) or its submission.json
has our fields (score_line, script_sha256); any other folder is checked as the challenge's.
Findings are violations (the exit status is 1 if any folder has one) or warnings.

Ours (made by make_record.py): the required files exist; submission.json has the challenge's
fields (track spelled as the challenge spells it, seed_results keyed by seed) and ours, and
agrees with every log it cites, compliance included; bytes_code is the size of the folder's
train_gpt.py, which is the source embedded in each log, byte for byte, or (PACK_CODE=1) that
source's packing: re-packed with the logged script's own pack_source it gives the same bytes,
and the program it unpacks to is the logged source's, docstrings aside (AST dumps compared);
bytes_total and every run fit the track's artifact cap; every run trained and evaluated
within the track's limits and its budget (tracks.json), with the audit's fingerprints (below); copied model files match the sha256
their logs recorded; requirements.txt, when present, lists what the run imports. The logged
source is what its log's `build:` line names: a core that this repository's history holds
(or the working tree's own; a log from before that line is taken as a core, and a core
missing from the history is then only a note), or a build of the technique stack, which
tools/build_trainer.py makes again from the commit the line names and which must match byte
for byte (a build from uncommitted files, or from a commit this repository lacks, is a
violation); submission.json's build, when present, is the logs'. --deep
reloads each model file with the record's own code and recomputes the round-trip val_bpb on
the validation data (skipped, with a note, when the data or the file is absent). Every
finding is a violation.

The challenge's: what the challenge requires, from what the folder holds. Violations: no
README.md, submission.json, train_gpt.py (nor a script under another name) or train log; a
submission.json that is not JSON or has no author, github_id or val_bpb (the challenge asks for
"your name, GitHub ID, val_bpb"); a log whose artifact is over 16,000,000 bytes, whose training
ran over the track's limit (plus 1 s for the last step) or whose evaluation took over 600 s; a
log that counted its code as the script itself (`Code size: N bytes`) and N is not the size of
the folder's train_gpt.py: the folder's script is not the one that ran; on a dataset the track
fingerprints (tracks.json), the audit's fingerprints (the challenge's PR #2146): no more training
shards than the dataset has, the whole validation split (cut at the scoring length) scored, and a run with the n-gram
tilt logging gate counts has none from a channel that reads the scored token. Warnings: naming
differences (submission_x.json, a script not named train_gpt.py, mean_val_bpb for val_bpb, a
track spelled otherwise, a date that is no date; an ISO timestamp is one), fewer than 3 seeds
on the record track, seeds claimed without a log, submission.json values that disagree with
the logs (each claim within one unit of its last digit; the top-level ones as the mean of the
seeds or one seed's), fewer training shards than the fingerprinted dataset has, a tilt that logs no
gate counts, and a log that counted a compressed copy of its code
(`Code size (compressed)`) while its source (`Code size (uncompressed)`) is not the size of
train_gpt.py: the compressed size cannot be recomputed here, so the folder's script was edited
after the runs, but whether that moved the artifact over the cap is unknown.
"""

import argparse
import ast
import json
import platform
import re
import statistics
import sys
from datetime import date, datetime
from pathlib import Path

from build_trainer import (ROOT, StackError, blob_id, committed_core, full_commit, parse_label,
                           rebuild, rebuild_args)
from packing import PACKED_HEAD, without_docstrings
from runlog import (LogError, distinct_runs, find_artifact, is_our_log,
                    load_tracks, log_paths, matching_run, named_seed, pack_logged_source,
                    parse_log, per_seed_results, read_logs, score_kind, seed_label, sha256_hex,
                    submission_path, track_by_challenge_name, unpack_code)

REQUIRED_FILES = ("README.md", "submission.json", "train_gpt.py")
NUMBER = (int, float)
FIELD_TYPES = {  # the challenge's fields, then ours
    "name": str, "author": str, "github_id": str, "date": str, "track": str, "blurb": str,
    "val_loss": NUMBER, "val_bpb": NUMBER, "val_loss_std": NUMBER, "val_bpb_std": NUMBER,
    "seeds": list, "seed_results": dict, "eval_time_s_mean": NUMBER, "bytes_total": int,
    "bytes_code": int, "compliance": dict, "hardware": str, "pytorch_version": str,
    "score_line": str, "script_sha256": str,
}
OUR_FIELDS = ("score_line", "script_sha256")
NULL_WITH_ONE_SEED = ("val_loss_std", "val_bpb_std")  # a sample std needs two seeds
SEED_FIELDS = ("log", "val_loss", "val_bpb", "artifact_bytes", "steps", "step_avg_ms",
               "eval_time_s", "train_time_s", "model_bytes", "model_sha256")
FOLDER_NAME = re.compile(r"(\d{4}-\d{2}-\d{2})_([A-Za-z0-9][A-Za-z0-9_-]*)")
GITHUB_LOGIN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9]|-(?=[A-Za-z0-9])){0,38}")
TOLERANCE = 1e-8  # submission.json rounds to the logs' 8 decimals
UNATTRIBUTED = "(unattributed)"  # no GitHub login can be spelled so: it names nobody
# Made before make_record.py took the author from the user: they said "Parameter Golf
# maintainers (@maintainers)", an identity nobody holds, and the repository's git history
# names only a placeholder committer. The placeholder is accepted here and nowhere else.
UNATTRIBUTED_FOLDERS = {"track_cpu/2026-11-22_CpuBaseline",
                        "track_cpu/2026-11-22_Int6Qat7LayersSliding",
                        "track_cpu/2026-11-23_Sp4096Stack4LayersTTT",
                        # made by a development session, which holds no GitHub login either
                        "track_cpu/2026-11-26_LoraTTTLanesSkipGates"}
# COMPRESSOR -> the package it imports
COMPRESSOR_PACKAGES = {"zstd": "zstandard", "brotli": "brotli", "zpaq": "zpaq"}
# train_gpt.py imports numpy, and sentencepiece for SentencePiece models
ALWAYS_REQUIRED = ("numpy", "sentencepiece")
# the field's other names for a record's score
SCORE_ALIASES = ("mean_val_bpb", "val_bpb_mean", "mean_bpb")
RECORD_SEEDS = 3  # "usually over 3 seeds"


def seconds(ms) -> float | None:
    return None if ms is None else round(ms / 1000, 3)


def rounded(x, digits=8):
    return None if x is None else round(x, digits)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("s" if n != 1 else "")


# ---- OUR RECORDS ----

def eval_time_for_rule(run, track: dict) -> tuple[float | None, str]:
    """(milliseconds, what they are) that the track's evaluation limit applies to."""
    if track.get("eval_time_rule") == "scoring_pass":
        return run.eval_time_ms, f"eval_time of the scoring pass {run.score_name}"
    if run.eval_total is not None:
        return run.eval_total_ms, "total eval_time (final_eval_total)"
    if run.total_eval_ms is not None:
        return run.eval_total_ms, "total eval_time (total_eval_time)"
    return run.eval_total_ms, "total eval_time (the sum of the final passes)"


def train_under_limit(run, track: dict) -> bool:
    # the wallclock cap is checked after each step: a capped run ends part of a step past it
    limit_s = track.get("train_time_limit_s")
    if limit_s is None:
        return True
    limit_ms = 1000 * limit_s + track.get("train_time_grace_ms", 0)
    return run.train_time_ms is not None and run.train_time_ms < limit_ms


def run_compliance(run, track: dict) -> dict:
    """The challenge's compliance statements for one run, from its log alone."""
    eval_limit_s = track.get("eval_time_limit_s")
    eval_ms, _ = eval_time_for_rule(run, track)
    spent = run.calibration.get("calibration_time_ms", 0.0)
    reserved = run.calibration.get("reserved_ms", 0.0)
    cap = track["artifact_cap_bytes"]
    eval_ok = eval_limit_s is None or (eval_ms is not None and eval_ms <= 1000 * eval_limit_s)
    return {
        "train_under_limit": train_under_limit(run, track),
        "artifact_under_cap": run.total_bytes is not None and run.total_bytes <= cap,
        "eval_under_limit": eval_ok,
        # train_gpt.py's only TTT scores each chunk before training on it (or TTT is off)
        "score_first_ttt": True,
        "calibration_inside_budget": run.calibration.get("calib") != "train" or spent <= reserved,
    }


def compliance_for(runs, track: dict) -> dict:
    per_run = [run_compliance(run, track) for run in runs]
    together = {key: all(c[key] for c in per_run) for key in per_run[0]}
    return {**together, "three_seeds": len(runs) >= 3}


def seed_result(run) -> dict:
    """One seed's entry of seed_results, from its log."""
    return {"log": run.path.name, "val_loss": run.val_loss, "val_bpb": run.val_bpb,
            "artifact_bytes": run.total_bytes, "steps": run.last_step,
            "step_avg_ms": run.step_avg_ms, "eval_time_s": seconds(run.eval_total_ms),
            "train_time_s": seconds(run.train_time_ms), "model_bytes": run.model_bytes,
            "model_sha256": run.artifact_sha256}


def record_summary(runs, track: dict) -> dict:
    """The record-wide numbers of submission.json, from all of its logs."""
    def std(key):
        if len(runs) < 2:
            return None
        return rounded(statistics.stdev(getattr(r, key) for r in runs))
    eval_s = statistics.fmean(r.eval_total_ms for r in runs) / 1000
    return {
        "val_loss": rounded(statistics.fmean(r.val_loss for r in runs)),
        "val_bpb": rounded(statistics.fmean(r.val_bpb for r in runs)),
        "val_loss_std": std("val_loss"), "val_bpb_std": std("val_bpb"),
        "eval_time_s_mean": round(eval_s, 3),
        "bytes_total": max(r.total_bytes for r in runs),
        "compliance": compliance_for(runs, track),
        "score_line": runs[0].score_name, "hardware": runs[0].hardware,
        "pytorch_version": runs[0].pytorch_version,
    }


def required_packages(runs) -> list[str]:
    """What the runs import beyond torch and the standard library."""
    compressors = {run.setting("compressor") for run in runs}
    extra = {COMPRESSOR_PACKAGES.get(c) for c in compressors} - {None}
    return [*ALWAYS_REQUIRED, *sorted(extra)]


def export_problems(run) -> list[str]:
    """A finished run of ours logged its export in full, consistently."""
    name = run.path.name
    problems = []
    needed = (("Code size", run.code_bytes), ("Total submission size", run.total_bytes),
              ("Serialized model", run.model_bytes), ("artifact", run.artifact_sha256))
    for what, value in needed:
        if value is None:
            problems.append(f"{name}: no '{what}' line; the run was cut short before export, "
                            f"rerun it")
    if problems:
        return problems
    if run.code_packed_from is not None:
        if run.code_packed_from != len(run.source):
            problems.append(f"{name}: 'Code size: ... (packed from {run.code_packed_from})' "
                            f"but the embedded source is {len(run.source)} bytes; "
                            f"the log was edited")
    elif run.code_bytes != len(run.source):
        problems.append(f"{name}: 'Code size: {run.code_bytes} bytes' but the embedded source "
                        f"is {len(run.source)} bytes; the log was edited")
    if run.total_bytes != run.code_bytes + run.model_bytes:
        problems.append(f"{name}: total {run.total_bytes} bytes != code {run.code_bytes} + "
                        f"model {run.model_bytes}; the log was edited")
    if run.artifact_bytes != run.model_bytes:
        problems.append(f"{name}: artifact file is {run.artifact_bytes} bytes but the "
                        f"serialized model is {run.model_bytes}; the log was edited")
    return problems


def check_run(run, track_name: str, track: dict) -> list[str]:
    """Problems with one of our parsed run logs against a track's rules (make_record too)."""
    name = run.path.name
    if run.errors:
        first = run.error.splitlines()[0]
        return [f"{name}: the run failed (error: {first[:200]}); a failed run is no record: "
                f"fix the cause and rerun"]
    if not run.finished:
        return [f"{name}: no final_*_roundtrip_exact line; the run did not finish, rerun it "
                f"to completion"]
    problems = export_problems(run)
    if problems:
        return problems
    cap = track["artifact_cap_bytes"]
    if run.total_bytes > cap:
        problems.append(f"{name}: total submission size {run.total_bytes:,} bytes exceeds the "
                        f"{track_name} cap of {cap:,} bytes by {run.total_bytes - cap:,}; "
                        f"shrink the model or compress harder")
    problems += limit_problems(run, track_name, track)
    problems += check_eval_total(run)
    problems += budget_problems(run, track_name, track)
    return problems


def limit_problems(run, track_name: str, track: dict) -> list[str]:
    """Training, calibration and evaluation time, against the track's limits."""
    name = run.path.name
    problems = []
    compliance = run_compliance(run, track)
    limit_s = track.get("train_time_limit_s")
    grace_ms = track.get("train_time_grace_ms", 0)
    if not compliance["train_under_limit"]:
        fix = f"set MAX_WALLCLOCK_SECONDS={limit_s}"
        if "max_steps" in track:
            fix = "make each step cheaper: the step cap is the budget, the time limit a ceiling"
        problems.append(f"{name}: train_time {run.train_time_ms:.0f}ms exceeds the "
                        f"{track_name} limit of {limit_s} s (+{grace_ms:.0f}ms for the last "
                        f"step); {fix}")
    if not compliance["calibration_inside_budget"]:
        spent = run.calibration.get("calibration_time_ms", 0.0)
        reserved = run.calibration.get("reserved_ms", 0.0)
        problems.append(f"{name}: GPTQ calibration read training data for {spent:.0f}ms "
                        f"after training, over the {reserved:.0f}ms reserved from the "
                        f"budget; raise GPTQ_RESERVE_SECONDS")
    if not compliance["eval_under_limit"]:
        eval_ms, what = eval_time_for_rule(run, track)  # the numbers run_compliance judged
        problems.append(f"{name}: {what} {eval_ms:.0f}ms exceeds the {track_name} evaluation "
                        f"limit of {track['eval_time_limit_s']} s")
    return problems


def budget_problems(run, track_name: str, track: dict) -> list[str]:
    """Hardware, device, steps, threads, batch and data, where the track fixes them."""
    name = run.path.name
    problems = []
    hardware = track.get("hardware_regex")
    if hardware and not re.search(hardware, run.hardware):
        problems.append(f"{name}: hardware {run.hardware!r} is not what {track_name} "
                        f"requires (/{hardware}/); use track_non_record_16mb for other "
                        f"hardware")
    device = run.layout.get("device")
    if "device" in track and device != track["device"]:
        problems.append(f"{name}: device {device!r}, but {track_name} runs on "
                        f"{track['device']!r}")
    if "max_steps" in track:
        problems += step_problems(run, track_name, track["max_steps"])
    if "max_cpu_threads" in track:
        problems += thread_problems(run, track_name, track["max_cpu_threads"])
    batch = run.setting("train_batch_tokens")
    if "train_batch_tokens" in track and batch != track["train_batch_tokens"]:
        problems.append(f"{name}: TRAIN_BATCH_TOKENS={batch} but {track_name} fixes it at "
                        f"{track['train_batch_tokens']}")
    if "datasets" in track:
        problems += dataset_problems(run, track_name, track["datasets"])
    notes = []  # ours: every finding is a violation
    return problems + fingerprint_problems(run, track_name, track, notes) + notes


def step_problems(run, track_name: str, cap_steps: int) -> list[str]:
    name = run.path.name
    problems = []
    if run.iterations is None or run.iterations > cap_steps:
        problems.append(f"{name}: ITERATIONS={run.iterations} but {track_name} allows at most "
                        f"{cap_steps} steps; set ITERATIONS={cap_steps}")
    if run.last_step is not None and run.last_step > cap_steps:
        problems.append(f"{name}: the run took {run.last_step} steps, over the {track_name} "
                        f"cap of {cap_steps}")
    if run.stopping_early is not None:
        problems.append(f"{name}: stopped by the wallclock cap at step {run.last_step}; on "
                        f"{track_name} the step cap ends training, so the score does not "
                        f"depend on the machine's load: set MAX_WALLCLOCK_SECONDS=0")
    return problems


def thread_problems(run, track_name: str, max_threads: int) -> list[str]:
    m = re.search(r"(\d+) torch threads per process x (\d+) processes", run.hardware)
    threads = int(m.group(1)) * int(m.group(2)) if m else None
    if threads is not None and threads <= max_threads:
        return []
    return [f"{run.path.name}: hardware line {run.hardware!r} shows "
            f"{threads or 'no readable'} threads; {track_name} runs on at most {max_threads} "
            f"(e.g. OMP_NUM_THREADS=1 torchrun --nproc_per_node=2, or python train_gpt.py on "
            f"2 cores)"]


def dataset_problems(run, track_name: str, datasets: dict) -> list[str]:
    """{dataset folder name: its tokenizer file name}, as data/build_sotu.py names them."""
    data_path = run.setting("data_path")
    tokenizer_path = run.setting("tokenizer_path")
    dataset = Path(str(data_path)).name
    tokenizer = Path(str(tokenizer_path)).name
    if dataset not in datasets:
        return [f"{run.path.name}: DATA_PATH={data_path!r}, but {track_name} trains and "
                f"scores on one of {', '.join(datasets)} (python data/build_sotu.py)"]
    if tokenizer != datasets[dataset]:
        return [f"{run.path.name}: TOKENIZER_PATH={tokenizer_path!r} does not go with "
                f"{dataset}; use {datasets[dataset]}"]
    return []


def fingerprint_problems(run, track_name: str, track: dict, warnings: list) -> list[str]:
    """The audit's fingerprints (the challenge's PR #2146), on a dataset the track knows (by its folder's name, or
    its validation targets): no more training shards than it has (a train split that took validation documents has
    more; fewer is a warning), the validation targets whole or cut at the scoring length, and the n-gram tilt's
    gates from its token channel alone."""
    name = run.path.name
    found = run.fingerprints
    data = Path(str(run.setting("data_path") or run.setting("datasets_dir") or "")).name
    length = run.setting("eval_seq_len") or run.setting("train_seq_len")
    for dataset, known in track.get("fingerprints", {}).items():
        targets = known["val_stream_tokens"] - 1
        whole_or_cut = {targets} | ({targets // length * length} if isinstance(length, int) and length > 0 else set())
        if data != dataset and found.get("val_tokens") not in whole_or_cut:
            continue
        problems = []
        shards = found.get("train_shards")
        if shards is None or shards > known["train_shards"]:
            problems.append(f"{name}: train_shards {shards or 'not logged'}, but {dataset} has "
                            f"{known['train_shards']}: the audit rejects a train split holding validation documents "
                            f"(rebuild the data with the challenge's validation split)")
        elif shards < known["train_shards"]:
            warnings.append(f"{name}: trained on {shards} of {dataset}'s {known['train_shards']} shards; the audit's "
                            f"logs show all of them")
        if found.get("val_tokens") not in whole_or_cut:
            problems.append(f"{name}: val_tokens {found.get('val_tokens', 'not logged')}, but {dataset}'s "
                            f"validation has {targets:,} targets, or {min(whole_or_cut):,} cut at {length}: "
                            f"score the whole validation split")
        return problems + ngram_problems(run, warnings)
    return ngram_problems(run, warnings)


def ngram_problems(run, warnings: list) -> list[str]:
    """A run with the n-gram tilt logs its gates: every target hinted, none from the channels that read the
    scored token (within_gate, word_gate). A log without that line (April's) is a warning: it cannot be checked."""
    if str(run.setting("ngram_tilt_enabled", False)).lower() not in ("1", "true"):
        return []
    gates = run.ngram_gates
    if gates is None:
        warnings.append(f"{run.path.name}: NGRAM_TILT_ENABLED=1 but no `ngram_tilt:hints` line: its gate counts, "
                        f"which the audit reads, cannot be checked")
        return []
    problems = [f"{run.path.name}: ngram_tilt {key}={gates[key]}: that channel reads the scored token, which the "
                f"rules forbid; run the token channel alone (WITHIN_TAU=99 WORD_TAU=99)"
                for key in ("within_gate", "word_gate") if gates.get(key, 0) != 0]
    targets = run.fingerprints.get("val_tokens")
    if targets is not None and gates.get("total") != targets:
        problems.append(f"{run.path.name}: ngram_tilt total={gates.get('total')} hints for val_tokens {targets}: "
                        f"the hints must cover the targets scored")
    return problems


def check_eval_total(run) -> list[str]:
    """final_eval_total must add up the final passes the log shows (1 ms of rounding each)."""
    if run.eval_total is None:
        return []
    name = run.path.name
    passes = run.eval_total["passes"]
    lines = run.pass_times_ms
    by_pass = {}
    for line, ms in lines.items():
        for pass_name in passes:
            if line.endswith("_" + pass_name):
                by_pass[pass_name] = ms
    if set(by_pass) != set(passes) or len(lines) != len(passes):
        return [f"{name}: final_eval_total lists the passes {sorted(passes)} but the log's "
                f"final lines are {sorted(lines)}; the log was edited"]
    total_ms = run.eval_total["eval_time_ms"]
    each_off = any(abs(passes[p] - by_pass[p]) > 1 for p in passes)
    sum_off = abs(total_ms - sum(passes.values())) > len(passes)
    if each_off or sum_off:
        return [f"{name}: final_eval_total eval_time:{total_ms:.0f}ms does not add up its "
                f"passes {passes} and the final lines {lines}; the log was edited"]
    return []


def program_dump(source: bytes) -> str:
    """The program a source runs, as an AST dump without module, class and function docstrings."""
    return ast.dump(without_docstrings(source))


def check_packed(script: bytes, run, notes: list) -> list[str]:
    """A packed train_gpt.py (PACK_CODE=1) must be what the logged script's own pack_source
    makes of the logged source, and must run the same program."""
    name = run.path.name
    if run.code_packed_from is None:
        return [f"{name}: train_gpt.py is packed, but the run counted its readable source "
                f"(no PACK_CODE=1); put the logged source in the folder (make_record.py does)"]
    problems = packed_program_problems(script, run, notes)
    try:
        repacked = pack_logged_source(run.source, f"<{name}: train_gpt.py>")
    except Exception as e:  # the logged script's own import or pack_source failed here
        return problems + [f"{name}: cannot re-pack the logged source with its own "
                           f"pack_source here ({type(e).__name__}: {e}); install what it "
                           f"imports (requirements.txt) and check again"]
    if repacked != script:
        logged_python = run.versions.get("python", "")
        here = platform.python_version()
        if logged_python.rsplit(".", 1)[0] == here.rsplit(".", 1)[0]:
            problems.append(f"{name}: re-packing the logged source with its own pack_source "
                            f"gives {len(repacked)} bytes that differ from train_gpt.py "
                            f"({len(script)} bytes); the folder's script is not the logged "
                            f"source's packing")
        else:  # ast.unparse's output differs across Python versions; the AST check holds
            notes.append(f"{name}: re-packed here with Python {here}, not the run's "
                         f"{logged_python}: the bytes differ ({len(repacked)} vs "
                         f"{len(script)}), as ast.unparse's output may across versions; the "
                         f"program is checked by its AST")
    if len(script) != run.code_bytes:
        problems.append(f"{name}: the log counted {run.code_bytes} bytes of packed code but "
                        f"train_gpt.py is {len(script)} bytes")
    return problems


def packed_program_problems(script: bytes, run, notes: list) -> list[str]:
    name = run.path.name
    inner = unpack_code(script)
    if inner is None:
        return ["train_gpt.py starts as a packed file but is not exactly its two lines "
                "(base85 of lzma, nothing before or after); re-make it with make_record.py"]
    try:
        same_program = program_dump(inner) == program_dump(run.source)
    except SyntaxError as e:
        same_program = False
        notes.append(f"{name}: the packed or the logged program does not parse here: {e}")
    if same_program:
        return []
    return [f"{name}: the program packed in train_gpt.py is not the logged source (AST dumps "
            f"differ, docstrings aside); the folder's script is not what ran"]


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
    """Authors are people: the historical placeholder only where documented, real logins."""
    problems = []
    for key in ("author", "github_id"):
        if sub.get(key) == UNATTRIBUTED and folder_key not in UNATTRIBUTED_FOLDERS:
            problems.append(f"submission.json: {key} {UNATTRIBUTED!r} is kept only for the "
                            f"records made before the author came from the user; name the "
                            f"author (make_record.py --author, --github-id)")
    github_id = sub.get("github_id")
    if not isinstance(github_id, str) or not github_id or github_id == UNATTRIBUTED:
        return problems
    if not GITHUB_LOGIN.fullmatch(github_id):
        problems.append(f"submission.json: github_id {github_id!r} is not a GitHub login "
                        f"(letters, digits, single hyphens, at most 39 characters, no '@')")
    return problems


def differs(claimed, actual, tolerance=0.0) -> bool:
    if actual is None or isinstance(claimed, bool):
        return claimed != actual
    if not isinstance(claimed, NUMBER) or not isinstance(actual, NUMBER):
        return claimed != actual
    return abs(claimed - actual) > tolerance


def resolve_track(sub: dict, folder: Path, tracks: dict) -> tuple[str | None, list[str]]:
    """Our track key for submission.json's `track` (the challenge's spelling), checked against
    the folder's place."""
    spelled = sub.get("track")
    track_name = track_by_challenge_name(tracks, spelled)
    if track_name is None:
        if isinstance(spelled, str) and spelled in tracks:
            return None, [f"submission.json: track {spelled!r} is our folder's name; spell it "
                          f"as the challenge does: {tracks[spelled]['challenge_name']!r}"]
        known = ", ".join(repr(t["challenge_name"]) for t in tracks.values())
        return None, [f"submission.json: track {spelled!r} is not one of {known} "
                      f"(tools/tracks.json)"]
    parent = folder.resolve().parent.name
    if parent != track_name:
        return track_name, [f"{folder}: lives in {parent}/ but submission.json says track "
                            f"{spelled!r}; move the folder to records/{track_name}/"]
    return track_name, []


def check_our_folder(folder: Path, tracks: dict, deep: bool, data_path, tokenizer_path,
                     deep_tolerance: float, notes: list) -> list[str]:
    """Every problem with a record folder of ours; informational lines go to `notes`."""
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
        problems.append(f"submission.json: date {sub.get('date')!r} but the folder is dated "
                        f"{m.group(1)}")
    problems += check_identity(sub, f"{folder.resolve().parent.name}/{folder.resolve().name}")
    script = None
    if (folder / "train_gpt.py").is_file():
        script = (folder / "train_gpt.py").read_bytes()
        problems += script_claims(sub, script)
    seeds, seed_results, found = cited_seeds(sub)
    problems += found
    track = tracks[track_name] if track_name is not None else None
    runs, found = check_cited_runs(folder, seeds, seed_results, track_name, track, script,
                                   notes)
    problems += found
    if runs and "build" in sub:
        problems += build_claim(sub, runs)
    complete = runs and len(runs) == len(seeds) and all(run.finished for run in runs)
    if complete and track is not None:
        problems += check_aggregates(sub, runs, track)
        problems += check_requirements(folder, runs)
    if deep and runs:
        problems += deep_check(folder, runs, data_path, tokenizer_path, deep_tolerance, notes)
    return problems


def build_claim(sub: dict, runs) -> list[str]:
    """submission.json's build (in folders made since the logs name it) is the logs'."""
    logged = sorted({run.build or "core" for run in runs})
    if [sub["build"]] == logged:
        return []
    return [f"submission.json: build={sub['build']!r} but the logs say {', '.join(logged)}"]


def script_claims(sub: dict, script: bytes) -> list[str]:
    problems = []
    if sub.get("bytes_code") != len(script):
        problems.append(f"submission.json: bytes_code={sub.get('bytes_code')} but "
                        f"train_gpt.py is {len(script)} bytes")
    if sub.get("script_sha256") != sha256_hex(script):
        problems.append("submission.json: script_sha256 does not match train_gpt.py")
    return problems


def cited_seeds(sub: dict) -> tuple[list, dict, list[str]]:
    """(seeds, seed_results, problems) of our submission.json."""
    seeds = sub.get("seeds") if isinstance(sub.get("seeds"), list) else []
    seed_results = sub.get("seed_results")
    if not isinstance(seed_results, dict):
        seed_results = {}
    problems = []
    if len(set(map(str, seeds))) != len(seeds):
        problems.append(f"submission.json: repeated seeds {seeds}; each run needs its own SEED")
    if set(seed_results) != {str(s) for s in seeds}:
        problems.append(f"submission.json: seed_results is keyed {sorted(seed_results)} but "
                        f"seeds are {seeds}; one entry per seed, keyed by the seed as a string")
    if not seeds:
        problems.append("submission.json: no seeds; a record cites at least one log")
    return seeds, seed_results, problems


def check_cited_runs(folder: Path, seeds: list, seed_results: dict, track_name, track,
                     script, notes: list) -> tuple[list, list[str]]:
    """The logs our submission.json cites, each against its claims, the track and the script."""
    runs = []
    problems = []
    checked_sources = {}
    checked_builds = {}
    for seed in seeds:
        entry = seed_results.get(str(seed))
        if not isinstance(entry, dict):
            continue
        missing = [k for k in SEED_FIELDS if k not in entry]
        if missing:
            problems.append(f"submission.json: seed_results[{str(seed)!r}] lacks "
                            f"{', '.join(missing)}")
            continue
        log_path = folder / str(entry["log"])
        if Path(str(entry["log"])).name != entry["log"] or not log_path.is_file():
            problems.append(f"submission.json: seed {seed} cites log {entry['log']!r}, which "
                            f"is not a file in {folder}")
            continue
        try:
            run = parse_log(log_path)
        except LogError as e:
            problems.append(str(e))
            continue
        if not run.ours:
            problems.append(f"{log_path.name}: not a train_gpt.py run log of this repository "
                            f"(no source header); cite the log the run wrote")
            continue
        runs.append(run)
        problems += check_seed_entry(seed, entry, run)
        if track_name is not None:
            problems += check_run(run, track_name, track)
        problems += script_problems(script, run, checked_sources, notes)
        problems += provenance_problems(run, checked_builds, notes)
        problems += model_file_problems(folder, run)
    return runs, problems


def script_problems(script, run, checked_sources: dict, notes: list) -> list[str]:
    """The folder's train_gpt.py is the logged source, or its packing (PACK_CODE=1)."""
    if script is None:
        return []
    if script.startswith(PACKED_HEAD):
        # the same source packs the same way for every seed
        if run.source_sha256 in checked_sources:
            return []
        checked_sources[run.source_sha256] = check_packed(script, run, notes)
        return checked_sources[run.source_sha256]
    if run.source != script:
        return [f"{run.path.name}: its embedded source (sha256 {run.source_sha256[:12]}) "
                f"differs from train_gpt.py (sha256 {sha256_hex(script)[:12]}); the folder's "
                f"script is not what ran"]
    if run.code_packed_from is not None:
        return [f"{run.path.name}: the run counted its code packed (PACK_CODE=1), so the "
                f"folder's train_gpt.py must be that packed file; re-make the record with "
                f"make_record.py"]
    return []


def provenance_problems(run, checked: dict, notes: list) -> list[str]:
    """The logged train_gpt.py (the folder's, or what it packs) is what the log's `build:`
    line names: a core of this repository's history (a log from before the line is taken as
    one), or the stack's build that tools/build_trainer.py makes again, byte for byte, from
    the commit the line names. Checked once per source."""
    key = (run.source_sha256, run.build)
    if key in checked:
        return []
    label = run.build or "core"
    checked[key] = core_problems(run, notes) if label == "core" else build_problems(run, label)
    return checked[key]


def core_problems(run, notes: list) -> list[str]:
    name = run.path.name
    committed = committed_core(run.source)
    if committed is None:
        notes.append(f"{name}: {ROOT} has no git history, so whether its train_gpt.py is "
                     f"one of this repository's is not checked")
        return []
    # the working tree's core, not yet committed, is this checkout's own
    if committed or run.source == (ROOT / "train_gpt.py").read_bytes():
        return []
    blob = blob_id(run.source)
    if run.build is None:
        notes.append(f"{name}: logged before train_gpt.py named its build, and its "
                     f"train_gpt.py (blob {blob[:12]}) is no train_gpt.py of this "
                     f"repository's history")
        return []
    return [f"{name}: build: core, but its train_gpt.py (blob {blob[:12]}) is no "
            f"train_gpt.py of this repository's history (git log --all "
            f"--find-object={blob} -- train_gpt.py finds none); commit the train_gpt.py "
            f"that ran, then check again"]


def build_problems(run, label: str) -> list[str]:
    """A stack's build: rebuilt at the commit its label names, it is the logged source."""
    name = run.path.name
    found = parse_label(label)
    if found is None:
        return [f"{name}: build: {label!r} is neither core nor a stack's build (stack:NAME "
                f"techniques:A,B core:COMMIT); the log was edited, or another tool wrote it"]
    if found["uncommitted"]:
        return [f"{name}: build: {label}: built from a train_gpt.py or stack/ that differed "
                f"from the commit it names, so no commit rebuilds it; commit them, build "
                f"again with tools/build_trainer.py and rerun"]
    commit = found["commit"]
    if full_commit(commit) is None:
        return [f"{name}: build: {label}: its core commit {commit} is not in this "
                f"repository ({ROOT}); fetch it (git fetch origin {commit}) and check again"]
    command = "python tools/build_trainer.py " + " ".join(rebuild_args(label))
    try:
        rebuilt = rebuild(label)
    except StackError as e:
        return [f"{name}: build: {label}: {command} fails: {str(e).splitlines()[0]}"]
    if rebuilt == run.source:
        return []
    line = first_difference(rebuilt, run.source)
    return [f"{name}: its train_gpt.py is not what {command} builds (they differ from "
            f"line {line}): the file was edited after it was built; record the build itself"]


def first_difference(a: bytes, b: bytes) -> int:
    """The number of the first line where a and b differ."""
    a_lines, b_lines = a.splitlines(), b.splitlines()
    for number, (x, y) in enumerate(zip(a_lines, b_lines), 1):
        if x != y:
            return number
    return min(len(a_lines), len(b_lines)) + 1


def model_file_problems(folder: Path, run) -> list[str]:
    if not run.artifact_path:
        return []
    model_file = folder / Path(run.artifact_path).name
    if not model_file.is_file():
        return []
    if sha256_hex(model_file.read_bytes()) == run.artifact_sha256:
        return []
    return [f"{model_file.name}: sha256 differs from the one {run.path.name} recorded; "
            f"copy the model file the run wrote"]


def check_seed_entry(seed, entry: dict, run) -> list[str]:
    """One seed's entry of seed_results against the log it cites."""
    problems = []
    if run.seed != seed:
        problems.append(f"submission.json: seed_results[{str(seed)!r}] cites {run.path.name}, "
                        f"which ran SEED={run.seed}")
    for key, value in seed_result(run).items():
        if differs(entry[key], value, TOLERANCE):
            problems.append(f"submission.json: seed {seed} claims {key}={entry[key]!r} but "
                            f"{run.path.name} shows {value!r}")
    return problems


AGGREGATE_MEANING = {"val_loss": "the mean", "val_bpb": "the mean",
                     "val_loss_std": "the sample std", "val_bpb_std": "the sample std",
                     "eval_time_s_mean": "the mean total eval time",
                     "bytes_total": "the largest run's total submission size"}
AGGREGATE_ATTRIBUTES = {"score_line": "score_name", "hardware": "hardware",
                        "pytorch_version": "pytorch_version"}


def check_aggregates(sub: dict, runs: list, track: dict) -> list[str]:
    """The record-wide fields of our submission.json against all of its logs."""
    problems = []
    for key, actual in record_summary(runs, track).items():
        claimed = sub.get(key)
        if key == "compliance":
            if claimed != actual:
                problems.append(f"submission.json: compliance={claimed!r} but the logs show "
                                f"{actual!r}")
        elif key in AGGREGATE_ATTRIBUTES:
            values = {getattr(r, AGGREGATE_ATTRIBUTES[key]) for r in runs}
            if values != {claimed}:
                problems.append(f"submission.json: {key}={claimed!r} but the logs show "
                                f"{sorted(map(str, values))}")
        elif differs(claimed, actual, TOLERANCE):
            problems.append(f"submission.json: {key}={claimed!r} but "
                            f"{AGGREGATE_MEANING[key]} over the cited logs is {actual!r}")
    return problems


def check_requirements(folder: Path, runs) -> list[str]:
    """requirements.txt, when the folder has one, names every package the runs import."""
    path = folder / "requirements.txt"
    if not path.is_file():
        return []
    listed = set()
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        listed.add(re.split(r"[<>=!~\[; ]", line.strip(), maxsplit=1)[0].lower())
    missing = [p for p in required_packages(runs) if p not in listed]
    if not missing:
        return []
    return [f"requirements.txt: lacks {', '.join(missing)}, which the runs import"]


def deep_check(folder, runs, data_path, tokenizer_path, tolerance, notes) -> list[str]:
    """Re-score each run's model file with the record's own code; missing inputs are notes.
    A packed train_gpt.py is scored through the logged source it was proven to pack."""
    from deep_eval import DeepCheckUnavailable, evaluate_artifact
    problems = []
    script = (folder / "train_gpt.py").read_bytes()
    for run in runs:
        model_file = find_artifact(run, folder)
        if model_file is None:
            notes.append(f"deep check of {run.path.name} skipped: model file "
                         f"{run.artifact_path} not found (make the record with "
                         f"--copy-artifacts, or put it in the folder)")
            continue
        code = (script, str(folder / "train_gpt.py"))
        if script.startswith(PACKED_HEAD):
            code = (run.source, f"<{run.path.name}: train_gpt.py>")
        threads = re.search(r"(\d+) torch threads per process", run.hardware)
        cpu_threads = int(threads.group(1)) if threads else None
        # the round-trip line always; the sliding-window or TTT line too when it scores
        checks = [("roundtrip", run.roundtrip_val_bpb, "round-trip")]
        kind = score_kind(run.score_name or "")
        scored_by = {"sliding": "sliding-window", "ttt": "test-time-training"}
        if kind in scored_by:
            checks.append((kind, run.val_bpb, scored_by[kind]))
        for mode, claimed, what in checks:
            try:
                _, val_bpb = evaluate_artifact(code, model_file, run.hyperparameters,
                                               run.layout, data_path, tokenizer_path,
                                               mode=mode, cpu_threads=cpu_threads)
            except DeepCheckUnavailable as e:
                notes.append(f"deep check of {run.path.name} ({what}) skipped: {e}")
                continue
            notes.append(f"deep check of {run.path.name}: {what} val_bpb {val_bpb:.8f} "
                         f"recomputed, {claimed:.8f} claimed")
            if abs(val_bpb - claimed) > tolerance:
                problems.append(f"{run.path.name}: reloading {model_file.name} gives {what} "
                                f"val_bpb {val_bpb:.6f}, but the log claims {claimed:.6f} "
                                f"(tolerance {tolerance})")
    return problems


# ---- THE CHALLENGE'S RECORDS ----

def decimals(value: float) -> int:
    """Digits after the point as the JSON wrote them (1.081 -> 3)."""
    text = repr(float(value))
    if "e" in text or "." not in text:
        return 0
    return len(text.split(".")[1].rstrip("0"))


def agrees(claimed, actual: float) -> bool:
    """A claim agrees with a value within one unit of its last digit (rounded or cut)."""
    if isinstance(claimed, int):
        return abs(claimed - actual) <= 1
    return abs(claimed - actual) <= 10.0 ** -decimals(claimed) + 1e-12


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def challenge_track(folder: Path, sub: dict, tracks: dict,
                    warnings: list) -> tuple[str, dict]:
    """The track a challenge folder is checked against: the folder it sits in, else its
    submission.json's `track`, else the record track (with a warning)."""
    parent = folder.resolve().parent.name
    spelled = sub.get("track")
    plain = None
    if isinstance(spelled, str):
        plain = spelled.lower().replace("-", "_").removeprefix("track_")
    if parent in tracks:
        expected = tracks[parent]["challenge_name"]
        if plain is not None and plain != expected:
            warnings.append(f"submission.json: track {spelled!r}, but the folder is in "
                            f"{parent}/ ({expected!r})")
        return parent, tracks[parent]
    named = track_by_challenge_name(tracks, plain)
    if named is not None:
        return named, tracks[named]
    warnings.append(f"{folder}: not in a track's folder and no known track in "
                    f"submission.json; checked against track_10min_16mb")
    return "track_10min_16mb", tracks["track_10min_16mb"]


def challenge_script(folder: Path, runs: list, warnings: list) -> tuple[Path | None, list]:
    """(the folder's script, violations): train_gpt.py, else the one other script whose size
    a log reports (or the only one named train*.py), with a warning for the name."""
    if (folder / "train_gpt.py").is_file():
        return folder / "train_gpt.py", []
    scripts = sorted(folder.glob("*.py"))
    if not scripts:
        return None, [f"{folder}: no train_gpt.py (nor any script); the challenge's folders "
                      f"hold the train_gpt.py that ran"]
    sizes = set()
    for run in runs:
        sizes |= {run.code_bytes, run.code_uncompressed}
    chosen = [p for p in scripts if p.stat().st_size in sizes]
    if not chosen:
        chosen = [p for p in scripts if p.name.startswith("train")]
    if len(chosen) != 1:
        names = ", ".join(p.name for p in scripts)
        warnings.append(f"{folder}: no train_gpt.py, and which of {names} ran cannot be told "
                        f"from the logs; the code size was not checked")
        return None, []
    warnings.append(f"{chosen[0].name}: the challenge names the script train_gpt.py; "
                    f"checked as the folder's script")
    return chosen[0], []


def challenge_files(folder: Path, warnings: list) -> tuple[dict | None, list[str]]:
    """(submission.json or None, violations) for README.md, submission.json and the logs."""
    violations = []
    if not (folder / "README.md").is_file():
        violations.append(f"{folder}: no README.md; the challenge's folders explain the "
                          f"submission in one")
    if not log_paths(folder):
        violations.append(f"{folder}: no train log (*.log or *.txt, in it or a subfolder); "
                          f"the challenge asks for the logs the script wrote")
    path = submission_path(folder)
    if path is None:
        violations.append(f"{folder}: no submission.json; the challenge's folders hold one "
                          f"with the author, GitHub ID and val_bpb")
        return None, violations
    if path.name != "submission.json":
        warnings.append(f"{path.name}: the challenge names it submission.json")
    try:
        sub = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        violations.append(f"{path.name}: not valid JSON ({e}); fix it")
        return None, violations
    if not isinstance(sub, dict):
        violations.append(f"{path.name}: not a JSON object")
        return None, violations
    return sub, violations


def challenge_fields(sub: dict, warnings: list) -> list[str]:
    """The fields the challenge asks for: "your name, GitHub ID, val_bpb"; and a date."""
    violations = []
    for key, what in (("author", "your name"), ("github_id", "your GitHub ID")):
        value = sub.get(key)
        if not isinstance(value, str) or not value.strip():
            violations.append(f"submission.json: no {key} ({what}); the challenge's "
                              f"submission.json names the author, GitHub ID and val_bpb")
    score = sub.get("val_bpb")
    if score is not None and not is_number(score):
        warnings.append(f"submission.json: val_bpb={score!r} is not a number")
    when = sub.get("date")
    if when is not None and parse_date(when) is None:
        warnings.append(f"submission.json: date {when!r} is not a date (YYYY-MM-DD, or an "
                        f"ISO timestamp)")
    return violations


def parse_date(value) -> date | None:
    """'2026-04-06' or an ISO timestamp ('2026-04-06T00:00:00Z') -> its date."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).date()
    except ValueError:
        return None


def challenge_run(run, track_name: str, track: dict, script: Path | None,
                  warnings: list) -> list[str]:
    """One of the challenge's logs against the track's rules and the folder's script."""
    name = run.path.name
    if not run.finished:
        warnings.append(f"{name}: no score line this tool reads (final_..., legal_ttt..., "
                        f"quantized... val_loss:X val_bpb:Y)")
    if not run.steps:  # an evaluation of an artifact trained in another log
        return challenge_times(run, track_name, track, warnings)
    violations = []
    cap = track["artifact_cap_bytes"]
    if run.total_bytes is None:
        warnings.append(f"{name}: reports no artifact size (Total submission size)")
    elif run.total_bytes > cap:
        violations.append(f"{name}: total submission size {run.total_bytes:,} bytes exceeds "
                          f"the {track_name} cap of {cap:,} bytes by "
                          f"{run.total_bytes - cap:,}")
    violations += challenge_times(run, track_name, track, warnings)
    violations += fingerprint_problems(run, track_name, track, warnings)
    if script is not None:
        violations += challenge_code(run, script, warnings)
    return violations


def other_script(run, script: Path) -> Path | None:
    """Another script of the folder whose size is the code size the log counted."""
    for path in sorted(script.parent.glob("*.py")):
        if path != script and path.stat().st_size == run.code_bytes:
            return path
    return None


def challenge_times(run, track_name: str, track: dict, warnings: list) -> list[str]:
    name = run.path.name
    violations = []
    limit_s = track.get("train_time_limit_s")
    if not run.steps:
        pass  # evaluation only
    elif limit_s is not None and run.train_time_ms is None:
        warnings.append(f"{name}: reports no training time")
    elif not train_under_limit(run, track):
        grace_ms = track.get("train_time_grace_ms", 0)
        violations.append(f"{name}: train_time {run.train_time_ms:.0f}ms exceeds the "
                          f"{track_name} limit of {limit_s} s (+{grace_ms:.0f}ms for the "
                          f"last step)")
    eval_ms, what = eval_time_for_rule(run, track)
    eval_limit_s = track.get("eval_time_limit_s")
    if eval_ms is None and run.finished:
        warnings.append(f"{name}: reports no evaluation time")
    elif eval_ms is not None and eval_limit_s is not None and eval_ms > 1000 * eval_limit_s:
        violations.append(f"{name}: {what} {eval_ms:.0f}ms exceeds the {track_name} "
                          f"evaluation limit of {eval_limit_s} s")
    return violations


def challenge_code(run, script: Path, warnings: list) -> list[str]:
    """The code size the log reports, against the folder's script."""
    name = run.path.name
    size = script.stat().st_size
    if run.code_bytes is None:
        warnings.append(f"{name}: reports no code size (Code size: N bytes)")
        return []
    if run.code_uncompressed is not None:
        if run.code_uncompressed != size:
            warnings.append(f"{name}: ran a {run.code_uncompressed:,}-byte source, but "
                            f"{script.name} is {size:,} bytes: edited after the run; the log "
                            f"counted {run.code_bytes:,} bytes of compressed code, which "
                            f"cannot be recomputed here")
        return []
    if run.code_bytes == size:
        return []
    other = other_script(run, script)
    if other is not None:
        warnings.append(f"{name}: ran {other.name} ({run.code_bytes:,} bytes), not "
                        f"{script.name} ({size:,} bytes); the challenge counts the code "
                        f"in train_gpt.py")
        return []
    return [f"{name}: 'Code size: {run.code_bytes:,} bytes' but {script.name} is {size:,} "
            f"bytes ({size - run.code_bytes:+,}); the folder's script is not the one that "
            f"ran, and the logged artifact is not this script's"]


def logged_seeds(runs: list) -> list[str]:
    """The distinct seeds of the runs (a run of unknown seed counts as its own)."""
    seeds = []
    for run in runs:
        seed = seed_label(run)
        if seed not in seeds:
            seeds.append(seed)
    return seeds


def claimed_seeds(sub: dict) -> list[str]:
    listed = sub.get("seeds")
    if isinstance(listed, list):
        return [str(s) for s in listed]
    return list(per_seed_results(sub))


def challenge_seeds(sub: dict, runs: list, track_name: str, warnings: list) -> None:
    """Seeds claimed with no log, and fewer than RECORD_SEEDS on the record track."""
    seeds = logged_seeds(runs)
    for seed in claimed_seeds(sub):
        if seed in seeds:
            continue
        named = [r for r in runs if named_seed(r) == seed]
        if named:
            warnings.append(f"submission.json: seed {seed} has no log: {named[0].path.name} "
                            f"ran SEED={named[0].seed}")
        else:
            warnings.append(f"submission.json: seed {seed} has no log in the folder")
    if track_name == "track_10min_16mb" and 0 < len(seeds) < RECORD_SEEDS:
        warnings.append(f"{plural(len(seeds), 'seed')} logged; a record shows p < 0.01 over "
                        f"its predecessor, usually with {RECORD_SEEDS}")


def logged_values(run, key: str) -> list:
    """What a log shows for a per-seed claim: every score line's value for a score (the
    author may report the sliding window where a TTT line follows), else the one value."""
    if key in ("val_bpb", "val_loss"):
        scored = [f[key] for f in run.finals.values() if key in f]
        return [getattr(run, key)] + [v for v in scored if v != getattr(run, key)]
    if key in ("artifact_bytes", "bytes_total"):
        return [run.total_bytes]
    return [run.last_step]


def challenge_seed_claims(sub: dict, runs: list, warnings: list) -> None:
    """Each per-seed claim against the log of that seed."""
    keys = ("val_bpb", "val_loss", "artifact_bytes", "bytes_total", "steps")
    for seed, entry in per_seed_results(sub).items():
        run = matching_run(runs, seed, entry)
        if run is None:
            continue
        for key in keys:
            claimed = entry.get(key)
            shown = [v for v in logged_values(run, key) if v is not None]
            if not is_number(claimed) or not shown:
                continue
            if not any(agrees(claimed, v) for v in shown):
                warnings.append(f"submission.json: seed {seed} {key}={claimed!r} but "
                                f"{run.path.name} shows {shown[0]!r}")


def score_means(runs: list, key: str) -> list[float]:
    """The mean over the logs of each score line they all have (an author may report any:
    the round trip where a sliding window follows)."""
    if not runs:
        return []
    names = None
    for run in runs:
        has = {n for n, fields in run.finals.items() if key in fields}
        names = has if names is None else names & has
    return [statistics.fmean(r.finals[n][key] for r in runs) for n in sorted(names)]


def record_candidates(sub: dict, runs: list, key: str) -> list[float]:
    """What a top-level claim may be: the mean of the per-seed claims, a mean over the logs
    of one of their score lines, or one seed's value."""
    claims = [e.get(key) for e in per_seed_results(sub).values()]
    claims = [c for c in claims if is_number(c)]
    values = list(claims)
    if claims:
        values.append(statistics.fmean(claims))
    values += score_means(runs, key)
    for run in runs:
        values += logged_values(run, key)
    return [v for v in values if v is not None]


def matches_record(claimed, candidates: list[float]) -> bool:
    return not candidates or any(agrees(claimed, v) for v in candidates)


def mean_text(runs: list, key: str) -> str:
    values = [getattr(run, key) for run in runs if getattr(run, key) is not None]
    if not values:
        return ""
    return f" (the logs' mean: {statistics.fmean(values):.8f})"


def challenge_record_claims(sub: dict, finished: list, runs: list, script: Path | None,
                            warnings: list) -> list[str]:
    """The top-level val_bpb, val_loss, bytes_total and bytes_code against the logs; a
    submission.json with no val_bpb anywhere is a violation."""
    bpbs = record_candidates(sub, finished, "val_bpb")
    losses = record_candidates(sub, finished, "val_loss")
    claimed = sub.get("val_bpb")
    if is_number(claimed) and not matches_record(claimed, bpbs):
        warnings.append(f"submission.json: val_bpb={claimed!r} is neither a mean over the "
                        f"seeds nor one seed's{mean_text(finished, 'val_bpb')}")
    claimed = sub.get("val_loss")
    holds_bpb = is_number(claimed) and bool(bpbs) and matches_record(claimed, bpbs)
    if holds_bpb:
        warnings.append(f"submission.json: val_loss={claimed!r} is the val_bpb; val_loss is "
                        f"in nats per token")
    elif is_number(claimed) and not matches_record(claimed, losses):
        warnings.append(f"submission.json: val_loss={claimed!r} is neither a mean over the "
                        f"seeds nor one seed's{mean_text(finished, 'val_loss')}")
    violations = missing_score(sub, holds_bpb, warnings)
    totals = [r.total_bytes for r in runs if r.total_bytes is not None]
    claimed = sub.get("bytes_total")
    if totals and is_number(claimed):
        if not matches_record(claimed, totals + [statistics.fmean(totals)]):
            shown = f"{min(totals):,} to {max(totals):,}"
            if min(totals) == max(totals):
                shown = f"{min(totals):,}"
            warnings.append(f"submission.json: bytes_total={claimed!r} is neither the mean "
                            f"of the logs' artifacts nor one of them ({shown} bytes)")
    sizes = {r.code_bytes for r in runs} | {r.code_uncompressed for r in runs}
    if script is not None:
        sizes.add(script.stat().st_size)
    sizes.discard(None)
    claimed = sub.get("bytes_code")
    if is_number(claimed) and sizes and claimed not in sizes:
        warnings.append(f"submission.json: bytes_code={claimed!r} is no code size of the "
                        f"logs nor the script's ({', '.join(map(str, sorted(sizes)))})")
    return violations


def missing_score(sub: dict, holds_bpb: bool, warnings: list) -> list[str]:
    """No val_bpb: a naming difference when the score is under another key, else a
    violation."""
    if "val_bpb" in sub:
        return []
    aliases = [key for key in SCORE_ALIASES if key in sub]
    if aliases:
        warnings.append(f"submission.json: the score is under {aliases[0]}; the challenge "
                        f"names it val_bpb")
        return []
    if holds_bpb:
        warnings.append("submission.json: no val_bpb: it is under val_loss")
        return []
    return ["submission.json: no val_bpb; the challenge's submission.json gives the "
            "record's val_bpb"]


def check_challenge_folder(folder: Path, tracks: dict, warnings: list,
                           notes: list) -> list[str]:
    """Violations of the challenge's rules by one of its folders; other findings are warnings,
    and the files that are not run logs are notes."""
    sub, violations = challenge_files(folder, warnings)
    sub = sub or {}
    track_name, track = challenge_track(folder, sub, tracks, warnings)
    runs, skipped = read_logs(folder)
    notes += [f"not a run log: {reason}" for reason in skipped]
    runs = distinct_runs(runs)
    script, found = challenge_script(folder, runs, warnings)
    violations += found
    if sub:
        violations += challenge_fields(sub, warnings)
    for run in runs:
        violations += challenge_run(run, track_name, track, script, warnings)
    finished = [run for run in runs if run.finished]
    challenge_seeds(sub, finished, track_name, warnings)
    challenge_seed_claims(sub, finished, warnings)
    if sub:
        violations += challenge_record_claims(sub, finished, runs, script, warnings)
    return violations


# ---- EITHER ----

def is_ours(folder: Path) -> bool:
    """Our logs (the source header) or our submission.json fields make a folder ours."""
    if any(is_our_log(path) for path in log_paths(folder)):
        return True
    path = folder / "submission.json"
    try:
        sub = json.loads(path.read_text()) if path.is_file() else {}
    except json.JSONDecodeError:
        return False
    return isinstance(sub, dict) and any(key in sub for key in OUR_FIELDS)


def check_folder(folder, tracks=None, deep=False, data_path=None, tokenizer_path=None,
                 deep_tolerance=1e-3, notes=None, warnings=None) -> list[str]:
    """Every violation in a record folder; warnings and notes go to those lists."""
    folder = Path(folder)
    tracks = load_tracks() if tracks is None else tracks
    notes = [] if notes is None else notes
    warnings = [] if warnings is None else warnings
    if not folder.is_dir():
        return [f"{folder}: not a directory"]
    if is_ours(folder):
        return check_our_folder(folder, tracks, deep, data_path, tokenizer_path,
                                deep_tolerance, notes)
    if deep:
        notes.append(f"{folder}: --deep re-scores only this repository's records")
    return check_challenge_folder(folder, tracks, warnings, notes)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="record folder(s) to check")
    parser.add_argument("--deep", action="store_true",
                        help="reload each model file and recompute val_bpb")
    parser.add_argument("--data-path",
                        help="shards folder for --deep (default: the run's DATA_PATH)")
    parser.add_argument("--tokenizer-path",
                        help="tokenizer for --deep (default: the run's TOKENIZER_PATH)")
    parser.add_argument("--tolerance", type=float, default=1e-3,
                        help="allowed |recomputed - claimed| val_bpb")
    parser.add_argument("--quiet", action="store_true", help="no notes")
    args = parser.parse_args(argv)
    failed = 0
    for folder in args.folders:
        notes = []
        warnings = []
        violations = check_folder(folder, deep=args.deep, data_path=args.data_path,
                                  tokenizer_path=args.tokenizer_path,
                                  deep_tolerance=args.tolerance, notes=notes,
                                  warnings=warnings)
        if not args.quiet:
            for note in notes:
                print(f"note: {note}")
        counts = []
        if violations:
            failed += 1
            counts.append(plural(len(violations), "violation"))
        if warnings:
            counts.append(plural(len(warnings), "warning"))
        status = "FAIL" if violations else "OK  "
        print(f"{status} {folder}" + (f": {', '.join(counts)}" if counts else ""))
        for violation in violations:
            print(f"  - {violation}")
        for warning in warnings:
            print(f"  warning: {warning}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

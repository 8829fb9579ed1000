"""Turn finished runs (their logs/<RUN_ID>.txt) into a record folder records/<track>/YYYY-MM-DD_<ShortName>/.

    python records/make_record.py --track track_cpu --name "Naive Baseline" --author "Ada Lovelace" \\
        --github-id ada --blurb "The baseline architecture at the track's defaults." \\
        --copy-artifacts logs/seed1.txt logs/seed2.txt logs/seed3.txt

The folder gets train_gpt.py recovered byte for byte from the source embedded in the logs (all logs
must embed the same source), the logs themselves, submission.json (the challenge's fields plus
track, seeds, per-seed results, hardware, pytorch_version and each model file's sha256), and a
README skeleton with the per-seed table and each run's exact command. --copy-artifacts also copies
each run's model file, so that `check_record.py --deep` can re-score it.

The runs are checked against the track's rules first, and the finished folder is run through
check_record.py; on any problem nothing is left behind. An existing folder is never overwritten.
"""

import argparse
import datetime
import json
import re
import shutil
import statistics
import sys
from pathlib import Path

from check_record import FOLDER_NAME, check_folder, check_run
from runlog import RECORDS_DIR, LogError, find_artifact, load_tracks, parse_log, sha256_hex


def short_name_from(name: str) -> str:
    """'Naive baseline, 3 seeds' -> 'NaiveBaseline3Seeds'."""
    return "".join(word[:1].upper() + word[1:] for word in re.findall(r"[A-Za-z0-9]+", name))


def check_runs(runs, track_name: str, track: dict) -> list[str]:
    problems = [p for run in runs for p in check_run(run, track_name, track)]
    for what, key in (("source", lambda r: r.source_sha256[:12]), ("hardware", lambda r: r.hardware),
                      ("pytorch version", lambda r: r.pytorch_version), ("score line", lambda r: r.score_name)):
        values = {run.path.name: key(run) for run in runs}
        if len(set(values.values())) > 1:
            problems.append(f"the logs differ in {what} ({values}); a record is one script on one setup, "
                            f"run with several seeds")
    seeds = [run.seed for run in runs]
    if None in seeds or len(set(seeds)) != len(seeds):
        problems.append(f"seeds {dict(zip((r.path.name for r in runs), seeds))}: each run needs its own SEED")
    names = [run.path.name for run in runs]
    if len(set(names)) != len(names):
        problems.append(f"two logs share a file name ({names}); the record folder keeps them side by side")
    return problems


def submission_for(runs, args, script: bytes) -> dict:
    results = [{
        "seed": run.seed, "log": run.path.name,
        "val_loss": run.val_loss, "val_bpb": run.val_bpb,
        "artifact_bytes": run.total_bytes, "model_bytes": run.model_bytes, "model_sha256": run.artifact_sha256,
        "steps": run.last_step, "step_avg_ms": run.step_avg_ms, "train_time_ms": run.train_time_ms,
    } for run in runs]
    return {
        "author": args.author, "github_id": args.github_id, "name": args.name, "blurb": args.blurb,
        "date": args.date,
        "val_loss": round(statistics.fmean(r.val_loss for r in runs), 8),
        "val_bpb": round(statistics.fmean(r.val_bpb for r in runs), 8),
        "bytes_total": max(r.total_bytes for r in runs), "bytes_code": len(script),
        "track": args.track, "seeds": [r.seed for r in runs], "results": results,
        "score_line": runs[0].score_name,
        "hardware": runs[0].hardware, "pytorch_version": runs[0].pytorch_version,
        "script_sha256": sha256_hex(script),
    }


def readme_for(runs, sub: dict) -> str:
    n = len(runs)
    spread = f", std {statistics.stdev(r.val_bpb for r in runs):.4f}" if n > 1 else ""
    rows = "\n".join(
        f"| {r.seed} | {r.val_loss:.8f} | {r.val_bpb:.8f} | {r.last_step} | {r.step_avg_ms:.2f} ms | "
        f"{r.train_time_ms / 1000:.1f} s | {r.total_bytes:,} |" for r in runs)
    commands = "\n".join(r.command for r in runs)
    return f"""# {sub['name']}

{sub['blurb']}

**val_bpb {sub['val_bpb']:.4f}** (mean of {n} seed{'s' * (n != 1)}{spread}) · val_loss {sub['val_loss']:.4f} nats ·
largest artifact {sub['bytes_total']:,} bytes (code {sub['bytes_code']:,}) · `{sub['track']}` · {sub['date']} ·
{sub['author']} (@{sub['github_id']})

## Results

Scored by `final_{sub['score_line']}` after the export round trip.

| seed | val_loss | val_bpb | steps | step_avg | train_time | artifact bytes |
|---|---|---|---|---|---|---|
{rows}

## Commands

Each run exactly as its log recorded it (the env vars it set, then the launcher), from the directory
that holds `logs/`:

```bash
{commands}
```

Hardware: {sub['hardware']} · PyTorch {sub['pytorch_version']}

## What changed

Describe the change against the record this builds on, why it should help, and what it costs.
"""


def make_record(args) -> Path:
    tracks = load_tracks()
    if args.track not in tracks:
        raise SystemExit(f"--track {args.track!r} is not one of {', '.join(tracks)} (records/tracks.json)")
    if FOLDER_NAME.fullmatch(f"{args.date}_{args.short_name}") is None:
        raise SystemExit(f"--date {args.date!r} / --short-name {args.short_name!r}: need YYYY-MM-DD and "
                         f"letters, digits, '-' or '_'")
    try:
        runs = [parse_log(p) for p in args.logs]
    except (LogError, OSError) as e:
        raise SystemExit(f"error: {e}")
    problems = check_runs(runs, args.track, tracks[args.track])
    artifacts = {run.path.name: find_artifact(run) for run in runs} if args.copy_artifacts else {}
    for log_name, artifact in artifacts.items():
        if artifact is None:
            problems.append(f"{log_name}: --copy-artifacts, but its model file was not found beside the log "
                            f"or at its logged path")
        elif sha256_hex(artifact.read_bytes()) != next(r for r in runs if r.path.name == log_name).artifact_sha256:
            problems.append(f"{artifact}: sha256 differs from the one {log_name} recorded; is it from another run?")
    if problems:
        raise SystemExit("error: these runs cannot make a record:\n" + "\n".join(f"  - {p}" for p in problems))

    folder = Path(args.records_dir) / args.track / f"{args.date}_{args.short_name}"
    if folder.exists():
        raise SystemExit(f"error: {folder} already exists and is never overwritten; pick another --short-name "
                         f"or --date, or remove it yourself")
    folder.mkdir(parents=True)
    try:
        script = runs[0].source
        (folder / "train_gpt.py").write_bytes(script)
        for run in runs:
            shutil.copyfile(run.path, folder / run.path.name)
        for artifact in artifacts.values():
            shutil.copyfile(artifact, folder / artifact.name)
        sub = submission_for(runs, args, script)
        (folder / "submission.json").write_text(json.dumps(sub, indent=2) + "\n")
        (folder / "README.md").write_text(readme_for(runs, sub))
        problems = check_folder(folder)
    except BaseException:
        shutil.rmtree(folder)
        raise
    if problems:
        shutil.rmtree(folder)
        raise SystemExit(f"error: the new record failed its check, so {folder} was removed:\n"
                         + "\n".join(f"  - {p}" for p in problems))
    return folder


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", type=Path, help="logs/<RUN_ID>.txt of each seed")
    parser.add_argument("--track", required=True, help="a track in records/tracks.json, e.g. track_cpu")
    parser.add_argument("--name", required=True, help="the record's title, e.g. 'Naive Baseline'")
    parser.add_argument("--author", required=True)
    parser.add_argument("--github-id", required=True)
    parser.add_argument("--blurb", required=True, help="one or two sentences: what this record does")
    parser.add_argument("--short-name", help="folder suffix (default: --name in CamelCase)")
    parser.add_argument("--date", default=datetime.date.today().isoformat(), help="YYYY-MM-DD (default: today)")
    parser.add_argument("--copy-artifacts", action="store_true", help="also copy each run's model file")
    parser.add_argument("--records-dir", default=RECORDS_DIR, help="where the track folders live")
    args = parser.parse_args(argv)
    args.short_name = args.short_name or short_name_from(args.name)
    folder = make_record(args)
    print(f"wrote {folder}; edit its README.md, then run: python records/check_record.py {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

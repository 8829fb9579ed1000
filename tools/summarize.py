"""One table for a set of runs: every run log in the folders given, sorted by score, or grouped.

    python tools/summarize.py logs
    python tools/summarize.py logs --group --baseline "MATRIX_LR=0.04"   # mean ± std, Welch
    python tools/summarize.py logs --csv runs.csv --json runs.json --plots plots/   # matplotlib
    python tools/summarize.py ../parameter-golf/records/track_10min_16mb/*/ --group

A folder's logs are its `*.log` and `*.txt`, in it and its subfolders (`logs/`): ours
(train_gpt.py's, with its source at the top) and the challenge's, of every generation the field
wrote; each goes through tools/runlog.py, and every other file is named with the reason it was
skipped.

Per run: the env vars whose values differ from the script's defaults (read from the source
embedded in our logs; a challenge log is labelled `RECORD=<its folder>` instead), steps, step
time, pre-quantization val_bpb, round-trip val_bpb and the quantization gap, the score (the
run's scoring line: round trip, sliding window or TTT) in val_bpb and val_loss, train time, all
the timed evaluation, artifact and code bytes, and whether it finished or failed (with the
error its log ends on). Settings shared by every run are printed once above the table.

--group: runs that differ only in SEED are one configuration (a challenge folder is one): mean
± std of the score over its finished seeds, and with --baseline, the challenge's one-sided Welch
test (tools/compare.py: 0.005 nats, p < 0.01) of each against the baseline.
tools/sweep.py prints the same table for the runs it launched.
"""

import argparse
import ast
import csv
import json
import math
import shlex
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import compare
from runlog import read_logs

# a fresh uuid per run, and where its log went, say nothing about the setup
ALWAYS_DIFFERENT = {"run_id", "log_dir", "artifact_dir"}
SEED = "SEED"
RECORD = "RECORD"  # the folder a challenge log came from: its configuration
PLOT_FILES = ("val_bpb_vs_step.png", "val_bpb_vs_wallclock.png")


# ---- SETTINGS ----

def defaults_from_source(source: bytes | None) -> dict | None:
    """Literal defaults of the Hyperparameters class in a script's source, without running it."""
    if source is None:
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Hyperparameters":
            return class_defaults(node)
    return None


def class_defaults(node: ast.ClassDef) -> dict:
    defaults = {}
    for item in node.body:
        if not isinstance(item, ast.AnnAssign) or item.value is None:
            continue
        if not isinstance(item.target, ast.Name):
            continue
        try:
            defaults[item.target.id] = ast.literal_eval(item.value)
        except ValueError:
            pass
    return defaults


def record_folder(run) -> Path:
    """The record folder a log belongs to: its own folder or the one above, whichever holds a
    README.md or a submission*.json; else its own (the one above for a log in logs/)."""
    here = run.path.parent
    for folder in (here, here.parent):
        if (folder / "README.md").is_file() or any(folder.glob("submission*.json")):
            return folder
    return here.parent if here.name == "logs" else here


def changed_settings(run) -> dict:
    """{ENV_NAME: value as typed} for the settings this run changed from its script's defaults."""
    if not run.ours:
        return {RECORD: record_folder(run).name}
    env = run.env
    defaults = defaults_from_source(run.source)
    if defaults is None:  # a script this tool cannot read: fall back to what the command set
        return {k: v for k, v in env.items() if k.lower() not in ALWAYS_DIFFERENT}
    changed = {}
    for key, value in run.hyperparameters.items():
        if key in ALWAYS_DIFFERENT or key not in defaults:
            continue
        if value == defaults[key]:
            continue
        changed[key.upper()] = env.get(key.upper(), str(value))
    return changed


def shared_settings(changes: list[dict]) -> dict:
    """Settings every run changed the same way (with two or more runs), to print once."""
    if len(changes) < 2:
        return {}
    return dict(set.intersection(*(set(c.items()) for c in changes)))


def parse_settings(text: str) -> dict:
    """'MATRIX_LR=0.03 TTT_LORA_LR=0.0001' -> {"MATRIX_LR": "0.03", "TTT_LORA_LR": "0.0001"}."""
    settings = {}
    for word in shlex.split(text):
        name, sep, value = word.partition("=")
        if not sep or not name.isidentifier():
            raise ValueError(f"{word!r} is not NAME=value")
        settings[name] = value
    return settings


def settings_label(settings: dict) -> str:
    words = [f"{k}={v}" for k, v in sorted(settings.items())]
    return " ".join(words) or "(defaults)"


# ---- RESULTS ----

@dataclass
class Result:
    """One run's numbers, finished or not; what every table, CSV and JSON row is made of."""
    run_id: str
    settings: dict  # the settings that tell this run's configuration apart
    seed: int | None = None
    status: str = "finished"  # finished, failed (an error; its text below), unfinished
    error: str | None = None
    log: str | None = None
    steps: int | None = None
    iterations: int | None = None
    step_avg_ms: float | None = None
    prequant_bpb: float | None = None
    roundtrip_bpb: float | None = None
    quant_gap_bpb: float | None = None
    score_bpb: float | None = None
    score_loss: float | None = None
    score_line: str | None = None
    train_time_s: float | None = None
    eval_time_s: float | None = None
    artifact_bytes: int | None = None
    code_bytes: int | None = None
    tokenizer: str | None = None
    curve: list = field(default_factory=list)  # [(step, train_time_ms, val_bpb)]


def seconds(ms) -> float | None:
    return None if ms is None else ms / 1000


def run_status(run) -> str:
    if run.finished:
        return "finished"
    return "failed" if run.errors else "unfinished"


def result_from_run(run, settings: dict) -> Result:
    return Result(
        run_id=run.run_id, settings=settings, seed=run.seed,
        status=run_status(run), error=run.error, log=str(run.path),
        steps=run.last_step, iterations=run.iterations,
        step_avg_ms=run.step_avg_ms, prequant_bpb=run.prequant_val_bpb,
        roundtrip_bpb=run.roundtrip_val_bpb, quant_gap_bpb=run.quant_gap_bpb,
        score_bpb=run.val_bpb, score_loss=run.val_loss,
        score_line=run.score_name,
        train_time_s=seconds(run.train_time_ms),
        eval_time_s=seconds(run.eval_total_ms),
        artifact_bytes=run.total_bytes, code_bytes=run.code_bytes,
        tokenizer=run.tokenizer, curve=run.val_curve)


def load_runs(*folders: Path) -> tuple[list, list[str]]:
    """The run logs of the folders, and why each other file was skipped."""
    runs = []
    skipped = []
    for folder in folders:
        found, why = read_logs(folder)
        runs += found
        skipped += why
    return runs, skipped


def results_from_runs(runs) -> tuple[list[Result], dict]:
    """Results with the settings each run changed, less those every run shares (returned apart)."""
    changes = [changed_settings(run) for run in runs]
    common = shared_settings(changes)
    results = []
    for run, change in zip(runs, changes):
        own = {k: v for k, v in change.items() if (k, v) not in common.items()}
        results.append(result_from_run(run, own))
    return results, common


# ---- CONFIGURATIONS ----

@dataclass
class Config:
    """Runs of one configuration, one per seed."""
    settings: dict
    results: list

    @property
    def label(self) -> str:
        return settings_label(self.settings)

    @property
    def finished(self) -> list:
        return [r for r in self.results if r.status == "finished"]


def group_by_config(results: list[Result]) -> list[Config]:
    """Runs whose settings differ only in SEED, in order of first appearance."""
    configs = {}
    for r in results:
        settings = {k: v for k, v in r.settings.items() if k != SEED}
        label = settings_label(settings)
        configs.setdefault(label, Config(settings, [])).results.append(r)
    return list(configs.values())


def find_config(configs: list[Config], wanted: dict) -> Config:
    """The configuration a --baseline names: exactly its settings, else the only one with them."""
    matching = [c for c in configs if c.settings == wanted]
    if not matching:
        matching = [c for c in configs if wanted.items() <= c.settings.items()]
    if len(matching) != 1:
        labels = "; ".join(c.label for c in configs)
        raise ValueError(f"--baseline {settings_label(wanted)!r} matches {len(matching)} "
                         f"configurations; name one of: {labels}")
    return matching[0]


def sample(config: Config) -> compare.Sample:
    runs = config.finished
    tokenizers = {r.tokenizer for r in runs}
    tokenizer = tokenizers.pop() if len(tokenizers) == 1 else None
    losses = [r.score_loss for r in runs]
    if None in losses:
        losses = None
    bpbs = [r.score_bpb for r in runs]
    return compare.Sample(config.label, losses, bpbs, tokenizer, "ours")


def mean(values):
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def largest(values):
    return max((v for v in values if v is not None), default=None)


def config_row(config: Config, baseline: Config | None, margin: float, alpha: float) -> dict:
    done = config.finished
    scores = [r.score_bpb for r in done]
    failed = [r for r in config.results if r.status == "failed"]
    row = {
        "config": config.label, "runs": f"{len(done)}/{len(config.results)}",
        "seeds": " ".join(str(r.seed) for r in done),
        "score_bpb_mean": mean(scores),
        "score_bpb_std": statistics.stdev(scores) if len(scores) > 1 else None,
        "score_loss_mean": mean(r.score_loss for r in done),
        "delta_bpb": None, "improvement": None, "unit": None, "p_value": None,
        "verdict": None,
        "prequant_bpb": mean(r.prequant_bpb for r in done),
        "roundtrip_bpb": mean(r.roundtrip_bpb for r in done),
        "quant_gap_bpb": mean(r.quant_gap_bpb for r in done),
        "train_time_s": mean(r.train_time_s for r in done),
        "eval_time_s": mean(r.eval_time_s for r in done),
        "artifact_bytes": largest(r.artifact_bytes for r in done),
        "failed": len(failed),
    }
    if not done:
        return {**row, "verdict": "no finished run"}
    if baseline is None:
        return row
    if config is baseline:
        return {**row, "verdict": "baseline"}
    if baseline.finished:
        base_mean = mean(r.score_bpb for r in baseline.finished)
        row["delta_bpb"] = row["score_bpb_mean"] - base_mean
    try:
        c = compare.compare_samples(sample(config), sample(baseline), margin=margin,
                                    alpha=alpha)
    except ValueError as e:  # fewer than 2 seeds a side, or no spread
        return {**row, "verdict": f"n/a: {e}"}
    row["improvement"] = c.improvement
    row["unit"] = c.unit.split(" (")[0].split(";")[0]
    row["p_value"] = c.p
    row["verdict"] = compare.verdict_word(c)
    return row


def config_rows(configs: list[Config], baseline: Config | None = None,
                margin=compare.MARGIN_NATS, alpha=compare.ALPHA) -> list[dict]:
    rows = [config_row(c, baseline, margin, alpha) for c in configs]

    def best_first(row):
        score = row["score_bpb_mean"]
        return (score is None, score or 0.0, row["config"])
    return sorted(rows, key=best_first)


def run_row(r: Result) -> dict:
    return {"run_id": r.run_id, "changed": settings_label(r.settings), "seed": r.seed,
            "status": r.status, "steps": r.steps, "iterations": r.iterations,
            "step_avg_ms": r.step_avg_ms, "prequant_bpb": r.prequant_bpb,
            "roundtrip_bpb": r.roundtrip_bpb, "quant_gap_bpb": r.quant_gap_bpb,
            "score_bpb": r.score_bpb, "score_loss": r.score_loss,
            "score_line": r.score_line, "train_time_s": r.train_time_s,
            "eval_time_s": r.eval_time_s, "artifact_bytes": r.artifact_bytes,
            "code_bytes": r.code_bytes, "log": r.log, "error": r.error}


def run_rows(results: list[Result]) -> list[dict]:
    def best_first(r):
        unscored = r.score_bpb is None
        score = math.inf if unscored else r.score_bpb
        return (unscored, score, r.run_id)
    return [run_row(r) for r in sorted(results, key=best_first)]


# ---- OUTPUT ----

CELL_FORMATS = {"bpb": "{:.4f}", "loss": "{:.4f}", "gap": "{:+.4f}", "p": "{:.3g}",
                "s": "{:.1f}", "ms": "{:.2f}ms", "bytes": "{:,}"}


def cell(value, kind: str) -> str:
    if value is None:
        return "-"
    return CELL_FORMATS.get(kind, "{}").format(value)


def steps_cell(row: dict) -> str:
    if row["steps"] is None:
        return "-"
    return f"{row['steps']}/{row['iterations']}"


def score_cell(row: dict) -> str:
    if row["score_bpb_mean"] is None:
        return "-"
    text = f"{row['score_bpb_mean']:.4f}"
    if row["score_bpb_std"] is not None:
        text += f" ± {row['score_bpb_std']:.4f}"
    return text


# (header, the row's key, how to write it): the text tables; CSV and JSON keep every field
RUN_COLUMNS = [
    ("run_id", "run_id", "text"), ("changed", "changed", "text"),
    ("steps", "steps", steps_cell), ("step_avg", "step_avg_ms", "ms"),
    ("prequant_bpb", "prequant_bpb", "bpb"),
    ("roundtrip_bpb", "roundtrip_bpb", "bpb"), ("quant_gap", "quant_gap_bpb", "gap"),
    ("score_bpb", "score_bpb", "bpb"), ("score_loss", "score_loss", "loss"),
    ("train_s", "train_time_s", "s"), ("eval_s", "eval_time_s", "s"),
    ("artifact_bytes", "artifact_bytes", "bytes"), ("code_bytes", "code_bytes", "bytes"),
    ("status", "status", "text"),
]
CONFIG_COLUMNS = [
    ("config", "config", "text"), ("runs", "runs", "text"),
    ("score_bpb", "score_bpb_mean", score_cell), ("vs_baseline", "delta_bpb", "gap"),
    ("p", "p_value", "p"), ("verdict", "verdict", "text"),
    ("score_loss", "score_loss_mean", "loss"),
    ("prequant_bpb", "prequant_bpb", "bpb"), ("roundtrip_bpb", "roundtrip_bpb", "bpb"),
    ("quant_gap", "quant_gap_bpb", "gap"), ("train_s", "train_time_s", "s"),
    ("eval_s", "eval_time_s", "s"), ("artifact_bytes", "artifact_bytes", "bytes"),
]
LEFT = {"run_id", "changed", "config", "verdict", "status"}


def render(row: dict, key: str, how) -> str:
    if callable(how):
        return how(row)
    if how == "text":
        return "-" if row[key] is None else str(row[key])
    return cell(row[key], how)


def format_table(rows: list[dict], columns) -> str:
    headers = [header for header, _, _ in columns]
    cells = [headers]
    for row in rows:
        cells.append([render(row, key, how) for _, key, how in columns])
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = []
    for line in cells:
        words = []
        for text, width, header in zip(line, widths, headers):
            words.append(text.ljust(width) if header in LEFT else text.rjust(width))
        lines.append("  ".join(words).rstrip())
    return "\n".join(lines)


def failures_text(results: list[Result], tail_lines: int = 12) -> str:
    """Each failed or unfinished run with the end of its error (`error: rank` and traceback)."""
    blocks = []
    for r in results:
        if r.status == "finished":
            continue
        error = r.error or ("no score and no error in its log: still running, killed, "
                            "or cut short")
        lines = error.splitlines()
        if len(lines) > tail_lines:
            lines = [lines[0], "..."] + lines[-(tail_lines - 1):]
        where = f" ({r.log})" if r.log else ""
        body = "\n".join("    " + line for line in lines)
        blocks.append(f"{r.status} {r.run_id}{where}:\n{body}")
    return "\n".join(blocks)


def write_csv(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        writer.writerows(rows)


def write_json(data, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def at_step(point) -> float:
    return point[0]


def at_seconds(point) -> float:
    return (point[1] or 0.0) / 1000


def plot_curves(configs: list[Config], folder: Path) -> str:
    """val_bpb of the in-training validations against step and against training time, one
    color per configuration; returns what was written, or why nothing was."""
    try:
        import matplotlib
    except ImportError:
        return "plots skipped: matplotlib is not installed (optional: pip install matplotlib)"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not any(r.curve for c in configs for r in c.results):
        return "plots skipped: no run has in-training validation lines (set VAL_LOSS_EVERY)"
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    axes = ((PLOT_FILES[0], at_step, "step"),
            (PLOT_FILES[1], at_seconds, "training time (s)"))
    for name, x_of, xlabel in axes:
        fig, ax = plt.subplots(figsize=(9, 5.5))
        for i, config in enumerate(configs):
            plot_config(ax, config, x_of, f"C{i % 10}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("val_bpb")
        ax.set_title("in-training validation (label: configuration → mean score)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(folder / name, dpi=120)
        plt.close(fig)
        written.append(str(folder / name))
    return "wrote " + ", ".join(written)


def plot_config(ax, config: Config, x_of, color: str) -> None:
    final = ""
    if config.finished:
        final = f" → {mean(x.score_bpb for x in config.finished):.4f}"
    labelled = False
    for r in config.results:
        if not r.curve:
            continue
        label = None if labelled else f"{config.label}{final}"
        labelled = True
        xs = [x_of(p) for p in r.curve]
        ys = [p[2] for p in r.curve]
        ax.plot(xs, ys, color=color, marker=".", alpha=0.8, label=label)


def report(results: list[Result], common: dict, grouped: bool,
           baseline_settings: dict | None = None, margin=compare.MARGIN_NATS,
           alpha=compare.ALPHA) -> tuple[str, list[dict], dict]:
    """(text, CSV rows, JSON) for a set of runs: per run, or per configuration with verdicts."""
    configs = group_by_config(results)
    lines = [f"every run: {settings_label(common)}"] if common else []
    if grouped:
        baseline = None
        if baseline_settings is not None:
            baseline = find_config(configs, baseline_settings)
        rows = config_rows(configs, baseline, margin, alpha)
        lines.append(format_table(rows, CONFIG_COLUMNS))
        if baseline is not None:
            lines.append(f"verdict: one-sided Welch test against {baseline.label}: "
                         f"improvement > {margin} nats at p < {alpha} (tools/compare.py)")
        by_label = {c.label: c for c in configs}
        grouped_rows = []
        for row in rows:
            config_results = run_rows(by_label[row["config"]].results)
            grouped_rows.append({**row, "results": config_results})
        data = {"shared_settings": common,
                "baseline": baseline.label if baseline else None,
                "margin_nats": margin, "alpha": alpha, "configs": grouped_rows}
    else:
        rows = run_rows(results)
        lines.append(format_table(rows, RUN_COLUMNS))
        data = {"shared_settings": common, "runs": rows}
    failed = failures_text(results)
    if failed:
        lines += ["", failed]
    return "\n".join(lines), rows, data


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path,
                        help="folders of run logs: logs, or record folders")
    parser.add_argument("--group", action="store_true",
                        help="one row per configuration (runs differing only in SEED)")
    parser.add_argument("--baseline", help="the configuration to test the others against, "
                                           "e.g. 'MATRIX_LR=0.04' (implies --group)")
    parser.add_argument("--margin", type=float, default=compare.MARGIN_NATS,
                        help="required improvement in nats")
    parser.add_argument("--alpha", type=float, default=compare.ALPHA,
                        help="significance level")
    parser.add_argument("--csv", type=Path,
                        help="also write the table's rows, unrounded, to this CSV file")
    parser.add_argument("--json", type=Path,
                        help="also write them (and each configuration's runs) as JSON")
    parser.add_argument("--plots", type=Path,
                        help=f"write {' and '.join(PLOT_FILES)} into this folder (matplotlib)")
    args = parser.parse_args(argv)
    for folder in args.folders:
        if not folder.is_dir():
            raise SystemExit(f"error: {folder} is not a directory of run logs")
    runs, skipped = load_runs(*args.folders)
    if not runs:
        raise SystemExit(f"error: no run logs (*.log, *.txt, in them or a subfolder) in "
                         f"{', '.join(map(str, args.folders))}")
    results, common = results_from_runs(runs)
    try:
        baseline = None
        if args.baseline is not None:
            baseline = parse_settings(args.baseline)
        grouped = args.group or baseline is not None
        text, rows, data = report(results, common, grouped, baseline, args.margin,
                                  args.alpha)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    print(text)
    print(f"\nread {len(runs)} run logs, skipped {len(skipped)} other files")
    for reason in skipped:
        print(f"skipped {reason}")
    if args.csv:
        write_csv(rows, args.csv)
    if args.json:
        write_json(data, args.json)
    if args.plots:
        print(plot_curves(group_by_config(results), args.plots))
    return 0


if __name__ == "__main__":
    sys.exit(main())

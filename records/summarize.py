"""One table for a set of runs: every run log in a folder, sorted by score, or grouped into configurations.

    python records/summarize.py logs
    python records/summarize.py logs --group --baseline "MATRIX_LR=0.04"     # mean ± std over seeds, Welch verdicts
    python records/summarize.py logs --csv runs.csv --json runs.json --plots plots/   # plots need matplotlib

Per run: the env vars whose values differ from the script's defaults, steps, step time, pre-quantization val_bpb
(the last `step:N/N val_loss val_bpb` line), round-trip val_bpb and the quantization gap (round trip minus
pre-quant), the score (the run's scoring line: round trip, sliding window or TTT), train time, all the timed
evaluation, artifact bytes, and whether it finished or failed (with the error its log ends on).
Defaults are read from each log's own embedded source (the Hyperparameters class), so a sweep over
several versions of the script still compares each run with the script it ran; settings shared by
every run are printed once above the table.

--group: runs that differ only in SEED are one configuration: mean ± std of the score over its finished seeds,
and with --baseline, the challenge's one-sided Welch test (records/compare.py: 0.005 nats, p < 0.01) of each
configuration against the baseline. records/sweep.py prints the same table for the runs it launched.
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
from runlog import LogError, parse_log

ALWAYS_DIFFERENT = {"run_id", "log_dir"}  # a fresh uuid per run, and where its log went, say nothing about the setup
SEED = "SEED"
PLOT_FILES = ("val_bpb_vs_step.png", "val_bpb_vs_wallclock.png")


# ---- SETTINGS ----

def defaults_from_source(source: bytes) -> dict | None:
    """Literal defaults of the Hyperparameters class in a script's source, without running it."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Hyperparameters":
            defaults = {}
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is not None:
                    try:
                        defaults[item.target.id] = ast.literal_eval(item.value)
                    except ValueError:
                        pass
            return defaults
    return None


def changed_settings(run) -> dict:
    """{ENV_NAME: value as typed} for the settings this run changed from its script's defaults."""
    env = run.env
    defaults = defaults_from_source(run.source)
    if defaults is None:  # a script this tool cannot read: fall back to what the command set
        return {k: v for k, v in env.items() if k.lower() not in ALWAYS_DIFFERENT}
    changed = {}
    for key, value in run.hyperparameters.items():
        if key in ALWAYS_DIFFERENT or key not in defaults or value == defaults[key]:
            continue
        changed[key.upper()] = env.get(key.upper(), str(value))
    return changed


def shared_settings(changes: list[dict]) -> dict:
    """Settings every run changed the same way (with two or more runs), to print once."""
    if len(changes) < 2:
        return {}
    return dict(set.intersection(*(set(c.items()) for c in changes)))


def parse_settings(text: str) -> dict:
    """'MATRIX_LR=0.03 TTT_EPOCHS=1' -> {"MATRIX_LR": "0.03", "TTT_EPOCHS": "1"}."""
    settings = {}
    for word in shlex.split(text):
        name, sep, value = word.partition("=")
        if not sep or not name.isidentifier():
            raise ValueError(f"{word!r} is not NAME=value")
        settings[name] = value
    return settings


def settings_label(settings: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(settings.items())) or "(defaults)"


# ---- RESULTS ----

@dataclass
class Result:
    """One run's numbers, finished or not; what every table, CSV and JSON row is made of."""
    run_id: str
    settings: dict  # the settings that tell this run's configuration apart
    seed: int | None = None
    status: str = "finished"  # finished, failed (an error; its text below), unfinished (no score yet)
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
    tokenizer: str | None = None
    curve: list = field(default_factory=list)  # [(step, train_time_ms, val_bpb)] of the in-training validations


def result_from_run(run, settings: dict) -> Result:
    status = "finished" if run.finished else "failed" if run.errors else "unfinished"
    return Result(
        run_id=run.run_id, settings=settings, seed=run.seed, status=status, error=run.error, log=str(run.path),
        steps=run.last_step, iterations=run.iterations, step_avg_ms=run.step_avg_ms,
        prequant_bpb=run.prequant_val_bpb, roundtrip_bpb=run.roundtrip_val_bpb, quant_gap_bpb=run.quant_gap_bpb,
        score_bpb=run.val_bpb, score_loss=run.val_loss, score_line=run.score_name,
        train_time_s=None if run.train_time_ms is None else run.train_time_ms / 1000,
        eval_time_s=None if run.eval_total_ms is None else run.eval_total_ms / 1000,
        artifact_bytes=run.total_bytes, tokenizer=run.tokenizer, curve=run.val_curve)


def load_runs(folder: Path) -> tuple[list, list[str]]:
    runs, skipped = [], []
    for path in sorted(folder.glob("*.txt")):
        try:
            runs.append(parse_log(path))
        except LogError as e:
            skipped.append(str(e))
    return runs, skipped


def results_from_runs(runs) -> tuple[list[Result], dict]:
    """Results with the settings each run changed, less those every run shares (returned apart)."""
    changes = [changed_settings(run) for run in runs]
    common = shared_settings(changes)
    return [result_from_run(run, {k: v for k, v in c.items() if (k, v) not in common.items()})
            for run, c in zip(runs, changes)], common


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
        configs.setdefault(settings_label(settings), Config(settings, [])).results.append(r)
    return list(configs.values())


def find_config(configs: list[Config], wanted: dict) -> Config:
    """The configuration a --baseline names: exactly its settings, else the only one that has them all."""
    exact = [c for c in configs if c.settings == wanted]
    matching = exact or [c for c in configs if wanted.items() <= c.settings.items()]
    if len(matching) != 1:
        raise ValueError(f"--baseline {settings_label(wanted)!r} matches {len(matching)} configurations; name one of: "
                         + "; ".join(c.label for c in configs))
    return matching[0]


def sample(config: Config) -> compare.Sample:
    runs = config.finished
    tokenizers = {r.tokenizer for r in runs}
    return compare.Sample(config.label, [r.score_loss for r in runs], [r.score_bpb for r in runs],
                          tokenizers.pop() if len(tokenizers) == 1 else None, "ours")


def mean(values):
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def config_row(config: Config, baseline: Config | None, margin: float, alpha: float) -> dict:
    done = config.finished
    scores = [r.score_bpb for r in done]
    row = {
        "config": config.label, "runs": f"{len(done)}/{len(config.results)}",
        "seeds": " ".join(str(r.seed) for r in done),
        "score_bpb_mean": mean(scores), "score_bpb_std": statistics.stdev(scores) if len(scores) > 1 else None,
        "delta_bpb": None, "improvement": None, "unit": None, "p_value": None, "verdict": None,
        "prequant_bpb": mean(r.prequant_bpb for r in done), "roundtrip_bpb": mean(r.roundtrip_bpb for r in done),
        "quant_gap_bpb": mean(r.quant_gap_bpb for r in done), "train_time_s": mean(r.train_time_s for r in done),
        "eval_time_s": mean(r.eval_time_s for r in done),
        "artifact_bytes": max((r.artifact_bytes for r in done if r.artifact_bytes is not None), default=None),
        "failed": len([r for r in config.results if r.status == "failed"]),
    }
    if not done:
        return {**row, "verdict": "no finished run"}
    if baseline is None:
        return row
    if config is baseline:
        return {**row, "verdict": "baseline"}
    row["delta_bpb"] = row["score_bpb_mean"] - mean(r.score_bpb for r in baseline.finished) \
        if baseline.finished else None
    try:
        c = compare.compare_samples(sample(config), sample(baseline), margin=margin, alpha=alpha)
    except ValueError as e:  # fewer than 2 seeds a side, or no spread
        return {**row, "verdict": f"n/a: {e}"}
    return {**row, "improvement": c.improvement, "unit": c.unit.split(" (")[0].split(";")[0], "p_value": c.p,
            "verdict": "SIGNIFICANT" if c.significant else "not significant"}


def config_rows(configs: list[Config], baseline: Config | None = None, margin=compare.MARGIN_NATS,
                alpha=compare.ALPHA) -> list[dict]:
    rows = [config_row(c, baseline, margin, alpha) for c in configs]
    return sorted(rows, key=lambda r: (r["score_bpb_mean"] is None, r["score_bpb_mean"] or 0.0, r["config"]))


def run_row(r: Result) -> dict:
    return {"run_id": r.run_id, "changed": settings_label(r.settings), "seed": r.seed, "status": r.status,
            "steps": r.steps, "iterations": r.iterations, "step_avg_ms": r.step_avg_ms,
            "prequant_bpb": r.prequant_bpb, "roundtrip_bpb": r.roundtrip_bpb, "quant_gap_bpb": r.quant_gap_bpb,
            "score_bpb": r.score_bpb, "score_loss": r.score_loss, "score_line": r.score_line,
            "train_time_s": r.train_time_s, "eval_time_s": r.eval_time_s, "artifact_bytes": r.artifact_bytes,
            "log": r.log, "error": r.error}


def run_rows(results: list[Result]) -> list[dict]:
    def key(r):
        return (r.score_bpb is None, r.score_bpb if r.score_bpb is not None else math.inf, r.run_id)
    return [run_row(r) for r in sorted(results, key=key)]


# ---- OUTPUT ----

CELL_FORMATS = {"bpb": "{:.4f}", "gap": "{:+.4f}", "p": "{:.3g}", "s": "{:.1f}", "ms": "{:.2f}ms", "bytes": "{:,}"}


def cell(value, kind: str) -> str:
    return "-" if value is None else CELL_FORMATS.get(kind, "{}").format(value)


# (header, how to render a row), for the text tables; CSV and JSON keep every field, unrounded
RUN_COLUMNS = [
    ("run_id", lambda r: r["run_id"]), ("changed", lambda r: r["changed"]),
    ("steps", lambda r: f"{r['steps']}/{r['iterations']}" if r["steps"] is not None else "-"),
    ("step_avg", lambda r: cell(r["step_avg_ms"], "ms")), ("prequant_bpb", lambda r: cell(r["prequant_bpb"], "bpb")),
    ("roundtrip_bpb", lambda r: cell(r["roundtrip_bpb"], "bpb")), ("quant_gap", lambda r: cell(r["quant_gap_bpb"], "gap")),
    ("score_bpb", lambda r: cell(r["score_bpb"], "bpb")), ("train_s", lambda r: cell(r["train_time_s"], "s")),
    ("eval_s", lambda r: cell(r["eval_time_s"], "s")), ("artifact_bytes", lambda r: cell(r["artifact_bytes"], "bytes")),
    ("status", lambda r: r["status"]),
]
CONFIG_COLUMNS = [
    ("config", lambda r: r["config"]), ("runs", lambda r: r["runs"]),
    ("score_bpb", lambda r: "-" if r["score_bpb_mean"] is None else f"{r['score_bpb_mean']:.4f}"
     + (f" ± {r['score_bpb_std']:.4f}" if r["score_bpb_std"] is not None else "")),
    ("vs_baseline", lambda r: cell(r["delta_bpb"], "gap")), ("p", lambda r: cell(r["p_value"], "p")),
    ("verdict", lambda r: r["verdict"] or "-"),
    ("prequant_bpb", lambda r: cell(r["prequant_bpb"], "bpb")), ("roundtrip_bpb", lambda r: cell(r["roundtrip_bpb"], "bpb")),
    ("quant_gap", lambda r: cell(r["quant_gap_bpb"], "gap")), ("train_s", lambda r: cell(r["train_time_s"], "s")),
    ("eval_s", lambda r: cell(r["eval_time_s"], "s")), ("artifact_bytes", lambda r: cell(r["artifact_bytes"], "bytes")),
]
LEFT = {"run_id", "changed", "config", "verdict", "status"}


def format_table(rows: list[dict], columns) -> str:
    cells = [[header for header, _ in columns]] + [[render(row) for _, render in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) if header in LEFT else c.rjust(w)
                               for c, w, (header, _) in zip(line, widths, columns)).rstrip() for line in cells)


def failures_text(results: list[Result], tail_lines: int = 12) -> str:
    """Each failed or unfinished run with the end of its error (an `error: rank` line and its traceback)."""
    blocks = []
    for r in results:
        if r.status == "finished":
            continue
        error = r.error or "no score and no error in its log: still running, killed, or cut short"
        lines = error.splitlines()
        shown = lines if len(lines) <= tail_lines else [lines[0], "..."] + lines[-(tail_lines - 1):]
        blocks.append(f"{r.status} {r.run_id}" + (f" ({r.log})" if r.log else "") + ":\n"
                      + "\n".join("    " + line for line in shown))
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


def plot_curves(configs: list[Config], folder: Path) -> str:
    """val_bpb of the in-training validations against step and against training time, one color per
    configuration; returns what was written, or why nothing was."""
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
    for name, x_of, xlabel in ((PLOT_FILES[0], lambda p: p[0], "step"),
                               (PLOT_FILES[1], lambda p: (p[1] or 0.0) / 1000, "training time (s)")):
        fig, ax = plt.subplots(figsize=(9, 5.5))
        for i, config in enumerate(configs):
            color = f"C{i % 10}"
            for j, r in enumerate(config.results):
                if r.curve:
                    final = f" → {mean(x.score_bpb for x in config.finished):.4f}" if config.finished else ""
                    ax.plot([x_of(p) for p in r.curve], [p[2] for p in r.curve], color=color, marker=".", alpha=0.8,
                            label=f"{config.label}{final}" if j == 0 else None)
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


def report(results: list[Result], common: dict, grouped: bool, baseline_settings: dict | None = None,
           margin=compare.MARGIN_NATS, alpha=compare.ALPHA) -> tuple[str, list[dict], dict]:
    """(text, CSV rows, JSON) for a set of runs: per run, or per configuration with verdicts against a baseline."""
    configs = group_by_config(results)
    lines = [f"every run: {settings_label(common)}"] if common else []
    if grouped:
        baseline = find_config(configs, baseline_settings) if baseline_settings is not None else None
        rows = config_rows(configs, baseline, margin, alpha)
        lines.append(format_table(rows, CONFIG_COLUMNS))
        if baseline is not None:
            lines.append(f"verdict: one-sided Welch test against {baseline.label}: improvement > {margin} nats at "
                         f"p < {alpha} (records/compare.py)")
        by_label = {c.label: c for c in configs}
        data = {"shared_settings": common, "baseline": baseline.label if baseline else None, "margin_nats": margin,
                "alpha": alpha, "configs": [{**row, "results": run_rows(by_label[row["config"]].results)}
                                            for row in rows]}
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
    parser.add_argument("folder", type=Path, help="folder of run logs, e.g. logs")
    parser.add_argument("--group", action="store_true", help="one row per configuration (runs differing only in SEED)")
    parser.add_argument("--baseline", help="the configuration to test the others against, e.g. 'MATRIX_LR=0.04' "
                                           "(implies --group)")
    parser.add_argument("--margin", type=float, default=compare.MARGIN_NATS, help="required improvement in nats")
    parser.add_argument("--alpha", type=float, default=compare.ALPHA, help="significance level")
    parser.add_argument("--csv", type=Path, help="also write the table's rows, unrounded, to this CSV file")
    parser.add_argument("--json", type=Path, help="also write them (and each configuration's runs) as JSON")
    parser.add_argument("--plots", type=Path, help=f"write {' and '.join(PLOT_FILES)} into this folder (matplotlib)")
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        raise SystemExit(f"error: {args.folder} is not a directory of run logs")
    runs, skipped = load_runs(args.folder)
    for reason in skipped:
        print(f"skipped {reason}", file=sys.stderr)
    if not runs:
        raise SystemExit(f"error: no train_gpt.py run logs (*.txt) in {args.folder}")
    results, common = results_from_runs(runs)
    try:
        baseline = parse_settings(args.baseline) if args.baseline is not None else None
        text, rows, data = report(results, common, args.group or baseline is not None, baseline, args.margin, args.alpha)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    print(text)
    if args.csv:
        write_csv(rows, args.csv)
    if args.json:
        write_json(data, args.json)
    if args.plots:
        print(plot_curves(group_by_config(results), args.plots))
    return 0


if __name__ == "__main__":
    sys.exit(main())

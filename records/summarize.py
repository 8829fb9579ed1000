"""One table for a sweep: every run log in a folder, sorted by score.

    python records/summarize.py logs
    python records/summarize.py logs --png curves.png     # validation curves too (needs matplotlib)

Columns: run id, the env vars whose values differ from the script's defaults, steps, step time,
final round-trip val_bpb (and the sliding-window score when a run has one), artifact bytes.
Defaults are read from each log's own embedded source (the Hyperparameters class), so a sweep over
several versions of the script still compares each run with the script it ran; settings shared by
every run are printed once above the table. Unfinished runs sort last.
"""

import argparse
import ast
import math
import sys
from pathlib import Path

from runlog import LogError, parse_log

ALWAYS_DIFFERENT = {"run_id"}  # a fresh uuid per run says nothing about the setup


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


def shared_settings(changes: dict) -> dict:
    """Settings every run changed the same way (with two or more runs), to print once."""
    if len(changes) < 2:
        return {}
    return dict(set.intersection(*(set(c.items()) for c in changes.values())))


def load_runs(folder: Path) -> tuple[list, list[str]]:
    runs, skipped = [], []
    for path in sorted(folder.glob("*.txt")):
        try:
            runs.append(parse_log(path))
        except LogError as e:
            skipped.append(str(e))
    return runs, skipped


def sort_key(run):
    return (run.val_bpb is None, run.val_bpb if run.val_bpb is not None else math.inf, run.run_id)


def table(runs) -> str:
    changes = {run.run_id: changed_settings(run) for run in runs}
    common = shared_settings(changes)
    has_sliding = any(run.score_name and "roundtrip" not in run.score_name for run in runs)  # sliding or TTT
    header = ["run_id", "changed", "steps", "step_avg", "roundtrip_bpb"] + (["score_bpb"] if has_sliding else []) \
        + ["artifact_bytes"]
    rows = []
    for run in sorted(runs, key=sort_key):
        diff = " ".join(f"{k}={v}" for k, v in sorted(changes[run.run_id].items()) if k not in common)
        steps = f"{run.last_step}/{run.iterations}" if run.last_step is not None else "-"
        rows.append([run.run_id, diff or "(defaults)", steps,
                     f"{run.step_avg_ms:.2f}ms" if run.step_avg_ms is not None else "-",
                     f"{run.roundtrip_val_bpb:.4f}" if run.roundtrip_val_bpb is not None else "unfinished"]
                    + ([f"{run.val_bpb:.4f}" if run.val_bpb is not None else "-"] if has_sliding else [])
                    + [f"{run.total_bytes:,}" if run.total_bytes is not None else "-"])
    widths = [max(len(str(row[i])) for row in [header] + rows) for i in range(len(header))]
    right = {"steps", "step_avg", "roundtrip_bpb", "score_bpb", "artifact_bytes"}
    lines = ["  ".join(cell.rjust(w) if name in right else cell.ljust(w)
                       for cell, w, name in zip(row, widths, header)).rstrip() for row in [header] + rows]
    if common:
        lines.insert(0, "every run: " + " ".join(f"{k}={v}" for k, v in sorted(common.items())))
    return "\n".join(lines)


def plot_curves(runs, png_path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("error: --png needs matplotlib, an optional extra: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    changes = {run.run_id: changed_settings(run) for run in runs}
    common = shared_settings(changes).items()
    fig, ax = plt.subplots(figsize=(9, 5.5))
    plotted = 0
    for run in sorted(runs, key=sort_key):
        curve = run.val_curve
        if not curve:
            continue
        label = " ".join(f"{k}={v}" for k, v in sorted(changes[run.run_id].items()) if (k, v) not in common)
        final = f" → {run.val_bpb:.4f}" if run.val_bpb is not None else ""
        ax.plot([step for step, _, _ in curve], [bpb for _, _, bpb in curve], marker=".",
                label=f"{run.run_id[:12]} {label}{final}".strip())
        plotted += 1
    if not plotted:
        raise SystemExit("error: no run has in-training validation lines; set VAL_LOSS_EVERY to get curves")
    ax.set_xlabel("step")
    ax.set_ylabel("val_bpb")
    ax.set_title("validation curves (label: changed settings → final score)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="folder of run logs, e.g. logs")
    parser.add_argument("--png", type=Path, help="also write the validation curves to this PNG (needs matplotlib)")
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        raise SystemExit(f"error: {args.folder} is not a directory of run logs")
    runs, skipped = load_runs(args.folder)
    for reason in skipped:
        print(f"skipped {reason}", file=sys.stderr)
    if not runs:
        raise SystemExit(f"error: no train_gpt.py run logs (*.txt) in {args.folder}")
    print(table(runs))
    if args.png:
        plot_curves(runs, args.png)
        print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

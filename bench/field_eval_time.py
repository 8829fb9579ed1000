"""The evaluation's 600 s at 8xH100 for the field's two audited rows' configurations, from their own logs: what
each part took there, and what the built frontier (stack/) would take for the same passes at the field's speed.

    python bench/field_eval_time.py --field path/to/pr2014 --field path/to/pr2135   # copies of the PRs' folders
    python bench/field_eval_time.py --field ... --hints-seconds 10.9                # skip timing our hints
    python bench/field_eval_time.py --field ... --phase-factor 1.85   # our phase's padded rows, by their estimate

A folder's train_seed*.log lines give, per seed: the timed evaluation (`total_eval_time:`), the n-gram tilt's
hints built inside it (`ngram_tilt:precompute_done elapsed=`), the global phase's SGD (from `ttpp:` to `ttpr:`)
and the TTT loop (the rest). The built frontier scores the same positions (bench/field_conformance.py: the same
chunks, windows and targets) and runs the same global SGD; its tilt builds its hints in the time printed here
(timed on this machine's one thread, for a synthetic stream as long as the row's validation targets, as
bench/ngram_conformance.py builds it). What is not measured is our kernels' speed on a GPU against the field's
(FlashAttention 3, fused kernels): the last column is how much slower than the field's our TTT loop and SGD may
run and still fit the 600 s. Our global phase pads each context to a row where the field packs them
(GLOBAL_TTT_RESPECT_DOC_BOUNDARIES=1, stack/global-phases.diff): --phase-factor scales its seconds by the cost
that diff's header estimates.
"""

import argparse
import re
import time
from pathlib import Path

LIMIT_S = 600.0  # the challenge's evaluation limit
PATTERNS = {
    "total": r"^total_eval_time:([\d.]+)s$",
    "hints": r"^ngram_tilt:precompute_done elapsed=([\d.]+)s",
    "pause": r"^ttpp: phase:\d+/\d+ pd:\d+ gd:\d+ t:([\d.]+)s$",
    "resume": r"^ttpr: phase:\d+/\d+ t:([\d.]+)s$",
    "targets": r"^val_tokens: (\d+)$",
}


def read_seed(log: Path) -> dict:
    text = log.read_text(errors="replace")
    found = {key: re.findall(pattern, text, re.M) for key, pattern in PATTERNS.items()}
    seconds = {key: sum(float(value) for value in values) for key, values in found.items() if key != "targets"}
    if not found["total"]:
        raise SystemExit(f"{log}: no `total_eval_time:` line; give a folder of the field's train_seed*.log files")
    phase = seconds["resume"] - seconds["pause"]
    loop = seconds["total"] - seconds["hints"] - phase
    return dict(total=seconds["total"], hints=seconds["hints"], phase=phase, loop=loop,
                targets=int(found["targets"][-1]) if found["targets"] else None)


def our_hint_seconds(targets: int) -> float:
    """The built frontier's hints for a synthetic stream of this many targets, timed (bench/ngram_conformance.py)."""
    import ngram_conformance
    import torch
    torch.set_num_threads(1)
    fr = ngram_conformance.frontier()
    stream = ngram_conformance.synthetic_stream(targets, seed=1)
    t0 = time.perf_counter()
    ngram_conformance.ours(fr, stream)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--field", type=Path, action="append", required=True,
                        help="a folder of a field record's train_seed*.log files (repeat for each row)")
    parser.add_argument("--hints-seconds", type=float, help="our hints' build time, instead of timing it here")
    parser.add_argument("--phase-factor", type=float, default=1.0, help="our global phase's time over the field's")
    args = parser.parse_args()
    print(f"{'row':<10} {'seed log':<20} {'total':>7} {'hints':>7} {'phase':>7} {'loop':>7} | {'ours':>7} "
          f"{'margin':>7} {'slower ok':>9}")
    for folder in args.field:
        logs = sorted(folder.glob("train_seed*.log"))
        if not logs:
            raise SystemExit(f"--field {folder}: no train_seed*.log in it")
        for log in logs:
            seed = read_seed(log)
            hints = 0.0
            if seed["hints"]:  # the row tilts: ours builds the same hints inside the timer too
                if args.hints_seconds is None:
                    args.hints_seconds = our_hint_seconds(seed["targets"] or 47_851_520)
                hints = args.hints_seconds
            phase = seed["phase"] * args.phase_factor
            ours = seed["loop"] + phase + hints
            slower = (LIMIT_S - hints) / (seed["loop"] + phase)
            print(f"{folder.name:<10} {log.name:<20} {seed['total']:>7.1f} {seed['hints']:>7.1f} "
                  f"{seed['phase']:>7.1f} {seed['loop']:>7.1f} | {ours:>7.1f} {LIMIT_S - ours:>7.1f} "
                  f"{slower:>8.2f}x")
    print("seconds; total, hints, phase, loop: the field's log (hints inside its timer; phase: ttpp to ttpr); "
          f"ours: the same loop at the field's speed, its phase x {args.phase_factor:g}, plus our hints")
    if args.hints_seconds is not None:
        print(f"our hints: {args.hints_seconds:.1f} s (--hints-seconds, or timed here on one thread)")


if __name__ == "__main__":
    main()

"""Is a candidate a new record? A one-sided Welch t-test on per-seed scores.

    python records/compare.py records/track_cpu/2026-02-01_Candidate records/track_cpu/2026-01-01_Baseline
    python records/compare.py 2.5012,2.5031,2.4998 2.5124,2.5140,2.5101
    python records/compare.py --per-byte 1.2012,1.2031,1.1998 1.2124,1.2140,1.2101   # val_bpb values
    python records/compare.py records/track_10min_16mb/2026-12-01_Mine \
        ../parameter-golf/records/track_10min_16mb/2026-04-27_SP8192_LQER_SparseGate_BOSSmearFix_9HpStack_1.0611

Each side is a record folder, ours or one of the challenge's accepted folders (their submission.json's
seed_results: per-seed val_bpb, and val_loss where they give it), or comma-separated per-seed values. The
challenge's rule: the candidate's mean must be lower than the best's by at least MARGIN nats (0.005) with
p < ALPHA (0.01).

The unit: val_loss is nats per *token*, so two records with different tokenizers cannot be compared
in it (a bigger vocabulary, or CaseOps' case operators, make other tokens). Both sides are compared in
nats per *byte*, val_bpb * ln 2, with the same margin in that unit, when their tokenizers differ (our
logs name the tokenizer file and VOCAB_SIZE), when a side is one of the challenge's folders (whose logs
this tool does not read, so its tokenizer is unknown), when a side gives no val_loss, or with --per-byte;
the report names the unit used.
H0: mean(best) - mean(candidate) <= margin; H1: it is larger. Welch's test, since nothing makes two
setups' seed-to-seed variances equal. It also says how many candidate seeds would reach p < alpha
if the observed means and stds held, which is an estimate for planning, not a promise.
"""

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from scipy import stats

from runlog import LogError, parse_log

MARGIN_NATS = 0.005
ALPHA = 0.01
MAX_SEEDS = 1000


@dataclass
class Sample:
    label: str
    losses: list | None  # the compared values: nats per token (val_loss), or per byte once in_unit() converts
    bpbs: list | None = None  # per-seed val_bpb, when known
    tokenizer: str | None = None  # "<tokenizer file> vocab <N>", when known
    kind: str = "values"  # "values" typed in, "ours" (a folder with our logs), "challenge" (an accepted folder)

    @property
    def n(self) -> int:
        return len(self.losses)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.losses)

    @property
    def std(self) -> float:
        return statistics.stdev(self.losses)


@dataclass
class Comparison:
    candidate: Sample
    best: Sample
    margin: float
    alpha: float
    improvement: float  # mean(best) - mean(candidate), in the unit's nats
    t: float
    df: float
    p: float
    significant: bool
    seeds_needed: int | None  # candidate seeds for p < alpha at the observed means/stds, best's n fixed
    seeds_needed_both: int | None  # the same with n seeds on both sides
    unit: str = "nats per token (val_loss)"


def record_tokenizer(folder: Path, entries: list) -> str | None:
    """The tokenizer a record's runs used, from their logs' hyperparameters."""
    names = set()
    for entry in entries:
        try:
            names.add(parse_log(folder / entry["log"]).tokenizer)
        except (OSError, KeyError, LogError):
            return None
    return names.pop() if len(names) == 1 else None


def seed_entries(sub: dict) -> list:
    """Per-seed entries of a submission.json, in the order of its seeds list: seed_results keyed by seed, as the
    challenge's accepted folders and ours write them."""
    results = sub.get("seed_results")
    if not isinstance(results, dict) or not results:
        raise KeyError("seed_results")
    seeds = [str(s) for s in sub.get("seeds", [])]
    order = seeds if seeds and set(seeds) == set(results) else list(results)
    return [results[seed] for seed in order]


def load_sample(spec: str, values_are_bpb: bool = False) -> Sample:
    """A record folder (ours or the challenge's), a submission.json, or comma-separated values (val_loss, or val_bpb)."""
    path = Path(spec)
    if path.is_dir():
        path = path / "submission.json"
    if path.is_file():
        sub = json.loads(path.read_text())
        try:
            entries = seed_entries(sub)
            bpbs = [float(e["val_bpb"]) for e in entries]
        except (KeyError, TypeError, ValueError) as e:
            raise SystemExit(f"error: {path} has no per-seed seed_results with val_bpb ({e}); make it with "
                             f"records/make_record.py") from None
        losses = [float(e["val_loss"]) for e in entries] if all("val_loss" in e for e in entries) else None
        ours = all("log" in e for e in entries)
        return Sample(path.parent.name, losses, bpbs, record_tokenizer(path.parent, entries) if ours else None,
                      "ours" if ours else "challenge")
    try:
        values = [float(v) for v in spec.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"error: {spec!r} is neither a record folder nor comma-separated numbers "
                         f"like 2.5012,2.5031,2.4998") from None
    return Sample("values", None, values) if values_are_bpb else Sample("values", values)


def choose_unit(candidate: Sample, best: Sample, per_byte: bool) -> tuple[str, str]:
    """("byte" or "token", why): per token only when both sides can be read in the same per-token unit."""
    if per_byte:
        return "byte", "asked for"
    if "challenge" in (candidate.kind, best.kind):
        return "byte", "a side is a challenge folder, whose tokenizer this tool does not read"
    if candidate.losses is None or best.losses is None:
        return "byte", "a side gives no val_loss"
    if candidate.tokenizer and best.tokenizer and candidate.tokenizer != best.tokenizer:
        return "byte", "the tokenizers differ"
    return "token", ""


def in_unit(sample: Sample, unit: str) -> Sample:
    if unit == "token":
        if sample.losses is None:
            raise ValueError(f"{sample.label}: only val_bpb is known; compare per byte (--per-byte)")
        return sample
    if sample.bpbs is None:
        raise ValueError(f"{sample.label}: no val_bpb to compare per byte; give a record folder, or val_bpb "
                         "values with --per-byte")
    return Sample(sample.label, [b * math.log(2) for b in sample.bpbs], sample.bpbs, sample.tokenizer)


def welch_p(mean_best, std_best, n_best, mean_cand, std_cand, n_cand, margin):
    """One-sided Welch test of mean_best - mean_cand > margin from summary statistics."""
    result = stats.ttest_ind_from_stats(mean_best - margin, std_best, n_best, mean_cand, std_cand, n_cand,
                                        equal_var=False, alternative="greater")
    return result.statistic, result.pvalue


def seeds_needed(candidate: Sample, best: Sample, margin: float, alpha: float, both_sides: bool) -> int | None:
    """Smallest n at which the observed means and stds would give p < alpha. A search, since p is
    not monotone in the candidate's n alone: Welch's df falls towards the best's n - 1."""
    if best.mean - candidate.mean <= margin:
        return None  # no number of seeds makes an improvement below the margin significant
    for n in range(2, MAX_SEEDS + 1):
        n_best = n if both_sides else best.n
        _, p = welch_p(best.mean, best.std, n_best, candidate.mean, candidate.std, n, margin)
        if p < alpha:
            return n
    return None


def compare(candidate: Sample, best: Sample, margin=MARGIN_NATS, alpha=ALPHA) -> Comparison:
    for sample in (candidate, best):
        if sample.n < 2:
            raise ValueError(f"{sample.label}: {sample.n} seed(s); a t-test needs at least 2 per side (3 is usual)")
    if candidate.std == 0 and best.std == 0:
        raise ValueError("both sides have zero spread across seeds; the t-test is undefined (are the seeds really "
                         "different runs?)")
    # scipy's test of mean(a) - mean(b) > 0; shifting the best by the margin tests the margin.
    result = stats.ttest_ind([x - margin for x in best.losses], candidate.losses, equal_var=False,
                             alternative="greater")
    return Comparison(candidate, best, margin, alpha, best.mean - candidate.mean, float(result.statistic),
                      float(result.df), float(result.pvalue), bool(result.pvalue < alpha),
                      seeds_needed(candidate, best, margin, alpha, both_sides=False),
                      seeds_needed(candidate, best, margin, alpha, both_sides=True))


def compare_samples(candidate: Sample, best: Sample, per_byte=False, margin=MARGIN_NATS, alpha=ALPHA) -> Comparison:
    """The test in the unit the two sides allow (see the module docstring); the unit is named in the result."""
    unit, why = choose_unit(candidate, best, per_byte)
    c = compare(in_unit(candidate, unit), in_unit(best, unit), margin, alpha)
    if unit == "byte":
        c.unit = f"nats per byte (val_bpb * ln 2; {why})"
    elif not (candidate.tokenizer and best.tokenizer):
        c.unit += "; a side's tokenizer is unknown: this is only valid if both used the same one"
    return c


def report(c: Comparison) -> str:
    lines = [f"unit: {c.unit}",
             f"{'':10} {'n':>3} {'mean':>14} {'std':>10}  source"]
    for role, s in (("candidate", c.candidate), ("best", c.best)):
        lines.append(f"{role:10} {s.n:>3} {s.mean:>14.6f} {s.std:>10.6f}  {s.label}"
                     + (f" ({s.tokenizer})" if s.tokenizer else ""))
    lines += [
        f"improvement {c.improvement:+.6f} nats (needs > {c.margin})",
        f"Welch t = {c.t:.3f}, df = {c.df:.2f}, one-sided p = {c.p:.4g}",
        f"verdict: {'SIGNIFICANT' if c.significant else 'not significant'} at p < {c.alpha}",
    ]
    if c.improvement <= c.margin:
        lines.append(f"seeds needed: none would do; the observed improvement is not above {c.margin} nats")
    else:
        fixed = (f"{c.seeds_needed} candidate seeds against the best's {c.best.n}" if c.seeds_needed else
                 f"none up to {MAX_SEEDS} candidate seeds against the best's {c.best.n} (its spread limits the test)")
        both = f"{c.seeds_needed_both} on each side" if c.seeds_needed_both else f"over {MAX_SEEDS} on each side"
        lines.append(f"seeds needed at the observed means and stds: {fixed}; {both}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("candidate", help="record folder, submission.json, or val_losses like 2.50,2.51,2.49")
    parser.add_argument("best", help="the current best, in the same forms")
    parser.add_argument("--margin", type=float, default=MARGIN_NATS, help="required improvement in nats")
    parser.add_argument("--alpha", type=float, default=ALPHA, help="significance level")
    parser.add_argument("--per-byte", action="store_true",
                        help="compare nats per byte (val_bpb * ln 2); comma-separated values are then val_bpb")
    args = parser.parse_args(argv)
    candidate = load_sample(args.candidate, args.per_byte)
    best = load_sample(args.best, args.per_byte)
    try:
        c = compare_samples(candidate, best, args.per_byte, args.margin, args.alpha)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    print(report(c))
    return 0 if c.significant else 1


if __name__ == "__main__":
    sys.exit(main())

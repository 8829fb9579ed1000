"""Is a candidate a new record? A one-sided Welch t-test on per-seed scores, the challenge's way.

    python tools/compare.py records/track_cpu/2026-02-01_Candidate records/track_cpu/2026-01-01_Base
    python tools/compare.py 2.5012,2.5031,2.4998 2.5124,2.5140,2.5101      # val_loss values
    python tools/compare.py --per-byte 1.2012,1.2031,1.1998 1.2124,1.2140,1.2101   # val_bpb
    python tools/compare.py ../parameter-golf/records/track_10min_16mb/2026-04-10_VarLenAttn \\
        ../parameter-golf/records/track_10min_16mb/2026-04-09_SP8192_3LayerRecur_ParResid_QK525_LegalTTT

Each side is a record folder (ours, or one of the challenge's), a submission.json, or
comma-separated per-seed values. A folder's per-seed values come from its submission.json, in
any shape the field wrote (`seed_results` keyed by seed, `seeds` as such a dict), and what it
lacks (val_loss, often) from the folder's logs, matched by seed; with no per-seed results at all,
from one log per seed. The report says where each side's values came from.

The challenge's rule: the candidate's mean val_loss must be lower than the best's by at least
MARGIN (0.005) nats per token, at p < ALPHA (0.01), "as in modded-nanogpt". That is the test
when both sides used the same tokenizer (named in their logs, or a tokenizer file in the folder).
Across tokenizers val_loss is not one unit (a bigger vocabulary makes fewer, harder tokens), so
the test is on nats per byte, val_bpb * ln 2, with the margin converted at the candidate's bytes
per token (mean val_loss / (val_bpb * ln 2) over its seeds). Per byte too when a side gives no
val_loss, when a challenge folder's tokenizer is unknown, or with --per-byte. When a side is
bare values of unknown tokenizer, per token, and the report says it assumes one tokenizer.
Both readings are printed when both can be made, so the verdict's unit shows.

H0: mean(best) - mean(candidate) <= margin; H1: it is larger. Welch's test, since nothing makes
two setups' seed-to-seed variances equal. It also says how many candidate seeds would reach
p < alpha if the observed means and stds held: an estimate for planning, not a promise.
"""

import argparse
import json
import math
import statistics
import sys
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from scipy import stats

from runlog import (claimed_line, distinct_runs, matching_run, number_or_none, per_seed_results,
                    read_logs, seed_label, submission_path)

MARGIN_NATS = 0.005
ALPHA = 0.01
MAX_SEEDS = 1000
TOKEN_UNIT = "nats per token (val_loss)"
BYTE_UNIT = "nats per byte (val_bpb * ln 2"


@dataclass
class Sample:
    label: str
    losses: list | None  # the compared values: val_loss, or per byte once in_unit() converts
    bpbs: list | None = None  # per-seed val_bpb, when known
    tokenizer: str | None = None  # "<tokenizer file> vocab <N>", when known
    kind: str = "values"  # "values" typed in, "ours" (our logs), "challenge" (the field's)
    source: str = ""  # where a folder's per-seed values came from

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
    seeds_needed: int | None  # candidate seeds for p < alpha at the observed stats
    seeds_needed_both: int | None  # the same with n seeds on both sides
    unit: str = TOKEN_UNIT
    margin_text: str = ""  # how the margin was converted, per byte
    note: str = ""  # why this reading does not decide, when it does not


# ---- PER-SEED VALUES OF A RECORD FOLDER ----

def seed_order(sub: dict, entries: dict) -> list[str]:
    """The seeds of per-seed results, in the order of the `seeds` list when it names them."""
    listed = sub.get("seeds")
    if isinstance(listed, list):
        seeds = [str(s) for s in listed]
        if set(seeds) == set(entries):
            return seeds
    return list(entries)


def one_run_per_seed(runs: list, folder: Path) -> dict:
    """{seed: its log} when submission.json gives no per-seed results."""
    by_seed = {}
    for run in runs:
        by_seed.setdefault(seed_label(run), []).append(run)
    for seed, logs in by_seed.items():
        if len(logs) > 1:
            names = ", ".join(r.path.name for r in logs)
            raise SystemExit(f"error: {folder}: {len(logs)} logs of seed {seed} ({names}) and "
                             f"no per-seed results in its submission.json; compare "
                             f"comma-separated values instead")
    return {seed: logs[0] for seed, logs in by_seed.items()}


def folder_tokenizer(folder: Path, runs: list) -> str | None:
    """The tokenizer the runs name, else the one tokenizer file the folder holds."""
    named = {r.tokenizer for r in runs} - {None}
    if len(named) == 1:
        return named.pop()
    if named:
        return None
    models = sorted(folder.glob("*.model")) + sorted(folder.glob("tokenizers/**/*.model"))
    return models[0].name if len(models) == 1 else None


def pick(entry: dict, run, key: str, sources: dict):
    """One seed's value: submission.json's, else its log's; `sources` notes which."""
    value = number_or_none(entry.get(key))
    if value is not None:
        sources[key].add("submission.json")
        return value
    if run is None:
        return None
    line = claimed_line(run, number_or_none(entry.get("val_bpb")))
    if line.get(key) is None:
        return None
    sources[key].add("logs")
    return line[key]


def record_sample(folder: Path) -> Sample:
    """Per-seed val_bpb and val_loss of a record folder (see the module docstring)."""
    path = submission_path(folder)
    sub = json.loads(path.read_text()) if path else {}
    runs, _ = read_logs(folder)
    runs = distinct_runs([r for r in runs if r.finished])
    entries = per_seed_results(sub)
    if entries:
        seeds = seed_order(sub, entries)
        picked = {s: matching_run(runs, s, entries[s]) for s in seeds}
    else:
        picked = one_run_per_seed(runs, folder)
        entries = {seed: {} for seed in picked}
    if not picked:
        raise SystemExit(f"error: {folder}: no per-seed results (seed_results, or seeds as a "
                         f"dict, in submission.json) and no finished run log")
    sources = {"val_bpb": set(), "val_loss": set()}
    bpbs = [pick(entries[s], run, "val_bpb", sources) for s, run in picked.items()]
    losses = [pick(entries[s], run, "val_loss", sources) for s, run in picked.items()]
    used = [run for run in picked.values() if run is not None]
    kind = "ours" if any(run.ours for run in runs) else "challenge"
    words = [f"{key}: {', '.join(sorted(how))}" for key, how in sources.items() if how]
    return Sample(folder.name, None if None in losses else losses,
                  None if None in bpbs else bpbs, folder_tokenizer(folder, used or runs),
                  kind, "; ".join(words))


def load_sample(spec: str, values_are_bpb: bool = False) -> Sample:
    """A record folder, a submission.json, or comma-separated values (val_loss, or val_bpb)."""
    path = Path(spec)
    if path.is_file():
        path = path.parent
    if path.is_dir():
        return record_sample(path)
    try:
        values = [float(v) for v in spec.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"error: {spec!r} is neither a record folder nor comma-separated "
                         f"numbers like 2.5012,2.5031,2.4998") from None
    if values_are_bpb:
        return Sample("values", None, values)
    return Sample("values", values)


# ---- THE TEST ----

def choose_unit(candidate: Sample, best: Sample, per_byte: bool) -> tuple[str, str]:
    """("token" or "byte", why): per token only where both sides are in one per-token unit."""
    if per_byte:
        return "byte", "asked for"
    for sample in (candidate, best):
        if sample.losses is None:
            return "byte", f"{sample.label} gives no val_loss"
    if candidate.tokenizer and best.tokenizer:
        if candidate.tokenizer != best.tokenizer:
            return "byte", "the tokenizers differ"
        return "token", f"both used {candidate.tokenizer}"
    for sample in (candidate, best):
        if sample.kind == "challenge" and not sample.tokenizer:
            return "byte", f"the tokenizer of {sample.label} is unknown"
    return "token", ("a side's tokenizer is unknown: this is only valid if both used "
                     "the same one")


def in_unit(sample: Sample, unit: str) -> Sample:
    if unit == "token":
        if sample.losses is None:
            raise ValueError(f"{sample.label}: only val_bpb is known; compare per byte "
                             f"(--per-byte)")
        return sample
    if sample.bpbs is None:
        raise ValueError(f"{sample.label}: no val_bpb to compare per byte; give a record "
                         f"folder, or val_bpb values with --per-byte")
    per_byte = [b * math.log(2) for b in sample.bpbs]
    return replace(sample, losses=per_byte)


def byte_margin(candidate: Sample, margin: float) -> tuple[float, str]:
    """The per-token margin in nats per byte, at the candidate's bytes per token."""
    if candidate.losses is None or candidate.bpbs is None:
        return margin, (f"{margin} nats per byte (the candidate gives no val_loss to "
                        f"convert the per-token margin)")
    ratios = [loss / (bpb * math.log(2)) for loss, bpb in zip(candidate.losses, candidate.bpbs)]
    bytes_per_token = statistics.fmean(ratios)
    converted = margin / bytes_per_token
    return converted, (f"{converted:.6f} nats per byte: {margin} nats per token at the "
                       f"candidate's {bytes_per_token:.3f} bytes per token")


def welch_p(mean_best, std_best, n_best, mean_cand, std_cand, n_cand, margin):
    """One-sided Welch test of mean_best - mean_cand > margin from summary statistics."""
    result = stats.ttest_ind_from_stats(mean_best - margin, std_best, n_best, mean_cand,
                                        std_cand, n_cand, equal_var=False,
                                        alternative="greater")
    return result.statistic, result.pvalue


def seeds_needed(candidate: Sample, best: Sample, margin: float, alpha: float,
                 both_sides: bool) -> int | None:
    """Smallest n at which the observed means and stds would give p < alpha. A search,
    since p is not monotone in the candidate's n alone: Welch's df falls towards the
    best's n - 1."""
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
            raise ValueError(f"{sample.label}: {sample.n} seed(s); a t-test needs at least "
                             f"2 per side (3 is usual)")
    if candidate.std == 0 and best.std == 0:
        raise ValueError("both sides have zero spread across seeds; the t-test is undefined "
                         "(are the seeds really different runs?)")
    # scipy's test of mean(a) - mean(b) > 0; shifting the best by the margin tests the margin
    shifted = [x - margin for x in best.losses]
    with warnings.catch_warnings():
        # scipy warns of precision when one side's seeds are equal; its std is exactly 0
        warnings.simplefilter("ignore", RuntimeWarning)
        result = stats.ttest_ind(shifted, candidate.losses, equal_var=False,
                                 alternative="greater")
    p = float(result.pvalue)
    return Comparison(candidate, best, margin, alpha, best.mean - candidate.mean,
                      float(result.statistic), float(result.df), p, bool(p < alpha),
                      seeds_needed(candidate, best, margin, alpha, both_sides=False),
                      seeds_needed(candidate, best, margin, alpha, both_sides=True))


def reading(candidate: Sample, best: Sample, unit: str, why: str, margin: float,
            alpha: float) -> Comparison:
    """The test in one unit: per token at the margin, or per byte at the converted margin."""
    if unit == "token":
        c = compare(in_unit(candidate, unit), in_unit(best, unit), margin, alpha)
        c.unit = TOKEN_UNIT + (f"; {why}" if why else "")
        c.margin_text = f"{margin} nats per token"
        return c
    converted, how = byte_margin(candidate, margin)
    c = compare(in_unit(candidate, unit), in_unit(best, unit), converted, alpha)
    c.unit = f"{BYTE_UNIT}; {why})" if why else BYTE_UNIT + ")"
    c.margin_text = how
    return c


def readings(candidate: Sample, best: Sample, per_byte=False, margin=MARGIN_NATS,
             alpha=ALPHA) -> list[Comparison]:
    """The deciding reading (see choose_unit), then the other one where it can be made."""
    unit, why = choose_unit(candidate, best, per_byte)
    decisive = reading(candidate, best, unit, why, margin, alpha)
    other_unit = "byte" if unit == "token" else "token"
    try:
        other = reading(candidate, best, other_unit, "", margin, alpha)
    except ValueError:
        return [decisive]
    if unit == "token":
        other.note = "the same test per byte, at the converted margin"
    elif why == "asked for":
        other.note = "per token, the challenge's unit where both share a tokenizer"
    else:
        other.note = f"not comparable: {why}"
    return [decisive, other]


def compare_samples(candidate: Sample, best: Sample, per_byte=False, margin=MARGIN_NATS,
                    alpha=ALPHA) -> Comparison:
    """The test in the unit the two sides allow (see the module docstring)."""
    unit, why = choose_unit(candidate, best, per_byte)
    return reading(candidate, best, unit, why, margin, alpha)


# ---- THE REPORT ----

def sample_line(role: str, s: Sample) -> str:
    about = [x for x in (s.tokenizer, s.source) if x]
    label = s.label + (f" ({'; '.join(about)})" if about else "")
    return f"{role:10} {s.n:>3} {s.mean:>14.6f} {s.std:>10.6f}  {label}"


def seeds_line(c: Comparison) -> str:
    if c.improvement <= c.margin:
        return (f"seeds needed: none would do; the observed improvement is not above "
                f"{c.margin:.6g} nats")
    n_best = c.best.n
    if c.seeds_needed:
        fixed = f"{c.seeds_needed} candidate seeds against the best's {n_best}"
    else:
        fixed = (f"none up to {MAX_SEEDS} candidate seeds against the best's {n_best} "
                 f"(its spread limits the test)")
    both = f"over {MAX_SEEDS} on each side"
    if c.seeds_needed_both:
        both = f"{c.seeds_needed_both} on each side"
    return f"seeds needed at the observed means and stds: {fixed}; {both}"


def verdict_word(c: Comparison) -> str:
    return "SIGNIFICANT" if c.significant else "not significant"


def reading_line(c: Comparison) -> str:
    unit = c.unit.split(" (")[0]
    text = (f"  {unit}: improvement {c.improvement:+.6f} (needs > {c.margin:.6f}), "
            f"p = {c.p:.4g}, {verdict_word(c)}")
    return text + (f"; {c.note}" if c.note else "")


def report(c: Comparison, others=()) -> str:
    lines = [f"unit: {c.unit}",
             f"{'':10} {'n':>3} {'mean':>14} {'std':>10}  source",
             sample_line("candidate", c.candidate),
             sample_line("best", c.best),
             f"improvement {c.improvement:+.6f} nats (needs > {c.margin_text})",
             f"Welch t = {c.t:.3f}, df = {c.df:.2f}, one-sided p = {c.p:.4g}",
             f"verdict: {verdict_word(c)} at p < {c.alpha}",
             seeds_line(c)]
    if others:
        lines.append("both readings (the first decides):")
        lines += [reading_line(x) for x in (c, *others)]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("candidate", help="record folder, submission.json, or val_losses "
                                          "like 2.50,2.51,2.49")
    parser.add_argument("best", help="the current best, in the same forms")
    parser.add_argument("--margin", type=float, default=MARGIN_NATS,
                        help="required improvement in nats per token")
    parser.add_argument("--alpha", type=float, default=ALPHA, help="significance level")
    parser.add_argument("--per-byte", action="store_true",
                        help="compare nats per byte (val_bpb * ln 2); comma-separated values "
                             "are then val_bpb")
    args = parser.parse_args(argv)
    candidate = load_sample(args.candidate, args.per_byte)
    best = load_sample(args.best, args.per_byte)
    try:
        found = readings(candidate, best, args.per_byte, args.margin, args.alpha)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    print(report(found[0], found[1:]))
    return 0 if found[0].significant else 1


if __name__ == "__main__":
    sys.exit(main())

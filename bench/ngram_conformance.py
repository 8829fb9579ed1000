"""The n-gram tilt (stack/ngram-tilt.diff) against the field's own code, position by position, and the hints'
build time. The field's code (#2135's online_ngram_state.c and online_ngram_tilt.py) is not in this repository:
--field names a folder that holds it; its C helper is built there (gcc) if it is missing or older than its source.

    python bench/ngram_conformance.py --field path/to/pr2135      # a copy of PR #2135's record folder
    python bench/ngram_conformance.py --time-tokens 47851520                   # our hints alone, timed
    python bench/ngram_conformance.py --time-tokens 47851520 --field DIR       # and the field's walk beside them

Each stream (a synthetic one: vocabulary 8192, Zipf-like tokens, BOS-led documents, phrases that recur across
them; and each --val shard, by default the sotu validation split of vocabulary 8192 where data/ has it) goes
through the field's build_hints_for_targets (its channels as #2135 runs them) and through the built frontier's
ngram_hints; the field's C walk also gives the top token and share at every target. Printed: the counts (targets,
hints, gates), the positions where the two differ (shares bit for bit, top tokens, gates, hint ids under the
gate) and the first of them, and where a difference's context shares the field's 64-bit key (an XOR of its tokens
times constants) with another context, that too. Then the tilted loss of random logits at every gated target
and as many others, the field's apply_tilt_to_ptl_torch_fast against our tilt, each with its own hints.
"""

import argparse
import io
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from field_conformance import frontier  # noqa: E402  (the built frontier, imported)

ORDER = 16
THRESHOLD = 0.8
BOOST = 2.625
VOCAB = 8192
TOKENIZER = ROOT / "data" / "tokenizers" / "sotu_8192_bpe.model"
SOTU_VAL = ROOT / "data" / "datasets" / "sotu_sp8192" / "fineweb_val_000000.bin"
# the field's context key (online_ngram_state.c): XOR over the ring, oldest first, of token * these
FIELD_KEY_COEFFS = np.array([36313, 27191, 51647, 81929, 131071, 196613, 262147, 393241, 524309, 655373, 786433,
                             917521, 1048583, 1179653, 1310729, 1441801], dtype=np.uint64)


def synthetic_stream(length: int, seed: int = 0) -> np.ndarray:
    """length tokens of a vocabulary of 8192: Zipf-like draws, 5% of them overwritten by phrases of 8 to 64 tokens
    (5,000 phrases, a few popular), a BOS (1) starting each document (about 700 tokens long)."""
    g = np.random.default_rng(seed)
    weights = np.arange(1, VOCAB - 1, dtype=np.float64) ** -1.1
    stream = (2 + np.searchsorted(np.cumsum(weights / weights.sum()), g.random(length))).astype(np.uint16)
    stream = np.minimum(stream, VOCAB - 1)
    phrases = [stream[g.integers(0, length - 64):][:int(g.integers(8, 65))].copy() for _ in range(5000)]
    popularity = np.arange(1, 5001, dtype=np.float64) ** -1.0
    count = int(0.05 * length / 36)
    starts = g.integers(0, max(1, length - 64), count)
    for start, which in zip(starts, g.choice(5000, count, p=popularity / popularity.sum())):
        phrase = phrases[which]
        stream[start:start + phrase.size] = phrase
    bos = np.cumsum(g.geometric(1 / 700, length // 300 + 1))
    stream[bos[bos < length]] = 1
    stream[0] = 1
    return stream


def read_shard(path: Path) -> np.ndarray:
    num_tokens = int(np.fromfile(path, dtype="<i4", count=3)[2])
    return np.fromfile(path, dtype="<u2", offset=256 * 4, count=num_tokens)


def load_field(folder: Path):
    sys.path.insert(0, str(folder))
    import online_ngram_tilt
    return online_ngram_tilt


def field_walk(field, targets: np.ndarray, vocab: int, tokenizer: Path):
    """The field's C walk as build_hints_for_targets sets it up: (top tokens, shares) at every target."""
    _, starts_word, boundary = field.build_piece_luts(tokenizer_path=str(tokenizer), vocab_size=vocab)
    state = field.OnlineNgramState(
        lib=field.ensure_online_ngram_lib(print), token_ctx_len=ORDER - 1,
        token_table_bits=field.suggest_table_bits(targets.size, load_factor=0.55),
        within_table_bits=field.suggest_table_bits(max(targets.size // 2, 1), load_factor=0.60),
        starts_new_word_lut=starts_word, boundary_lut=boundary, seed_prefix_token=int(targets[0]))
    top_tokens, shares = state.process_chunk(targets)[:2]
    state.close()
    return top_tokens.astype(np.int64), shares


def field_keys(targets: np.ndarray) -> np.ndarray:
    """The field's 64-bit key of each target's context (targets ORDER - 2 on; its ring seeded with targets[0])."""
    span = ORDER - 1
    ring = np.concatenate([targets[:1], targets]).astype(np.uint64)
    windows = ring.size - span
    keys = np.zeros(windows, dtype=np.uint64)
    for j in range(span):
        keys ^= ring[j:j + windows] * FIELD_KEY_COEFFS[j]
    return keys


def shared_keys(targets: np.ndarray) -> np.ndarray:
    """Whether each target's context has a field key that a different context has too, anywhere in the stream
    (contexts told apart by a second hash: 64-bit, polynomial, odd random base; a diagnostic)."""
    span = ORDER - 1
    keys = field_keys(targets)
    ring = np.concatenate([targets[:1], targets]).astype(np.uint64)
    windows = keys.size
    second = np.zeros(windows, dtype=np.uint64)
    base = np.uint64(0x9E3779B97F4A7C15)
    for j in range(span):
        second = second * base + ring[j:j + windows] + np.uint64(1)
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    start = np.r_[True, ordered[1:] != ordered[:-1]]
    run = np.cumsum(start) - 1
    first = np.maximum.accumulate(np.where(start, np.arange(windows), 0))
    mixed = np.zeros(run[-1] + 1, dtype=bool)
    mixed[run[second[order] != second[order][first]]] = True
    shared = np.zeros(targets.size, dtype=bool)
    shared[span - 1 + order] = mixed[run]
    return shared


def contexts(targets: np.ndarray) -> np.ndarray:
    span = ORDER - 1
    ring = np.concatenate([targets[:1], targets])
    return np.lib.stride_tricks.sliding_window_view(ring, span)[:targets.size - span + 1]


def collision(targets: np.ndarray, keys: np.ndarray, i: int) -> str:
    """Whether target i's context shares the field's key with a different context before it."""
    span = ORDER - 1
    w = i - (span - 1)
    if w < 0:
        return "no context"
    earlier = np.flatnonzero(keys[:w] == keys[w])
    windows = contexts(targets)
    others = [e for e in earlier if not np.array_equal(windows[e], windows[w])]
    if not others:
        return f"its key is its own ({earlier.size} earlier occurrences of the same context)"
    return (f"its key {int(keys[w]):#x} is also that of the different context of target {others[0] + span - 1} "
            f"({len(others)} earlier positions of other contexts share it)")


def ours(fr, stream: np.ndarray):
    ids, shares = fr.ngram_hints(torch.from_numpy(stream.astype(np.int64)), ORDER)
    gated = shares >= torch.tensor(THRESHOLD, dtype=torch.float32)
    return ids.numpy(), shares.numpy(), gated.numpy()


def compare_hints(name, targets, field_top, field_shares, field_pkg, mine):
    """Prints the counts and differences; returns the differing positions."""
    ids, shares, gated = mine
    hinted_field = field_shares > 0
    share_diff = np.flatnonzero(field_shares.view(np.uint32) != shares.view(np.uint32))
    top_diff = np.flatnonzero((field_top != ids) & (hinted_field | (shares > 0)))
    print(f"{name}: targets {targets.size:,}; with a hint: field {int(hinted_field.sum()):,}, ours "
          f"{int((shares > 0).sum()):,}; shares differ at {share_diff.size:,}, top tokens at {top_diff.size:,}")
    if field_pkg is not None:
        gate_diff = np.flatnonzero(field_pkg["gate_mask"] != gated)
        both = field_pkg["gate_mask"] & gated
        id_diff = int((field_pkg["hint_ids"][both] != ids[both]).sum())
        boosts = sorted(set(field_pkg["boost"][field_pkg["gate_mask"]].tolist()))
        print(f"{name}: gated: field {int(field_pkg['gate_mask'].sum()):,}, ours {int(gated.sum()):,}; gates differ "
              f"at {gate_diff.size:,}; hint ids differ at {id_diff:,} gated positions; the field's boosts there "
              f"{boosts}")
    else:
        field_gated = field_shares >= np.float32(THRESHOLD)
        print(f"{name}: gated: field {int(field_gated.sum()):,}, ours {int(gated.sum()):,}; gates differ at "
              f"{int((field_gated != gated).sum()):,}")
    differing = np.union1d(share_diff, top_diff)
    if differing.size:
        i = int(differing[0])
        keys = field_keys(targets)
        print(f"{name}: first difference at target {i}: field (hint {field_top[i]}, share {field_shares[i]!r}), ours "
              f"(hint {ids[i]}, share {shares[i]!r}); context {targets[max(0, i - ORDER + 1):i].tolist()}; "
              f"{collision(targets, keys, i)}")
        shared = shared_keys(targets)
        explained = int(shared[differing].sum())
        print(f"{name}: {explained:,} of the {differing.size:,} differences are at a context whose field key a "
              f"different context has too ({int(shared.sum()):,} targets have such a context); "
              f"{differing.size - explained:,} elsewhere")
    else:
        print(f"{name}: no difference")
    return differing


def compare_tilt(name, fr, field, targets, field_pkg, mine, seed=0):
    """The tilted loss of random logits at every gated target and as many others: field vs ours, apart where the
    two agree on the gate and the hint and where they do not."""
    ids, _, gated = mine
    g = np.random.default_rng(seed)
    field_gated = field_pkg["gate_mask"]
    gated_at = np.flatnonzero(field_gated | gated)
    others = g.choice(np.flatnonzero(~(field_gated | gated)), min(gated_at.size, int((~gated).sum())), replace=False)
    rows = np.sort(np.concatenate([gated_at, others]))
    agree = (field_gated == gated) & (~gated | (field_pkg["hint_ids"] == ids))
    generator = torch.Generator().manual_seed(seed)
    found = {True: [0, 0, 0.0], False: [0, 0, 0.0]}  # agreeing or not: positions, equal bit for bit, max |diff|
    sums = np.zeros(2)
    for lo in range(0, rows.size, 4096):
        at = torch.from_numpy(rows[lo:lo + 4096])
        logits = torch.randn(at.numel(), VOCAB, generator=generator) * 3
        log_p = torch.log_softmax(logits, -1)
        y = torch.from_numpy(targets.astype(np.int64))[at]
        losses = -log_p.gather(1, y[:, None])[:, 0]
        field_ids = torch.from_numpy(field_pkg["hint_ids"])[at]
        our_ids = torch.from_numpy(ids)[at]
        theirs = field.apply_tilt_to_ptl_torch_fast(
            ptl=losses, log_q_hint=log_p.gather(1, field_ids[:, None])[:, 0], target_ids=y, hint_ids=field_ids,
            gate_mask=torch.from_numpy(field_gated)[at], boost=torch.from_numpy(field_pkg["boost"])[at])
        ours_ = fr.tilt(losses, log_p.gather(1, our_ids[:, None])[:, 0], y, our_ids, torch.from_numpy(gated)[at],
                        BOOST)
        same = torch.from_numpy(agree)[at]
        for kind in (True, False):
            where = same == kind
            found[kind][0] += int(where.sum())
            found[kind][1] += int((theirs[where].view(torch.int32) == ours_[where].view(torch.int32)).sum())
            if where.any():
                found[kind][2] = max(found[kind][2], float((theirs[where] - ours_[where]).abs().max()))
        sums += [float(theirs.double().sum()), float(ours_.double().sum())]
    print(f"{name}: tilted loss of random logits at {rows.size:,} targets ({gated_at.size:,} gated by either): where "
          f"gate and hint agree, {found[True][1]:,} of {found[True][0]:,} equal bit for bit (max |field - ours| "
          f"{found[True][2]:.3g}); where they differ, {found[False][0]:,} (max |field - ours| {found[False][2]:.3g}); "
          f"sums field {sums[0]:.6f} ours {sums[1]:.6f}")


def ring_seed(fr, field, tokenizer):
    """Which first context the field's C code computes: a stream where 'a a b1 .. b13' recurs, which is target 14's
    context only if the ring starts with targets[0] (a); with the stream's first token (BOS), it is 'BOS a b1 ..'."""
    a, c, d = 5, 6, 7
    stream = np.array([1, a, *range(10, 23), c, 30, 31, 32, a, a, *range(10, 23), d], dtype=np.uint16)
    field_top, field_shares = field_walk(field, stream[1:], VOCAB, tokenizer)
    ids, shares, _ = ours(fr, stream)
    print(f"ring seed: after a second 'a a b1 .. b13' the field hints {field_top[-1]} (share {field_shares[-1]}), ours "
          f"{ids[-1]} (share {shares[-1]}); target 14 was {c}: both seed the ring with targets[0]"
          if (field_top[-1], ids[-1]) == (c, c) else "ring seed: the field and ours differ on target 14's context")


def conformance(fr, field, name, stream, tokenizer):
    targets = stream[1:]
    field_top, field_shares = field_walk(field, targets, VOCAB, tokenizer)
    log = io.StringIO()
    with redirect_stdout(log):
        pkg = field.build_hints_for_targets(
            target_token_ids_np=targets, tokenizer_path=str(tokenizer), vocab_size=VOCAB, token_order=ORDER,
            token_threshold=THRESHOLD, token_boost=BOOST, within_tau=99.0, within_boost=0.0, word_tau=99.0,
            word_boost=0.0, agree_add_boost=0.0)
    print(f"{name}: field: {log.getvalue().strip()}")
    mine = ours(fr, stream)
    lines = []
    run = SimpleNamespace(hp=fr.Hyperparameters(token_order=ORDER, token_threshold=THRESHOLD),
                          layout=fr.Layout(), val=SimpleNamespace(tokens=torch.from_numpy(stream.astype(np.int32))),
                          log=lines.append)
    fr.tilt_hints(run)
    print(f"{name}: ours:  {lines[0]}")
    compare_hints(name, targets, field_top, field_shares, pkg, mine)
    compare_tilt(name, fr, field, targets, pkg, mine)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--field", type=Path, help="a folder holding online_ngram_state.c and online_ngram_tilt.py")
    parser.add_argument("--tokens", type=int, default=1_000_000, help="the synthetic stream's length")
    parser.add_argument("--val", type=Path, nargs="*", default=[SOTU_VAL] if SOTU_VAL.exists() else [],
                        help="validation shards (vocabulary 8192) to compare on as well")
    parser.add_argument("--tokenizer", type=Path, default=TOKENIZER,
                        help="a SentencePiece model of 8192 pieces, for the field's (unused) word channels' tables")
    parser.add_argument("--time-tokens", type=int, default=0, help="time our hints on a synthetic stream this long")
    args = parser.parse_args()
    torch.set_num_threads(1)
    fr = frontier()
    field = load_field(args.field) if args.field else None
    if args.time_tokens:
        stream = synthetic_stream(args.time_tokens, seed=1)
        t0 = time.perf_counter()
        ids, shares, gated = ours(fr, stream)
        seconds = time.perf_counter() - t0
        print(f"ours: {args.time_tokens:,} tokens (vocabulary {VOCAB}): hints in {seconds:.1f} s on "
              f"{torch.get_num_threads()} thread(s); with a hint {int((shares > 0).sum()):,}, gated "
              f"{int(gated.sum()):,} ({gated.mean():.3%})")
        if field is not None:
            t0 = time.perf_counter()
            field_top, field_shares = field_walk(field, stream[1:], VOCAB, args.tokenizer)
            print(f"field: its C walk (the token channel and the within-word tables, no word loop) in "
                  f"{time.perf_counter() - t0:.1f} s")
            compare_hints("timed stream", stream[1:], field_top, field_shares, None, (ids, shares, gated))
        return
    if field is None:
        parser.error("--field DIR (the field's code), or --time-tokens N")
    ring_seed(fr, field, args.tokenizer)
    conformance(fr, field, "synthetic", synthetic_stream(args.tokens), args.tokenizer)
    for path in args.val:
        conformance(fr, field, path.parent.name, read_shard(path), args.tokenizer)


if __name__ == "__main__":
    main()

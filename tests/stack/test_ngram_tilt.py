"""ngram-tilt (stack/ngram-tilt.diff), on the built frontier: #2135's token n-gram tilt of LoRA TTT's score. The
hints are those of the field's walk, written out here in plain Python (its ring's seed too), and read only the
stream before their target; the tilt is the loss of the renormalized distribution; in the TTT pass each hint
meets its own target, every target is scored once, the adapters train on the untilted loss, a change to a target
moves no score that comes before it in both orders, and off (or with TOKEN_BOOST=0) the pass is what it was, bit
for bit. The field's other channels are refused where they would compute anything."""

import copy
import re
from collections import defaultdict

import numpy as np
import pytest
import torch

from conftest import CHUNK, ROOT, VAL_BATCH, random_model
from stack.conftest import build_into, build_trainer, built_env, frontier_all_on, import_trainer, launch

TILT = dict(ttt_enabled=True, ngram_tilt_enabled=True, token_order=4)
# #2135's command, its tilt's names as it sets them
FIELD_TILT = dict(NGRAM_TILT_ENABLED="1", NGRAM_HINT_PRECOMPUTE_OUTSIDE="0", TOKEN_ORDER="16",
                  TOKEN_THRESHOLD="0.800", TOKEN_BOOST="2.625", WITHIN_TAU="99.0", WITHIN_BOOST="0.0",
                  WORD_TAU="99.0", WORD_BOOST="0.0", AGREE_ADD_BOOST="0.0", TTT_ENABLED="1")


def walked_hints(targets: list, order: int) -> tuple:
    """The field's walk, one target at a time: a ring of the last order - 1 targets, seeded with targets[0]; the
    context's state is read, then its counts take the target; the top token changes only when a count passes
    the top. Returns (ids, shares) as ngram_hints does."""
    span = order - 1
    ring = [targets[0]]
    total = defaultdict(int)
    pairs = defaultdict(int)
    top = {}  # context: (token, count)
    ids = np.zeros(len(targets), np.int64)
    shares = np.zeros(len(targets), np.float32)
    for i, token in enumerate(targets):
        if len(ring) >= span:
            context = tuple(ring[len(ring) - span:])
            if total[context]:
                ids[i] = top[context][0]
                shares[i] = np.float32(top[context][1]) / np.float32(total[context])
            pairs[context, token] += 1
            total[context] += 1
            if pairs[context, token] > top.get(context, (0, 0))[1]:
                top[context] = (token, pairs[context, token])
        ring.append(token)
    return ids, shares


def phrase_stream(length: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """BOS-led documents of random tokens and of phrases that recur across them, each phrase a trunk and one of a
    few endings (so shares below 1, and ties)."""
    g = np.random.default_rng(seed)
    trunks = [g.integers(2, vocab, int(g.integers(2, 24))) for _ in range(8)]
    endings = [g.integers(2, vocab, 3) for _ in range(3)]
    parts = []
    size = 0
    while size < length:
        part = [np.array([1])] if g.random() < 0.05 else [g.integers(2, vocab, int(g.integers(0, 6)))]
        if g.random() < 0.7:
            part += [trunks[int(g.integers(len(trunks)))], endings[int(g.integers(len(endings)))]]
        parts += part
        size += sum(p.size for p in part)
    stream = np.concatenate([np.array([1])] + parts)[:length]
    return torch.from_numpy(stream).int()


# ---- the hints ----


@pytest.mark.parametrize("order, vocab", [(16, 8192), (16, 64), (17, 64), (2, 5), (3, 40), (6, 70_000)])
def test_the_hints_are_the_fields_walk(fr, order, vocab):
    """Every target's hint and share equal the walk's, bit for bit: orders whose contexts are two halves of 1, 8
    or 16 tokens, and vocabularies whose windows need ranks at different widths (8192: from 4 tokens on)."""
    stream = phrase_stream(3000, vocab)
    ids, shares = fr.ngram_hints(stream, order)
    expected_ids, expected_shares = walked_hints(stream[1:].tolist(), order)
    assert torch.equal(ids, torch.from_numpy(expected_ids))
    assert torch.equal(shares, torch.from_numpy(expected_shares))
    inside = shares[(shares > 0) & (shares < 1)]
    assert (shares == 1).any() and inside.numel() > 10, "the stream must give sure hints and unsure ones"


def test_the_first_context_is_the_fields_ring_seeded_with_the_first_target(fr):
    """The field's ring starts holding targets[0], not the stream's first token: target 14's context is
    targets[0] twice, then targets[1:14]. So a later 'a a b1 ... b13' is followed by a hint of target 14 (c),
    where the causal seed (BOS a b1 ... b13) would give none."""
    a, c, d = 5, 6, 7
    b = list(range(10, 23))  # 13 tokens
    stream = torch.tensor([1, a, *b, c, 30, 31, 32, a, a, *b, d])
    ids, shares = fr.ngram_hints(stream, 16)
    assert (ids[-1].item(), shares[-1].item()) == (c, 1.0)
    assert shares[:-1].eq(0).all()


def test_a_hint_reads_only_the_stream_before_its_target(fr):
    """A change to the stream's token k (target k - 1) leaves every hint and share of targets 0 .. k - 1 as it
    was, bit for bit (target k - 1's own among them: no hint sees its target), and moves some after it."""
    stream = phrase_stream(2000, 64)
    moved = 0
    for order in (4, 16):
        ids, shares = fr.ngram_hints(stream, order)
        for k in (1, 2, 15, 16, 17, 400, 1000, 1998, 1999):
            changed = stream.clone()
            changed[k] = 63 if stream[k] != 63 else 62
            other_ids, other_shares = fr.ngram_hints(changed, order)
            assert torch.equal(other_ids[:k], ids[:k]) and torch.equal(other_shares[:k], shares[:k]), (order, k)
            moved += not (torch.equal(other_ids[k:], ids[k:]) and torch.equal(other_shares[k:], shares[k:]))
    assert moved >= 5, "a changed target moves hints after it"


# ---- the tilt ----


def test_the_tilt_is_the_loss_of_the_renormalized_distribution(fr):
    """Where gated: -log p'(y), p'(a) = p(a) e^(beta [a = h]) / Z, renormalized explicitly over a vocabulary of 7;
    p' sums to 1; elsewhere, or with beta 0, the loss as it was, bit for bit."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 9, 7, generator=g) * 3
    y = torch.randint(0, 7, (4, 9), generator=g)
    hints = torch.randint(0, 7, (4, 9), generator=g)
    hints[0] = y[0]  # hits
    gated = torch.rand(4, 9, generator=g) < 0.7
    log_p = torch.log_softmax(logits, -1)
    losses = -log_p.gather(-1, y[..., None])[..., 0]
    log_q = log_p.gather(-1, hints[..., None])[..., 0]
    beta = 2.625
    tilted = fr.tilt(losses, log_q, y, hints, gated, beta)
    leaned = torch.log_softmax(logits.double() + beta * torch.nn.functional.one_hot(hints, 7), -1)
    expected = torch.where(gated, -leaned.gather(-1, y[..., None])[..., 0], losses.double())
    torch.testing.assert_close(tilted.double(), expected, rtol=0, atol=2e-6)
    assert torch.equal(tilted[~gated], losses[~gated])
    every = torch.ones_like(gated)
    # p'(a) for every a of the vocabulary, from the closed form
    mass = sum(torch.exp(-fr.tilt(-log_p[..., a], log_q, torch.full_like(y, a), hints, every, beta).double())
               for a in range(7))
    torch.testing.assert_close(mass, torch.ones_like(mass), rtol=0, atol=1e-6)
    assert torch.equal(fr.tilt(losses, log_q, y, hints, every, 0.0), losses)


# ---- the TTT pass ----


def tilt_stream(fr, change=None) -> "fr.Validation":
    """Five documents over a few phrases (order 4's contexts recur within and across them), in the stream's
    order: D0 (tokens 0..59), D1 (60..68, '7 8 9 10' at 63..66), D2 (69..141, the longest, where '7 8 9' comes
    twice), D3, D4. The TTT order (longest first): D2, D0, D3, D4, D1. change: (k, token) for stream token k."""
    g = torch.Generator().manual_seed(1)
    phrases = [torch.tensor(p) for p in ([11, 12, 13, 14], [20, 21, 22], [30, 31, 32, 33, 34], [7, 8, 9, 10])]

    def document(length, start=()):
        tokens = [1, *start]
        while len(tokens) < length:
            tokens += phrases[int(torch.randint(3, (1,), generator=g))].tolist()
            tokens += torch.randint(2, 64, (int(torch.randint(0, 3, (1,), generator=g)),), generator=g).tolist()
        return tokens[:length]
    d2 = document(30) + [7, 8, 9, 40] + document(36)[1:] + [7, 8, 9, 41]
    tokens = document(60) + document(9, [5, 6, 7, 8, 9, 10]) + d2 + document(35) + document(28)
    tokens = torch.tensor(tokens[:201]).int()
    if change:
        tokens[change[0]] = change[1]
    return fr.Validation(tokens, torch.randint(0, 4, (201,), dtype=torch.int16, generator=g), VAL_BATCH)


class HintRecorder(torch.nn.Module):
    """The model, recording each call's hints and per-target losses (and log p(hint) where hints came)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.calls = []

    def forward(self, x, y, reduction="mean", lora=None, hints=None):
        if hints is None:
            losses = self.model(x, y, reduction, lora)
            self.calls.append((None, losses.detach().view_as(x).clone(), None))
            return losses
        losses, log_q = self.model(x, y, reduction, lora, hints)
        self.calls.append((hints.clone(), losses.detach().view_as(x).clone(), log_q.view_as(x).clone()))
        return losses, log_q


@pytest.fixture(scope="module")
def lora_model(fr):
    return random_model(frontier_all_on(fr, train_seq_len=16), fr)


def lora_run(fr, model, val, trainer=None, **settings):
    """A run of trainer's (the frontier's) lora_ttt: the model's copy scores through a HintRecorder; groups of 1."""
    trainer = trainer or fr
    values = dict(train_seq_len=16, ttt_lora_rank=4, ttt_lora_lr=0.01, ttt_chunk_size=CHUNK, ttt_batch_size=1,
                  ttt_enabled=True)
    values.update(settings)
    run = trainer.Run(frontier_all_on(trainer, **values), trainer.Layout(), val, b"")
    run.model = copy.deepcopy(model)
    run.scorer = HintRecorder(run.model)
    run.trainer = run.model
    run.lines = []
    run.log = run.lines.append
    return run


def scored_targets(fr, run) -> list:
    """For each scorer call of run's lora_ttt, in order: (rows, window) of the stream index of the target each
    position scores, -1 where none (chunk_windows on the indices themselves)."""
    val = run.val
    spans = sorted(fr.document_spans(val.tokens), key=lambda span: span[0] - span[1])
    size = run.hp.ttt_batch_size
    index = torch.arange(val.tokens.numel())
    calls = []
    for group in (spans[i:i + size] for i in range(0, len(spans), size)):
        longest = max(b - a for a, b in group)
        chunk = run.hp.ttt_chunk(longest + 1)  # the group's (short-doc-chunks)
        for lo in range(0, longest, chunk):
            rows = sum(lo < b - a for a, b in group)
            found = fr.chunk_windows(fr.Validation(index, index, 0), group, lo, chunk, run.hp.train_seq_len, rows)
            calls.append(found[1])
    return calls


@pytest.mark.parametrize("chunks", [{}, dict(ttt_short_score_first_enabled=True, ttt_short_score_first_steps="9999:3")],
                         ids=["chunks", "short-chunks"])
def test_each_hint_meets_its_target_once_and_the_adapters_train_as_without_the_tilt(fr, lora_model, chunks):
    """Tilt on against off: the scorer gets, beside each scored target, that target's hint (the stream's); the
    targets and bytes counted are the same, every target once; every call's untilted losses are the same bit for
    bit (the adapters train as without the tilt: its term has no gradient); and the score is the sum of the
    closed form over the gated targets. With short-doc-chunks' chunk, the hints follow the group's chunk too."""
    val = tilt_stream(fr)
    off = lora_run(fr, lora_model, val, **chunks)
    on = lora_run(fr, lora_model, val, **TILT, **chunks)
    sums_off, sums_on = fr.lora_ttt(off), fr.lora_ttt(on)
    assert torch.equal(sums_on[1:], sums_off[1:]) and sums_on[1] == 200 and sums_on[2] == val.bytes[1:].sum()
    assert len(on.scorer.calls) == len(off.scorer.calls)
    for (_, plain, _), (_, losses, _) in zip(off.scorer.calls, on.scorer.calls):
        assert torch.equal(plain, losses)

    ids, shares = fr.ngram_hints(val.tokens, 4)
    gated = shares >= np.float32(on.hp.token_threshold)
    beta = on.hp.token_boost
    seen = []
    expected = 0.0
    for (hints, losses, log_q), targets in zip(on.scorer.calls, scored_targets(fr, on)):
        where = targets >= 0
        t = targets[where]
        seen += t.tolist()
        assert torch.equal(hints[where], ids[t - 1]), "each target's own hint"
        hit = (val.tokens[t] == ids[t - 1]).double()
        leaned = losses[where].double() - beta * hit + torch.log1p(log_q[where].double().exp() * np.expm1(beta))
        expected += torch.where(gated[t - 1], leaned, losses[where].double()).sum().item()
    assert sorted(seen) == list(range(1, 201)), "every target once"
    assert gated.sum() > 30 and sums_on[0] < sums_off[0]
    assert sums_on[0].item() == pytest.approx(expected, rel=1e-6)


def test_off_or_with_no_boost_the_pass_is_what_it_was_bit_for_bit(fr, lora_model, tmp_path):
    """The stack before this technique, the frontier with the tilt off (its other settings changed), and with it
    on at TOKEN_BOOST=0: the same three sums, bit for bit."""
    names = build_trainer.load_manifest(build_trainer.Tree(ROOT)).techniques
    before = import_trainer(build_into(tmp_path, techniques=names[:names.index("ngram-tilt")]), "train_gpt_untilted")
    model = random_model(frontier_all_on(before, train_seq_len=16), before)
    assert all(torch.equal(p, q) for p, q in zip(model.state_dict().values(), lora_model.state_dict().values()))
    val = tilt_stream(fr)
    untilted = before.lora_ttt(lora_run(fr, model, val, trainer=before))
    off = fr.lora_ttt(lora_run(fr, lora_model, val, token_order=2, token_threshold=0.1))
    no_boost = fr.lora_ttt(lora_run(fr, lora_model, val, **TILT, token_boost=0.0))
    assert torch.equal(off, untilted) and torch.equal(no_boost, untilted)


def test_a_changed_target_moves_no_score_before_it_in_both_orders(fr, lora_model, monkeypatch):
    """Change stream token 66 (in D1, scored last): every tilted loss of a target before it in the stream and
    scored no later (D0 whole, D1's first targets) is the same, bit for bit. The hints follow the stream and TTT
    follows the documents, so a target after it in the stream may move though scored before: D2's hint after
    '7 8 9' was 10, the token changed."""
    def losses(val):
        run = lora_run(fr, lora_model, val, **TILT)
        tilted = []
        monkeypatch.setattr(fr, "tilt", lambda *args: tilted.append(tilt(*args)) or tilted[-1])
        fr.lora_ttt(run)
        found = {}
        for call, (values, targets) in enumerate(zip(tilted, scored_targets(fr, run))):
            for t, value in zip(targets[targets >= 0].tolist(), values[targets >= 0].tolist()):
                found[t] = (call, value)
        return found
    tilt = fr.tilt
    k = 66
    val = tilt_stream(fr)
    assert val.tokens[63:67].tolist() == [7, 8, 9, 10]
    plain, changed = losses(val), losses(tilt_stream(fr, change=(k, 50)))
    before = [t for t in plain if t < k and plain[t][0] <= plain[k][0]]
    assert len(before) > 50 and any(t < 60 for t in before), "D0 and D1's first targets"
    assert all(changed[t] == plain[t] for t in before)
    ids, shares = fr.ngram_hints(val.tokens, 4)
    later = [t for t in plain if t > k and plain[t][0] < plain[k][0] and changed[t] != plain[t]]
    assert later and all(ids[t - 1] == 10 for t in later), "D2's targets after '7 8 9', scored before"


def test_the_log_has_the_fields_gate_counts(fr, lora_model):
    run = lora_run(fr, lora_model, tilt_stream(fr), **TILT)
    fr.lora_ttt(run)
    ids, shares = fr.ngram_hints(run.val.tokens, 4)
    gated = int((shares >= np.float32(0.8)).sum())
    counts = f"ngram_tilt:hints total=200 gated={gated} token_gate={gated} within_gate=0 word_gate=0 agree2plus=0"
    assert counts in run.lines
    assert any(re.fullmatch(r"ngram_tilt:precompute_done elapsed=\d+\.\d\ds total_targets=200", line)
               for line in run.lines)


def test_priming_compiles_the_graph_with_hints(fr, lora_model):
    run = lora_run(fr, lora_model, tilt_stream(fr), **TILT)
    run.layout = fr.Layout(use_compile=True)
    fr.prime_ttt(run)
    assert run.scorer.calls and all(hints is not None for hints, _, _ in run.scorer.calls)


# ---- settings ----


def test_the_fields_command_sets_the_tilt_as_written(fr):
    """#2135's names, as its command sets them, mean here what they meant there; the other channels' boosts and
    the agreement bonus are inert while those channels cannot gate, and are taken as written."""
    hp = fr.Hyperparameters.from_env(FIELD_TILT)
    assert (hp.ngram_tilt_enabled, hp.token_order, hp.token_threshold, hp.token_boost) == (True, 16, 0.8, 2.625)
    assert not hp.ngram_hint_precompute_outside
    inert = fr.Hyperparameters.from_env(dict(FIELD_TILT, WITHIN_BOOST="0.75", WORD_BOOST="0.75",
                                             AGREE_ADD_BOOST="0.5"))
    assert (inert.within_boost, inert.agree_add_boost) == (0.75, 0.5)
    assert fr.Hyperparameters.from_env(dict(WITHIN_TAU="0.45")).within_tau == 0.45, "off, nothing reads it"


@pytest.mark.parametrize("settings, message", [
    (dict(WITHIN_TAU="0.45"), r"WITHIN_TAU=0.45: that channel of the field's tilt would gate, and it reads the "
                              r"scored token itself .* set WITHIN_TAU=99.0 \(off, as #2135 runs\)"),
    # 1 + 1e-9 is 1.0 in float32, where the field compares: shares of 1 would gate
    (dict(WORD_TAU="1.000000001"), r"WORD_TAU=1.000000001: that channel"),
    (dict(NGRAM_HINT_PRECOMPUTE_OUTSIDE="1"), r"NGRAM_HINT_PRECOMPUTE_OUTSIDE=1: the hints are built inside the "
                                              r"TTT pass's timer here"),
    (dict(TTT_ENABLED="0"), r"NGRAM_TILT_ENABLED=1 tilts the LoRA TTT pass's score: set TTT_ENABLED=1"),
    (dict(TOKEN_ORDER="1"), r"TOKEN_ORDER=1: use 2 or more"),
    (dict(TOKEN_THRESHOLD="0"), r"TOKEN_THRESHOLD=0.0: use a share above 0"),
])
def test_what_the_field_would_compute_differently_is_refused_before_any_work(fr, settings, message):
    with pytest.raises(fr.ConfigError, match=message):
        fr.Hyperparameters.from_env(dict(FIELD_TILT, **settings))


def test_a_run_with_the_tilt_logs_its_hints_inside_the_ttt_pass(frontier_script, short_val_data, tmp_path):
    env = built_env(short_val_data, frontier_script, RUN_ID="tilt", ITERATIONS="4", WARMDOWN_ITERS="2",
                    TTT_ENABLED="1", TTT_BATCH_SIZE="2", TTT_LORA_RANK="4", TTT_CHUNK_SIZE="64",
                    NGRAM_TILT_ENABLED="1", TOKEN_ORDER="3")
    proc = launch(frontier_script, env, tmp_path)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    lines = out.splitlines()
    hints = next(i for i, line in enumerate(lines) if line.startswith("ngram_tilt:hints "))
    assert re.fullmatch(r"ngram_tilt:hints total=\d+ gated=(\d+) token_gate=\1 within_gate=0 word_gate=0 "
                        r"agree2plus=0", lines[hints]), lines[hints]
    assert lines[hints - 1].startswith("ttt: groups:"), "built as the TTT pass starts, inside its timer"
    assert re.search(r"^final_int8_zlib_ttt_exact val_loss:\S+ val_bpb:\S+$", out, re.M), out[-2000:]

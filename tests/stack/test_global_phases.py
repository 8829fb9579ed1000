"""global-phases (stack/global-phases.diff), on the built frontier: the field's global phases of per-document LoRA
TTT. The phase falls where the field's does (its logged boundaries), trains on the documents the field trains on,
in its order, each to the next document's BOS, only after they are scored; its SGD is written out here by hand;
priming it leaves the weights; its settings are checked before any work. With phases off the build computes what
the core computes (tests/test_stack.py)."""

import copy
import math

import pytest
import torch

from conftest import CHUNK, Recorder, document_stream, random_model
from stack.conftest import built_env, frontier_all_on

PHASED = dict(phased_ttt_enabled=True, phased_ttt_num_phases=1)
# the six documents' targets: (1, 18) 17, (18, 19) 1, (19, 61) 42, (61, 62) 1, (62, 131) 69, (131, 201) 70
SPANS = [(1, 18), (18, 19), (19, 61), (61, 62), (62, 131), (131, 201)]


@pytest.fixture(scope="module")
def lora_model(fr):
    return random_model(frontier_all_on(fr, train_seq_len=16), fr)


def lora_run(fr, model, val=None, layout=None, **settings):
    """A run of the frontier's lora_ttt on the six documents, on a copy of the model."""
    values = dict(train_seq_len=16, ttt_lora_rank=4, ttt_lora_lr=0.01, ttt_chunk_size=CHUNK, ttt_batch_size=8,
                  global_ttt_chunk_tokens=32, global_ttt_lr=0.01)
    values.update(settings)
    run = fr.Run(frontier_all_on(fr, **values), layout or fr.Layout(), val or document_stream(fr), b"")
    run.model = copy.deepcopy(model)
    run.scorer = Recorder(run.model)
    run.trainer = run.model
    return run


def scores(fr, monkeypatch, model, val, **settings) -> tuple[list, dict]:
    """A lora_ttt run whose bytes are the targets' positions: (the targets in scoring order, {target: its loss})."""
    val = fr.Validation(val.tokens, torch.arange(val.tokens.numel(), dtype=torch.int16), val.batch_tokens)
    order, loss = [], {}
    score_sums = getattr(fr.score_sums, "spied", fr.score_sums)

    def spy(losses, scored, num_bytes):
        for target, value in zip(num_bytes[scored].tolist(), losses[scored].tolist()):
            order.append(target)
            loss[target] = value
        return score_sums(losses, scored, num_bytes)
    spy.spied = score_sums
    monkeypatch.setattr(fr, "score_sums", spy)
    fr.lora_ttt(lora_run(fr, model, val, **settings))
    return order, loss


def lengths_spans(lengths):
    """document_spans() of documents of these target counts, one after another."""
    spans, a = [], 1
    for n in lengths:
        spans.append((a, a + n))
        a += n
    return spans


def field_hp(fr, **settings):
    return frontier_all_on(fr, **{**PHASED, "phased_ttt_prefix_docs": 2500, **settings})


@pytest.mark.parametrize("batch, world_size, scored", [(24, 8, 2672), (64, 8, 2960), (24, 1, 2504), (64, 1, 2512)])
def test_the_phase_falls_where_the_fields_does_and_trains_on_its_documents(fr, batch, world_size, scored):
    """The field's 50,000 documents, PHASED_TTT_PREFIX_DOCS=2500: its logs' pd:2672 (#2014, groups of 24) and
    pd:2960 (#2135, 64) at 8 ranks, the group that reaches 2,500 and the 7 the other ranks have under way; at one
    rank the group that reaches it. The groups are cut from the shortest, so the longest holds 50,000 mod the
    group's documents, and scored first; the phase trains on the 2,500 shortest of those scored, shortest first,
    documents of one length in the split's order."""
    lengths = torch.randint(1, 6000, (50_000,), generator=torch.Generator().manual_seed(0)).tolist()
    spans = lengths_spans(lengths)
    rising = sorted(spans, key=lambda span: span[1] - span[0])
    groups, phases = fr.global_phases(spans, field_hp(fr, ttt_batch_size=batch), world_size)
    assert [len(group) for group in groups[:2]] == [50_000 % batch, batch]
    assert sorted(span for group in groups for span in group) == spans
    assert all(b - a >= d - c for group in groups for (a, b), (c, d) in zip(group, group[1:])), "longest first"
    [(end, trained)] = phases
    assert sum(map(len, groups[:end])) == scored
    assert sorted(span for group in groups[:end] for span in group) == sorted(rising[-scored:])
    assert trained == rising[-scored:][:2500]


def test_three_phases_each_train_on_the_shortest_of_all_scored_so_far(fr):
    """The field's best entry's three phases over 2,500 documents, 8 ranks: each after 833, 1,666 and 2,500 are
    counted and the groups under way; each on the 833, 1,666, 2,500 shortest of every document scored so far."""
    spans = lengths_spans(torch.randint(1, 6000, (5_000,), generator=torch.Generator().manual_seed(1)).tolist())
    groups, phases = fr.global_phases(spans, field_hp(fr, phased_ttt_num_phases=3, ttt_batch_size=64), 8)
    assert [sum(map(len, groups[:end])) for end, _ in phases] == [8 + 64 * 20, 8 + 64 * 33, 8 + 64 * 46]
    for (end, trained), docs in zip(phases, [833, 1666, 2500]):
        scored = sorted((span for group in groups[:end] for span in group), key=lambda span: span[1] - span[0])
        assert trained == sorted(scored, key=lambda span: (span[1] - span[0], span))[:docs]


def test_the_phase_trains_on_each_document_to_the_next_ones_bos_shortest_first(fr, lora_model, monkeypatch):
    """Groups of 2 ([70, 69], [42, 17], [1, 1] targets), two phases of 2 and 4 documents: the first after the first
    group, on documents 4 and 5; the second after the next, on 0, 2, 4, 5. Each document's tokens run from its BOS
    to the next document's BOS, so each junction holds two BOS, as in the field's stream."""
    streams = []
    monkeypatch.setattr(fr, "global_ttt", lambda run, tokens: streams.append(tokens.clone()) or 1)
    val = document_stream(fr)
    fr.lora_ttt(lora_run(fr, lora_model, ttt_batch_size=2, phased_ttt_enabled=True, phased_ttt_prefix_docs=4,
                         phased_ttt_num_phases=2))
    document = [val.tokens[a - 1:b] for a, b in SPANS]
    assert [len(stream) for stream in streams] == [70 + 71, 18 + 43 + 70 + 71]
    assert torch.equal(streams[0], torch.cat([document[4], document[5]]))
    assert torch.equal(streams[1], torch.cat([document[0], document[2], document[4], document[5]]))
    assert (streams[1] == fr.BOS_ID).nonzero().flatten().tolist() == [0, 17, 18, 60, 61, 130, 131]


def test_score_first_with_phases_a_change_leaves_every_earlier_score(fr, lora_model, monkeypatch):
    """Two phases (after the first and second of three groups of 2): a change to one token leaves bitwise the same
    the loss of every target scored before it, in the TTT's scoring order, the phases' training included; every
    target is scored once. The changes fall in each document a phase trains on (and in the last group), so a phase
    that trained on a document before it scored it, or after the groups that follow it, changes an earlier score."""
    phased = dict(ttt_batch_size=2, phased_ttt_enabled=True, phased_ttt_prefix_docs=4, phased_ttt_num_phases=2)
    order, loss = scores(fr, monkeypatch, lora_model, document_stream(fr), **phased)
    assert sorted(order) == list(range(1, 201)), "every target once"
    changed_somewhere = False
    for position in (150, 100, 40, 9):
        val = document_stream(fr)
        val.tokens[position] = 2 + (val.tokens[position] - 1) % 62
        _, other = scores(fr, monkeypatch, lora_model, val, **phased)
        before = order[:order.index(position)]
        assert all(other[t] == loss[t] for t in before), position
        changed_somewhere |= any(other[t] != loss[t] for t in order[order.index(position):])
    assert changed_somewhere


def test_global_ttt_is_sgd_with_momentum_clipping_epochs_and_a_cosine_over_the_chunks(fr, lora_model):
    """GLOBAL_TTT_EPOCHS, _MOMENTUM, _GRAD_CLIP and the cosine decay, against SGD written out by hand: chunk c of n
    (of 40 targets) trains at GLOBAL_TTT_LR * (1 + cos(pi c / (n - 1))) / 2 on its 2 whole rows of 16 (its last 8
    targets not; the rows as contexts, GLOBAL_TTT_RESPECT_DOC_BOUNDARIES=0), EPOCHS steps, the gradient's global
    norm clipped, momentum without dampening; the last chunk is not trained on."""
    settings = dict(global_ttt_epochs=2, global_ttt_momentum=0.5, global_ttt_grad_clip=0.05, global_ttt_lr=0.05,
                    global_ttt_chunk_tokens=40, global_ttt_respect_doc_boundaries=False)
    run = lora_run(fr, lora_model, **settings)
    hp = run.hp
    tokens = document_stream(fr).tokens[:4 * 40 + 20 + 1]
    assert fr.global_ttt(run, tokens) == 5
    reference = copy.deepcopy(lora_model)
    params = list(reference.parameters())
    momenta = [torch.zeros_like(p) for p in params]
    clipped = 0
    # 5 chunks, the last (20 targets) untrained
    for c in range(4):
        x = tokens[c * 40:c * 40 + 32].long().view(-1, 16)
        y = tokens[c * 40 + 1:c * 40 + 33].long().view(-1, 16)
        lr = hp.global_ttt_lr * (1 + math.cos(math.pi * c / 4)) / 2
        for _ in range(hp.global_ttt_epochs):
            grads = torch.autograd.grad(reference(x, y), params)
            norm = torch.sqrt(sum(g.square().sum() for g in grads))
            clipped += bool(norm > hp.global_ttt_grad_clip)
            factor = min(1.0, hp.global_ttt_grad_clip / (norm.item() + 1e-6))
            with torch.no_grad():
                for p, g, m in zip(params, grads, momenta):
                    m.mul_(hp.global_ttt_momentum).add_(g * factor)
                    p.sub_(lr * m)
    assert clipped > 0, "the clip must bite in this test"
    for (name, p), q in zip(run.model.named_parameters(), params):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6, msg=name)


def test_a_phases_contexts_are_the_fields_cut_at_each_bos_and_every_row_from_a_documents_start(fr):
    """The field's _build_cu_seqlens on 12 tokens, rows of 4: [0, 2, 6, 9, 12] (its output on CPU): a window that
    starts inside a document, a document longer than a row. Each context is a row of its own, padded after its
    end with targets -100, which the loss leaves out; two rows at least."""
    window = torch.tensor([5, 6, 1, 7, 8, 9, 10, 11, 12, 1, 13, 14, 15])
    x, y = fr.context_rows(window, 4)
    assert x.tolist() == [[5, 6, 0, 0], [1, 7, 8, 9], [10, 11, 12, 0], [1, 13, 14, 0]]
    assert y.tolist() == [[6, 1, -100, -100], [7, 8, 9, 10], [11, 12, 1, -100], [13, 14, 15, -100]]
    x, y = fr.context_rows(torch.tensor([7, 8, 9, 10, 11]), 4)
    assert x.tolist() == [[7, 8, 9, 10], [0, 0, 0, 0]] and y.tolist() == [[8, 9, 10, 11], [-100] * 4]


@pytest.mark.parametrize("respect", [False, True])
@pytest.mark.parametrize("rank, rows", [(0, [0]), (1, [1, 2])])
def test_each_rank_trains_on_its_own_contiguous_rows_of_each_chunk(fr, lora_model, rank, rows, respect):
    """Chunks of 56 targets: 3 rows of 16 (the last 8 targets untrained); of 2 ranks the first takes row 0, the
    second rows 1 and 2 (the field's split), in every chunk but the last: as rows, or as their contexts."""
    layout = fr.Layout(rank=rank, world_size=2)
    run = lora_run(fr, lora_model, layout=layout, global_ttt_chunk_tokens=56,
                   global_ttt_respect_doc_boundaries=respect)
    seen = []

    def trainer(x, y):
        seen.append((x.clone(), y.clone()))
        return run.model(x, y)
    run.trainer = trainer
    tokens = document_stream(fr).tokens
    assert fr.global_ttt(run, tokens) == 4
    assert len(seen) == 3
    for c, (x, y) in enumerate(seen):
        window = tokens[c * 56 + 16 * rows[0]:c * 56 + 16 * (rows[-1] + 1) + 1].long()
        if respect:
            expected = fr.context_rows(window, 16)
        else:
            expected = window[:-1].view(-1, 16), window[1:].view(-1, 16)
        assert torch.equal(x, expected[0]) and torch.equal(y, expected[1])


def test_priming_a_global_phase_runs_one_step_and_leaves_the_weights(fr, lora_model):
    """Compiled, the final passes' priming runs a global phase's step (its rows of eval windows: a graph of its
    own) on noise, then puts back the weights the TTT pass will score with."""
    run = lora_run(fr, lora_model, layout=fr.Layout(use_compile=True), ttt_enabled=True, phased_ttt_enabled=True)
    shapes = []

    def trainer(x, y):
        shapes.append(tuple(x.shape))
        return run.model(x, y)
    run.trainer = trainer
    fr.prime_ttt(run)
    assert len(shapes) == 1 and shapes[0][1] == 16, "one step on the first of two chunks of 32 tokens"
    assert all(torch.equal(p, q) for p, q in zip(run.model.parameters(), lora_model.parameters()))
    assert all(p.grad is None and p.requires_grad for p in run.model.parameters())


@pytest.mark.parametrize("settings, message", [
    (dict(GLOBAL_TTT_CHUNK_TOKENS="63"), r"GLOBAL_TTT_CHUNK_TOKENS=63: under 1 x 64"),
    (dict(GLOBAL_TTT_CHUNK_TOKENS="100", WORLD_SIZE="2"), r"GLOBAL_TTT_CHUNK_TOKENS=100: under 2 x 64"),
    (dict(GLOBAL_TTT_CHUNK_TOKENS="0"), r"GLOBAL_TTT_CHUNK_TOKENS=0: under 1 x 64"),
    (dict(PHASED_TTT_NUM_PHASES="0"), r"PHASED_TTT_NUM_PHASES=0 must be positive"),
    # settings.py's INSTEAD is the core's: the field's full-parameter TTT names stay retired, not renamed
    (dict(TTT_LR="0.01"), r"TTT_LR=0.01: retired"),
])
def test_a_phases_chunk_holds_a_row_for_every_rank_before_any_work(fr, frontier_script, tiny_data, settings,
                                                                    message):
    env = built_env(tiny_data, frontier_script, TTT_ENABLED="1", PHASED_TTT_ENABLED="1", **settings)
    with pytest.raises(fr.ConfigError, match=message):
        fr.setup(env)


def test_the_best_entrys_phases_are_settings_here(fr):
    """The field's best entry's command (tests/test_settings.py): with the stack, its global phases are no longer
    among the names refused, and they set what they mean."""
    from test_settings import TOP_ENV, TOP_LACKS, refused_names
    phases = {"PHASED_TTT_ENABLED", "PHASED_TTT_PREFIX_DOCS", "PHASED_TTT_NUM_PHASES", "GLOBAL_TTT_MOMENTUM"}
    assert phases <= TOP_LACKS, "the core refuses them: the stack is what brings them"
    with pytest.raises(fr.ConfigError) as refusal:
        fr.Hyperparameters.from_env(TOP_ENV)
    refused = refused_names(refusal)
    assert not refused & phases and refused <= TOP_LACKS, "other techniques bring more of them"
    hp = fr.Hyperparameters.from_env({name: TOP_ENV[name] for name in phases})
    assert (hp.phased_ttt_enabled, hp.phased_ttt_prefix_docs, hp.phased_ttt_num_phases, hp.global_ttt_momentum) == (
        True, 2500, 3, 0.9)


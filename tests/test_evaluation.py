"""Evaluation: score() in plain and sliding windows (every target once, ranks sharing the windows),
which final passes a run makes, and score-first test-time training (TTT_ENABLED=1: per-document LoRA
TTT), legal by construction and exact where it must be."""

import copy
import math
import re

import pytest
import torch

import train_gpt as tg
from conftest import CHUNK, VAL_BATCH, Recorder, all_on_hp, document_stream, random_model, run_trainer, tiny_hp


def cpu_layout(**overrides) -> tg.Layout:
    return tg.Layout(**{"grad_accum_steps": 8, **overrides})


def score(model, val: tg.Validation, hp: tg.Hyperparameters, sliding=False, layout=None):
    """score() as the run calls it: the plain windows, or the sliding ones."""
    return tg.score(model, val, layout or cpu_layout(), *hp.windows(sliding))


class PositionCounter(torch.nn.Module):
    """A stand-in model whose loss is 1 per target, and which records every scored batch."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def forward(self, x, y, reduction="mean"):
        self.calls.append(x.clone())
        return torch.ones(y.numel())


class PositionLoss(torch.nn.Module):
    """Each target's loss is its position in its window."""

    def forward(self, x, y, reduction="mean"):
        return torch.arange(x.size(1), dtype=torch.float32).repeat(x.size(0))


# ---- sliding-window evaluation ----


@pytest.fixture(scope="module")
def val(tiny_data) -> tg.Validation:
    """The tiny validation split, cut to 40 windows of 16."""
    hp = tiny_hp(vocab_size=tiny_data.vocab_size, val_batch_size=VAL_BATCH,
                 data_path=str(tiny_data.data_path), tokenizer_path=str(tiny_data.tokenizer_path))
    tok = tg.load_tokenizer(tiny_data.tokenizer_path, tiny_data.vocab_size)
    full = tg.load_validation(hp, tok)
    end = 16 * 40 + 1
    return tg.Validation(full.tokens[:end], full.bytes[:end], hp.val_batch_size)


def test_sliding_equals_plain_when_stride_is_the_window(tiny_data, val):
    hp = tiny_hp(vocab_size=tiny_data.vocab_size, val_batch_size=VAL_BATCH, train_seq_len=16, eval_stride=16)
    model = random_model(hp)
    plain = tg.metrics(score(model, val, hp))
    sliding = tg.metrics(score(model, val, hp, sliding=True))
    assert sliding == pytest.approx(plain, rel=1e-12)


@pytest.mark.parametrize("seq_len, stride", [(16, 4), (32, 8), (16, 5), (24, 24)])
def test_sliding_scores_every_token_once(tiny_data, val, seq_len, stride):
    hp = tiny_hp(vocab_size=tiny_data.vocab_size, val_batch_size=VAL_BATCH, train_seq_len=seq_len,
                 eval_stride=stride)
    # a model with loss 1 per scored token: val_loss = 1 exactly,
    # and val_bpb = tokens / (bytes * ln 2)
    counter = PositionCounter()
    loss, bpb = tg.metrics(score(counter, val, hp, sliding=True))
    plain_loss, plain_bpb = tg.metrics(score(PositionCounter(), val, hp))
    assert loss == 1.0
    assert plain_loss == 1.0
    assert bpb == pytest.approx(plain_bpb, rel=1e-12), "same tokens and bytes as the plain eval"
    shapes = {c.shape for c in counter.calls}
    assert len(shapes) == 1, "one batch shape: a compiled model sees one eval graph"
    windows = torch.cat(counter.calls)
    assert windows.shape[1] == seq_len, "every window has the full length"
    n = val.tokens.numel() - 1
    real = 1 + math.ceil((n - seq_len) / stride)
    per_batch = counter.calls[0].shape[0]
    assert real <= windows.shape[0] < real + per_batch, "padding fills only the last batch"


def test_two_ranks_share_the_windows_and_each_scored_token_has_its_context(
        tiny_data, val, monkeypatch):
    # each rank's own sums: what it contributes to the all-reduce
    monkeypatch.setattr(tg.dist, "all_reduce", lambda tensor, op=None: None)
    hp = tiny_hp(vocab_size=tiny_data.vocab_size, val_batch_size=VAL_BATCH, train_seq_len=16, eval_stride=4)
    model = random_model(hp)
    full = score(model, val, hp, sliding=True)
    halves = []
    for rank in (0, 1):
        layout = cpu_layout(rank=rank, world_size=2)
        halves.append(score(model, val, hp, sliding=True, layout=layout))
    assert halves[0][1] > 0 and halves[1][1] > 0, "both ranks score windows"
    together = halves[0] + halves[1]
    assert together[1:].tolist() == full[1:].tolist(), "together: the same tokens and bytes"
    assert together[0].item() == pytest.approx(full[0].item(), rel=1e-12)
    total = score(PositionLoss(), val, hp, sliding=True)[0].item()
    # targets after the first window, scored 4 at a time at positions 12..15
    later = val.tokens.numel() - 1 - 16
    expected = sum(range(16)) + (later // 4) * sum(range(12, 16)) + sum(range(16 - later % 4, 16))
    # the first window scores all 16; every later target sits at position >= 12
    assert total == expected
    sliding = tg.metrics(score(model, val, hp, sliding=True))
    assert sliding != tg.metrics(score(model, val, hp)), "and the context changes the score"


def test_sliding_window_enabled_0_leaves_the_sliding_score_to_ttt(tiny_data, tmp_path):
    env = tiny_data.env(RUN_ID="ttt_only", ITERATIONS="4", EVAL_STRIDE="32", TTT_ENABLED="1", TTT_LORA_RANK="4",
                        TTT_CHUNK_SIZE="32", SLIDING_WINDOW_ENABLED="0")
    out = run_trainer(env, tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert not re.search(r"^final_\w+_sliding_window", out.stdout, flags=re.M)
    assert "final_int8_zlib_ttt_exact" in out.stdout
    total = re.search(r"^final_eval_total eval_time:(\d+)ms limit:600000ms "
                      r"passes:roundtrip:(\d+)ms,ttt:(\d+)ms$", out.stdout, flags=re.M)
    assert total, out.stdout[-2000:]
    passes = int(total.group(2)) + int(total.group(3))
    assert int(total.group(1)) in range(passes - 1, passes + 2), "the total is the passes' sum"


# ---- score-first test-time training: per-document LoRA TTT ----

@pytest.fixture(scope="module")
def lora_model() -> tg.GPT:
    return random_model(all_on_hp(train_seq_len=16))


def lora_run(model, val=None, layout=None, **settings) -> tg.Run:
    values = dict(train_seq_len=16, ttt_lora_rank=4, ttt_lora_lr=0.01, ttt_chunk_size=CHUNK, ttt_batch_size=8)
    values.update(settings)
    run = tg.Run(all_on_hp(**values), layout or tg.Layout(), val or document_stream(), b"")
    run.model = copy.deepcopy(model)
    run.scorer = Recorder(run.model)
    run.trainer = run.model
    return run


def test_document_spans_cover_every_target_once():
    spans = tg.document_spans(document_stream().tokens)
    assert spans == [(1, 18), (18, 19), (19, 61), (61, 62), (62, 131), (131, 201)]


def test_every_target_is_scored_once_with_its_bytes(lora_model):
    val = document_stream()
    for batch in (8, 2):
        sums = tg.lora_ttt(lora_run(lora_model, ttt_batch_size=batch))
        assert sums[1] == 200 and sums[2] == val.bytes[1:].sum(), batch


def test_at_zero_lr_each_chunk_is_scored_by_the_model_alone_in_its_documents_window(lora_model):
    """TTT_LORA_LR=0, no phase: the plain per-document score, each chunk of CHUNK targets scored with the document's
    tokens before it, at most the window (TRAIN_SEQ_LEN, 16) of them."""
    val = document_stream()
    run = lora_run(lora_model, ttt_lora_lr=0.0)
    sums = tg.lora_ttt(run)
    tokens = val.tokens.long()
    expected = torch.zeros(3, dtype=torch.float64)
    for a, b in tg.document_spans(val.tokens):
        for lo in range(a, b, CHUNK):
            hi = min(lo + CHUNK, b)
            start = max(a - 1, hi - 1 - 16)
            with torch.no_grad():
                losses = lora_model(tokens[None, start:hi - 1], tokens[None, start + 1:hi], reduction="none")
            expected += torch.tensor([losses[lo - 1 - start:].sum().item(), hi - lo, val.bytes[lo:hi].sum()])
    assert sums[1:].tolist() == expected[1:].tolist()
    assert sums[0].item() == pytest.approx(expected[0].item(), rel=1e-6)
    assert all(torch.equal(p, q) for p, q in zip(run.model.parameters(), lora_model.parameters()))


def chunk_losses(run: tg.Run) -> dict:
    """{(document, chunk): its scored targets' losses} from the recorder of a run of lora_ttt."""
    tg.lora_ttt(run)
    spans = tg.document_spans(run.val.tokens)
    order = sorted(range(len(spans)), key=lambda d: spans[d][0] - spans[d][1])
    groups = [order[i:i + run.hp.ttt_batch_size] for i in range(0, len(order), run.hp.ttt_batch_size)]
    calls = iter(run.scorer.calls)
    found = {}
    for group in groups:
        for c in range(-(-max(spans[d][1] - spans[d][0] for d in group) // CHUNK)):
            losses = next(calls)
            for row, d in enumerate(group[:len(losses)]):
                a, b = spans[d]
                lo, hi = a + c * CHUNK, min(a + (c + 1) * CHUNK, b)
                if lo < b:
                    start = max(a - 1, hi - 1 - 16)
                    found[d, c] = losses[row, lo - 1 - start:hi - 1 - start]
    return found


@pytest.mark.parametrize("batch", [8, 2])
def test_a_change_reaches_no_chunk_scored_before_it(lora_model, batch):
    """Change document 4 (targets 62..130) from its 4th chunk on: its chunks 0..3 score bit for bit as before, and so
    does every other document of its group; with groups of 2, so do the groups before it (A carries over to later
    groups of the same rank, as the field's)."""
    val = document_stream()
    before = chunk_losses(lora_run(lora_model, ttt_batch_size=batch))
    changed = val.tokens.clone()
    changed[62 + 3 * CHUNK:130] = torch.randint_like(changed[62 + 3 * CHUNK:130], 2, 64)
    after = chunk_losses(lora_run(lora_model, val._replace(tokens=changed), ttt_batch_size=batch))
    assert before.keys() == after.keys()
    same = [key for key in before if key[0] != 4 or key[1] < 3]
    if batch == 2:  # groups [4, 5], [2, 0], [1, 3]: A carries the change into the later two
        same = [key for key in same if key[0] in (4, 5)]
    for key in same:
        assert torch.equal(before[key], after[key]), key
    assert not torch.equal(before[4, 3], after[4, 3]), "the change is seen where it is scored"


def test_adapting_lowers_the_later_chunks_loss_and_leaves_the_base_weights(lora_model):
    frozen = chunk_losses(lora_run(lora_model, ttt_lora_lr=0.0))
    run = lora_run(lora_model)
    adapted = chunk_losses(run)
    assert all(torch.equal(adapted[d, 0], frozen[d, 0]) for d in range(6)), "first chunks: before any step"
    later = [key for key in frozen if key[1] >= 2]
    assert sum(adapted[k].sum() for k in later) < sum(frozen[k].sum() for k in later) - 1.0
    assert all(torch.equal(p, q) for p, q in zip(run.model.parameters(), lora_model.parameters()))
    assert all(p.grad is None and p.requires_grad for p in run.model.parameters())


def test_the_compiled_pass_scores_as_the_eager_one(lora_model):
    """Compiled, every row of a group runs at each chunk (one shape, the window dynamic); eager, only the documents
    not yet done. The same scores, and one graph for every window."""
    eager = tg.lora_ttt(lora_run(lora_model))
    run = lora_run(lora_model, layout=tg.Layout(use_compile=True))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # reset() keeps the counts of graphs compiled earlier in this process
    run.scorer = torch.compile(run.model, dynamic=False, fullgraph=True, backend="eager")
    compiled = tg.lora_ttt(run)
    assert compiled[1:].tolist() == eager[1:].tolist()
    assert compiled[0].item() == pytest.approx(eager[0].item(), rel=1e-5)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def test_full_parameter_ttt_is_retired_by_name(tiny_data):
    for name in ("TTT_LR", "TTT_CHUNK_TOKENS", "TTT_EPOCHS"):
        with pytest.raises(tg.ConfigError, match=rf"{name}=1: retired"):
            tg.setup(tiny_data.env(**{name: "1"}))

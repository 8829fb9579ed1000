"""Evaluation: score() in plain and sliding windows (every target once, ranks sharing the windows),
which final passes a run makes, and score-first test-time training (TTT_ENABLED=1), legal by
construction and exact where it must be."""

import copy
import dataclasses
import math
import re

import pytest
import torch

import train_gpt as tg
from conftest import VAL_BATCH, random_model, run_trainer, tiny_hp


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
                 data_path=str(tiny_data.data_path))
    tok = tg.load_tokenizer(tiny_data.tokenizer_path, tiny_data.vocab_size)
    full = tg.load_validation(hp, tok)
    end = 16 * 40 + 1
    return tg.Validation(full.tokens[:end], full.bytes[:end], hp.val_batch_size)


def test_sliding_equals_plain_when_stride_is_the_window(tiny_data, val):
    hp = tiny_hp(vocab_size=tiny_data.vocab_size, val_batch_size=VAL_BATCH, eval_seq_len=16, eval_stride=16)
    model = random_model(hp)
    plain = tg.metrics(score(model, val, hp))
    sliding = tg.metrics(score(model, val, hp, sliding=True))
    assert sliding == pytest.approx(plain, rel=1e-12)


@pytest.mark.parametrize("seq_len, stride", [(16, 4), (32, 8), (16, 5), (24, 24)])
def test_sliding_scores_every_token_once(tiny_data, val, seq_len, stride):
    hp = tiny_hp(vocab_size=tiny_data.vocab_size, val_batch_size=VAL_BATCH, eval_seq_len=seq_len,
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
    hp = tiny_hp(vocab_size=tiny_data.vocab_size, val_batch_size=VAL_BATCH, eval_seq_len=16, eval_stride=4)
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
    env = tiny_data.env(RUN_ID="ttt_only", ITERATIONS="4", EVAL_STRIDE="32", TTT_ENABLED="1",
                        TTT_CHUNK_TOKENS="4096", SLIDING_WINDOW_ENABLED="0")
    out = run_trainer(env, tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert not re.search(r"^final_\w+_sliding_window", out.stdout, flags=re.M)
    assert "final_int8_zlib_ttt_exact" in out.stdout
    total = re.search(r"^final_eval_total eval_time:(\d+)ms limit:600000ms "
                      r"passes:roundtrip:(\d+)ms,ttt:(\d+)ms$", out.stdout, flags=re.M)
    assert total, out.stdout[-2000:]
    passes = int(total.group(2)) + int(total.group(3))
    assert int(total.group(1)) in range(passes - 1, passes + 2), "the total is the passes' sum"


# ---- score-first test-time training ----

CHUNK = 512


@pytest.fixture(scope="module")
def ttt_run(tiny_data) -> tg.Run:
    """A ready run: a trained-looking tiny model (random weights, every layer active) and the tiny
    validation split, cut to 7 chunks, the last one short."""
    env = tiny_data.env(EVAL_STRIDE="32", TTT_ENABLED="1", TTT_CHUNK_TOKENS=str(CHUNK),
                        TTT_LR="0.05", VAL_BATCH_SIZE="1024")
    run = tg.setup(env)
    tg.build_model(run)
    torch.manual_seed(0)
    for p in run.model.parameters():
        torch.nn.init.normal_(p, std=0.05)
    end = 6 * CHUNK + 100 + 1
    run.val = tg.Validation(run.val.tokens[:end], run.val.bytes[:end], run.hp.val_batch_size)
    return run


def ttt(ready: tg.Run, tokens=None, **settings):
    """test_time_train on a copy of the run's model, over tokens (default: its own), with settings
    changed: (sums per chunk, the trained copy)."""
    run = copy.copy(ready)
    run.hp = dataclasses.replace(ready.hp, **settings)
    run.model = copy.deepcopy(ready.model)
    run.scorer = run.model
    run.trainer = run.model
    if tokens is not None:
        run.val = dataclasses.replace(ready.val, tokens=tokens)
    return tg.test_time_train(run), run.model


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    pairs = zip(a.state_dict().values(), b.state_dict().values())
    return all(torch.equal(x, y) for x, y in pairs)


def test_a_chunk_score_never_sees_later_tokens(ttt_run):
    sums, _ = ttt(ttt_run)
    assert sums.shape == (7, 3)
    assert sums[:, 1].tolist() == [CHUNK] * 6 + [100]
    tokens = ttt_run.val.tokens
    for k in (0, 2, 4):  # change every token after chunk k's last target
        changed = tokens.clone()
        after = (k + 1) * CHUNK + 1
        changed[after:] = torch.randint_like(changed[after:], 2, ttt_run.hp.vocab_size)
        other, _ = ttt(ttt_run, changed)
        assert torch.equal(other[:k + 1], sums[:k + 1]), f"chunks up to {k} saw later tokens"
        seen = not torch.equal(other[k + 1], sums[k + 1])
        assert seen, "the change is visible where it is scored"


def test_zero_learning_rate_reproduces_the_sliding_score(ttt_run):
    model = ttt_run.model
    sums, after = ttt(ttt_run, ttt_lr=0.0)
    assert same_weights(after, model)
    sliding = score(model, ttt_run.val, ttt_run.hp, sliding=True, layout=ttt_run.layout)
    total = sums.sum(0)
    assert total[1:].tolist() == sliding[1:].tolist(), "the same tokens and bytes, each scored once"
    assert total[0].item() == pytest.approx(sliding[0].item(), rel=1e-9)
    plain_sums, _ = ttt(ttt_run, ttt_lr=0.0, eval_stride=0)
    plain = score(model, ttt_run.val, ttt_run.hp, layout=ttt_run.layout)
    assert plain_sums.sum(0)[0].item() == pytest.approx(plain[0].item(), rel=1e-9)


def test_training_helps_and_the_last_chunk_changes_nothing(ttt_run):
    sums, trained = ttt(ttt_run)
    frozen, _ = ttt(ttt_run, ttt_lr=0.0)
    assert sums[0].tolist() == frozen[0].tolist(), "the first chunk is scored before any update"
    adapted = tg.metrics(sums[1:].sum(0))[0]
    assert adapted < tg.metrics(frozen[1:].sum(0))[0], "adapting lowers the later chunks' loss"
    changed = ttt_run.val.tokens.clone()
    last = 6 * CHUNK + 1
    changed[last:] = torch.randint_like(changed[last:], 2, ttt_run.hp.vocab_size)
    _, other = ttt(ttt_run, changed)
    assert same_weights(other, trained), "the last chunk's tokens reached the weights"
    assert not same_weights(trained, ttt_run.model)


def test_ttt_is_sgd_with_momentum_clipping_epochs_and_a_cosine_over_the_chunks(ttt_run):
    """TTT_EPOCHS, TTT_MOMENTUM, TTT_GRAD_CLIP and the cosine decay, against SGD written out
    by hand: chunk c of n trains at TTT_LR * (1 + cos(pi c / (n - 1))) / 2, TTT_EPOCHS steps
    on the whole chunk, the gradient's global norm clipped to TTT_GRAD_CLIP, momentum without
    dampening; the last chunk is not trained on."""
    settings = dict(ttt_epochs=2, ttt_momentum=0.5, ttt_grad_clip=0.05, ttt_lr=0.05)
    hp = dataclasses.replace(ttt_run.hp, **settings)
    _, trained = ttt(ttt_run, **settings)
    reference = copy.deepcopy(ttt_run.model)
    params = list(reference.parameters())
    momenta = [torch.zeros_like(p) for p in params]
    tokens = ttt_run.val.tokens
    n = tokens.numel() - 1
    bounds = list(range(0, n, CHUNK)) + [n]
    clipped = 0
    for c, (a, b) in enumerate(zip(bounds[:-2], bounds[1:-1])):
        x = tokens[a:b].long().view(-1, hp.train_seq_len)
        y = tokens[a + 1:b + 1].long().view(-1, hp.train_seq_len)
        lr = hp.ttt_lr * (1 + math.cos(math.pi * c / (len(bounds) - 2))) / 2
        for _ in range(hp.ttt_epochs):
            grads = torch.autograd.grad(reference(x, y), params)
            norm = torch.sqrt(sum(g.square().sum() for g in grads))
            clipped += bool(norm > hp.ttt_grad_clip)
            factor = min(1.0, hp.ttt_grad_clip / (norm.item() + 1e-6))
            with torch.no_grad():
                for p, g, m in zip(params, grads, momenta):
                    m.mul_(hp.ttt_momentum).add_(g * factor)
                    p.sub_(lr * m)
    assert clipped > 0, "the clip must bite in this test"
    for (name, p), q in zip(trained.named_parameters(), params):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6, msg=name)


def test_chunks_must_split_evenly_over_ranks(tiny_data):
    with pytest.raises(tg.ConfigError, match=r"TTT_CHUNK_TOKENS=100: use a multiple of .*64"):
        tg.setup(tiny_data.env(TTT_ENABLED="1", TTT_CHUNK_TOKENS="100"))
    with pytest.raises(tg.ConfigError, match=r"TTT_CHUNK_TOKENS=0 must be positive"):
        tg.setup(tiny_data.env(TTT_ENABLED="1", TTT_CHUNK_TOKENS="0"))
    with pytest.raises(tg.ConfigError, match=r"TTT_CHUNK_TOKENS=192: use a multiple of .*128"):
        tg.setup(tiny_data.env(TTT_ENABLED="1", TTT_CHUNK_TOKENS="192", WORLD_SIZE="2"))


def test_a_compiled_trainer_trains_the_model_it_wraps(ttt_run):
    """On CUDA the run trains through the compiled wrapper, which raises on bool(); it must
    train the same weights."""
    sums, trained = ttt(ttt_run)
    wrapped = copy.deepcopy(ttt_run.model)
    compiled = torch.compile(wrapped, backend="eager")
    with pytest.raises(TypeError):
        bool(compiled)
    run = copy.copy(ttt_run)
    run.model = wrapped
    run.scorer = wrapped
    run.trainer = compiled
    other = tg.test_time_train(run)
    assert torch.allclose(other, sums, rtol=1e-6, atol=0)
    for name, p in wrapped.state_dict().items():
        assert torch.allclose(p, trained.state_dict()[name], rtol=1e-5, atol=1e-7), name

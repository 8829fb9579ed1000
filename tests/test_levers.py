"""Sliding-window evaluation, low-bit export and EMA: the levers behind env vars."""

import dataclasses
import math
import re

import pytest
import torch

import train_gpt as tg
from conftest import run_trainer


def tiny_hp(**overrides) -> tg.Hyperparameters:
    values = dict(vocab_size=64, num_layers=2, model_dim=32, num_heads=4, num_kv_heads=2, train_seq_len=16,
                  val_batch_size=16 * 8 * 3)
    values.update(overrides)
    return tg.Hyperparameters(**values)


def cpu_layout(**overrides) -> tg.Layout:
    values = dict(rank=0, world_size=1, local_rank=0, distributed=False, device=torch.device("cpu"),
                  grad_accum_steps=8, use_compile=False, use_bf16=False)
    values.update(overrides)
    return tg.Layout(**values)


class PositionCounter(torch.nn.Module):
    """A stand-in model whose loss is 1 per target, and which records every scored batch."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def forward(self, x, y, reduction="mean"):
        self.calls.append(x.clone())
        return torch.ones(y.numel())


# ---- sliding-window evaluation ----


def random_model(hp: tg.Hyperparameters) -> tg.GPT:
    torch.manual_seed(0)
    model = tg.GPT(hp)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model


@pytest.fixture
def val_setup(tiny_data):
    tok = tg.load_tokenizer(tiny_data.tokenizer_path, tiny_data.vocab_size)
    val_tokens, val_bytes = tg.load_validation(str(tiny_data.data_path), 16, tok)
    return val_bytes[:16 * 40 + 1], val_tokens[:16 * 40 + 1]


def test_sliding_equals_plain_when_stride_is_the_window(tiny_data, val_setup):
    val_bytes, val_tokens = val_setup
    hp = tiny_hp(vocab_size=tiny_data.vocab_size, eval_seq_len=16, eval_stride=16)
    model = random_model(hp)
    plain = tg.metrics(tg.score(model, val_tokens, val_bytes, hp, cpu_layout()))
    sliding = tg.metrics(tg.score(model, val_tokens, val_bytes, hp, cpu_layout(), sliding=True))
    assert sliding == pytest.approx(plain, rel=1e-12)


@pytest.mark.parametrize("seq_len, stride", [(16, 4), (32, 8), (16, 5), (24, 24)])
def test_sliding_scores_every_token_once(tiny_data, val_setup, seq_len, stride):
    val_bytes, val_tokens = val_setup
    hp = tiny_hp(vocab_size=tiny_data.vocab_size, eval_seq_len=seq_len, eval_stride=stride)
    # a model with loss 1 per scored token: val_loss = 1 exactly, and val_bpb = tokens / (bytes * ln 2)
    counter = PositionCounter()
    loss, bpb = tg.metrics(tg.score(counter, val_tokens, val_bytes, hp, cpu_layout(), sliding=True))
    plain_loss, plain_bpb = tg.metrics(tg.score(PositionCounter(), val_tokens, val_bytes, hp, cpu_layout()))
    assert loss == 1.0 and plain_loss == 1.0
    assert bpb == pytest.approx(plain_bpb, rel=1e-12), "same tokens and bytes as the plain eval"
    assert len({c.shape for c in counter.calls}) == 1, "one batch shape: a compiled model sees one eval graph"
    windows = torch.cat(counter.calls)
    assert windows.shape[1] == seq_len, "every window has the full length"
    n = val_tokens.numel() - 1
    real = 1 + math.ceil((n - seq_len) / stride)
    assert real <= windows.shape[0] < real + counter.calls[0].shape[0], "padding fills only the last batch"


def test_two_ranks_share_the_windows_and_each_scored_token_has_its_context(tiny_data, val_setup):
    val_bytes, val_tokens = val_setup
    hp = tiny_hp(vocab_size=tiny_data.vocab_size, eval_seq_len=16, eval_stride=4)
    model = random_model(hp)
    full = tg.score(model, val_tokens, val_bytes, hp, cpu_layout(), sliding=True)
    halves = [tg.score(model, val_tokens, val_bytes, hp, cpu_layout(rank=r, world_size=2), sliding=True) for r in (0, 1)]
    assert halves[0][1] > 0 and halves[1][1] > 0, "both ranks score windows"
    assert (halves[0] + halves[1])[1:].tolist() == full[1:].tolist(), "together: the same tokens and bytes"
    assert (halves[0] + halves[1])[0].item() == pytest.approx(full[0].item(), rel=1e-12)
    class PositionLoss(torch.nn.Module):  # each target's loss is its position in its window
        def forward(self, x, y, reduction="mean"):
            return torch.arange(x.size(1), dtype=torch.float32).repeat(x.size(0))

    total = tg.score(PositionLoss(), val_tokens, val_bytes, hp, cpu_layout(), sliding=True)[0].item()
    later = val_tokens.numel() - 1 - 16  # targets after the first window, scored 4 at a time at positions 12..15
    expected = sum(range(16)) + (later // 4) * sum(range(12, 16)) + sum(range(16 - later % 4, 16))
    assert total == expected, "the first window scores all 16; every later target sits at position >= 12"
    assert tg.metrics(tg.score(model, val_tokens, val_bytes, hp, cpu_layout(), sliding=True)) != \
        tg.metrics(tg.score(model, val_tokens, val_bytes, hp, cpu_layout())), "and the context changes the score"


# ---- low-bit export ----


@pytest.mark.parametrize("bits", [4, 5, 6, 7, 8])
def test_integers_are_stored_one_byte_each_within_the_width(bits):
    torch.manual_seed(0)
    w = torch.randn(64, 300) * torch.rand(64, 1)
    w[3, 7] = 50.0  # an outlier row
    stored = tg.quantize_state_dict({"m.weight": w}, tg.Hyperparameters(quant_bits=bits))
    ints, qmax = stored["ints"]["m.weight"], 2 ** (bits - 1) - 1
    assert ints.dtype == torch.int8 and ints.shape == w.shape
    assert ints.abs().max() == qmax, "the full range is used"
    restored = tg.dequantize_state_dict(stored)["m.weight"]
    assert torch.equal(restored, ints.float() * stored["scales"]["m.weight"].float()[:, None])


@pytest.mark.parametrize("bits", [4, 6, 8])
def test_clip_search_never_worse_than_no_clip(bits):
    torch.manual_seed(0)
    w = torch.randn(64, 256)
    w[:, :3] *= 12  # heavy outliers: clipping them should pay at low widths
    q, scale = tg.quantize_rows(w, bits)
    qmax = 2 ** (bits - 1) - 1
    no_clip_scale = (w.abs().amax(dim=1) / qmax).half().float()
    no_clip = torch.clamp(torch.round(w / no_clip_scale[:, None]), -qmax, qmax) * no_clip_scale[:, None]
    err_search = (q * scale[:, None] - w).square().sum(dim=1)
    err_none = (no_clip - w).square().sum(dim=1)
    assert (err_search <= err_none + 1e-6).all()
    if bits == 4:
        assert err_search.sum() < 0.9 * err_none.sum(), "at 4 bits the search should clip the outliers"
    assert q.abs().max() <= qmax and torch.equal(q, q.round())


def test_zero_rows_quantize_without_nan():
    w = torch.zeros(4, 300)
    w[1] = 1e-9
    q, scale = tg.quantize_rows(w, 6)
    assert torch.isfinite(q * scale[:, None]).all()


# ---- EMA ----


def test_ema_update_matches_formula_and_swap_restores():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    ema = tg.EMA(model, decay=0.9)
    expected = [p.detach().clone() for p in model.parameters()]
    for _ in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        ema.update(model)
        expected = [0.9 * e + 0.1 * p.detach() for e, p in zip(expected, model.parameters())]
    for e, got in zip(expected, ema.params):
        torch.testing.assert_close(got, e)
    live = [p.detach().clone() for p in model.parameters()]
    ema.swap(model)
    for p, e in zip(model.parameters(), expected):
        torch.testing.assert_close(p.detach(), e)
    ema.swap(model)
    for p, l in zip(model.parameters(), live):
        assert torch.equal(p.detach(), l)


# ---- end to end: the levers together ----


def test_levers_end_to_end(tiny_data, tmp_path):
    env = tiny_data.env(RUN_ID="levers", EVAL_STRIDE="16", QUANT_BITS="6", COMPRESSOR="lzma", EMA_DECAY="0.9")
    out = run_trainer(env, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    plain = re.search(r"final_int6_lzma_roundtrip_exact val_loss:(\S+) val_bpb:(\S+)", out.stdout)
    sliding = re.search(r"final_int6_lzma_sliding_window_exact val_loss:(\S+) val_bpb:(\S+)", out.stdout)
    assert plain and sliding
    assert float(sliding.group(1)) < float(plain.group(1)), "more context per scored token lowers the loss"
    total = int(re.search(r"Total submission size int6\+lzma: (\d+) bytes", out.stdout).group(1))
    artifact = tmp_path / "logs" / "levers_model.int6_lzma.ptz"
    assert total == len((tg.Path(tg.__file__)).read_bytes()) + artifact.stat().st_size

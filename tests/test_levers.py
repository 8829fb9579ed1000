"""Sliding-window evaluation, low-bit export, EMA and late QAT: the levers behind env vars."""

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
    val_tokens, val_bytes = tg.load_validation(str(tiny_data.data_path / "fineweb_val_*.bin"), 16, tok)
    return val_bytes[:16 * 40 + 1], val_tokens[:16 * 40 + 1]


def test_sliding_equals_plain_when_stride_is_the_window(tiny_data, val_setup):
    val_bytes, val_tokens = val_setup
    hp = tiny_hp(vocab_size=tiny_data.vocab_size, eval_seq_len=16, eval_stride=16)
    model = random_model(hp)
    plain = tg.evaluate(model, val_tokens, val_bytes, hp, cpu_layout())
    sliding = tg.evaluate(model, val_tokens, val_bytes, hp, cpu_layout(), sliding=True)
    assert sliding == pytest.approx(plain, rel=1e-12)


@pytest.mark.parametrize("seq_len, stride", [(16, 4), (32, 8), (16, 5), (24, 24)])
def test_sliding_scores_every_token_once(tiny_data, val_setup, seq_len, stride):
    val_bytes, val_tokens = val_setup
    hp = tiny_hp(vocab_size=tiny_data.vocab_size, eval_seq_len=seq_len, eval_stride=stride)
    # a model with loss 1 per scored token: val_loss = 1 exactly, and val_bpb = tokens / (bytes * ln 2)
    counter = PositionCounter()
    loss, bpb = tg.evaluate(counter, val_tokens, val_bytes, hp, cpu_layout(), sliding=True)
    plain_loss, plain_bpb = tg.evaluate(PositionCounter(), val_tokens, val_bytes, hp, cpu_layout())
    assert loss == 1.0 and plain_loss == 1.0
    assert bpb == pytest.approx(plain_bpb, rel=1e-12), "same tokens and bytes as the plain eval"
    assert len({c.shape for c in counter.calls}) == 1, "one batch shape: a compiled model sees one eval graph"
    windows = torch.cat(counter.calls)
    assert windows.shape[1] == seq_len, "every window has the full length"
    n = val_tokens.numel() - 1
    real = 1 + math.ceil((n - seq_len) / stride)
    assert real <= windows.shape[0] < real + counter.calls[0].shape[0], "padding fills only the last batch"


def test_sliding_gives_each_token_more_context(tiny_data, val_setup):
    val_bytes, val_tokens = val_setup
    hp = tiny_hp(vocab_size=tiny_data.vocab_size, eval_seq_len=16, eval_stride=4)
    model = random_model(hp)
    # rank split: two ranks' sums equal one rank's (each evaluates its share; no process group needed)
    full = tg.evaluate(model, val_tokens, val_bytes, hp, cpu_layout(), sliding=True)
    assert full != tg.evaluate(model, val_tokens, val_bytes, hp, cpu_layout())


# ---- low-bit export ----


@pytest.mark.parametrize("bits", [4, 5, 6, 7, 8])
def test_integers_are_stored_one_byte_each_within_the_width(bits):
    torch.manual_seed(0)
    w = torch.randn(64, 300) * torch.rand(64, 1)
    w[3, 7] = 50.0  # an outlier row
    stored = tg.quantize_state_dict({"m.weight": w}, bits, 8)
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


# ---- late QAT ----


def qat_model() -> tg.GPT:
    # wide enough that the export quantizes the block matrices (more than KEEP_FLOAT_MAX_NUMEL weights)
    hp = tiny_hp(num_layers=1, model_dim=192, quant_bits=4, qat_start_frac=0.5)
    model = random_model(hp)
    model.qat_layers = [m for m in model.blocks.modules() if isinstance(m, tg.CastedLinear)]
    assert all(tg.is_quantized(m.weight) for m in model.qat_layers)
    return model


def set_qat(model: tg.GPT, on: bool) -> None:
    tg.set_phase(model, looping=False, qat_bits=4 if on else 0)


@pytest.mark.parametrize("compiled", [False, True])
def test_qat_switch_changes_the_output(compiled):
    model = qat_model()
    run = torch.compile(model.logits, dynamic=False, fullgraph=True) if compiled else model.logits
    idx = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        off = run(idx)
        set_qat(model, True)
        on = run(idx)
        set_qat(model, False)
        off_again = run(idx)
    assert (on - off).abs().max() > 1e-3, "QAT on must change the output (an unguarded flag would not)"
    torch.testing.assert_close(off_again, off)
    # and QAT on equals the model with its block matrices really quantized
    with torch.no_grad():
        for module in model.qat_layers:
            q, scale = tg.quantize_rows(module.weight, 4)
            module.weight.copy_(q * scale[:, None])
        torch.testing.assert_close(model.logits(idx), on, rtol=1e-4, atol=1e-4)


def test_qat_at_sigmas_equals_the_weights_exported_at_them():
    model = qat_model()
    idx = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        tg.set_phase(model, looping=False, qat_bits=4, qat_sigmas=3.0)
        on = model.logits(idx)
        tg.set_phase(model, looping=False, qat_bits=0)
        for module in model.qat_layers:
            q, scale = tg.quantize_rows(module.weight, 4, 3.0)
            assert not torch.equal(scale, tg.quantize_rows(module.weight, 4)[1]), "not the clip search's scales"
            module.weight.copy_(q * scale[:, None])
        torch.testing.assert_close(model.logits(idx), on, rtol=1e-4, atol=1e-4)


def test_qat_gradient_is_straight_through():
    model = qat_model()
    set_qat(model, True)
    layer = model.qat_layers[0]
    x = torch.randn(3, layer.in_features)
    layer(x).sum().backward()
    expected = torch.ones(3, layer.out_features).T @ x  # d(sum(x W^T))/dW, as if unquantized
    torch.testing.assert_close(layer.weight.grad, expected)


# ---- end to end: the levers together ----


def test_levers_end_to_end(tiny_data, tmp_path):
    env = tiny_data.env(RUN_ID="levers", EVAL_STRIDE="16", QUANT_BITS="6", COMPRESSOR="lzma", EMA_DECAY="0.9",
                        QAT_START_FRAC="0.5")
    out = run_trainer(env, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "phase: from step:10 depth_recurrence:off late_qat:int6" in out.stdout
    plain = re.search(r"final_int6_lzma_roundtrip_exact val_loss:(\S+) val_bpb:(\S+)", out.stdout)
    sliding = re.search(r"final_int6_lzma_sliding_window_exact val_loss:(\S+) val_bpb:(\S+)", out.stdout)
    assert plain and sliding
    assert float(sliding.group(1)) < float(plain.group(1)), "more context per scored token lowers the loss"
    total = int(re.search(r"Total submission size int6\+lzma: (\d+) bytes", out.stdout).group(1))
    artifact = tmp_path / "logs" / "levers_model.int6_lzma.ptz"
    assert total == len((tg.Path(tg.__file__)).read_bytes()) + artifact.stat().st_size

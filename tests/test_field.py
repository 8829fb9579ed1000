"""The field's best entry, term for term (issue 20): its gates, orthogonal init, parallel lanes, per-kind clips,
CaseOps scoring and packed code, each checked against the property or the equations that define it."""

import re
import subprocess
import sys

import pytest
import torch

import train_gpt as tg
from conftest import ROOT, run_trainer
from test_levers import random_model, tiny_hp

FIELD_ON = dict(skip_gates=True, ortho_init=True, attn_gate=True, smear_gate=True, num_layers=5, loop_start=1,
                loop_end=2, loop_repeats=1, parallel_from=3, xsa_last_n=2, ln_scale=True, rope_dims=4)


def test_zero_initialized_gates_leave_the_logits_bitwise_as_without_them():
    """At step 0 the sparse attention gate (its head outputs meet a zero projection) and SmearGate (lambda 0)
    change nothing; the skip gates blend x and the skip half and half (the field's lerp at g = 0)."""
    idx = torch.randint(0, 64, (2, 16))
    for gate in ("attn_gate", "smear_gate"):
        torch.manual_seed(0)
        off = tg.GPT(tiny_hp(num_layers=4))
        torch.manual_seed(0)
        on = tg.GPT(tiny_hp(num_layers=4, **{gate: True}))
        on.load_state_dict(off.state_dict(), strict=False)
        assert torch.equal(on.logits(idx), off.logits(idx)), gate
    model = tg.GPT(tiny_hp(num_layers=4, skip_gates=True))
    x, skip = torch.randn(2, 16, 32), torch.randn(2, 16, 32)
    torch.testing.assert_close(model.add_skip(x, 0, skip), 0.5 * x + 0.5 * skip)


def test_orthogonal_init_gives_orthogonal_q_k_v_and_mlp_input():
    model = tg.GPT(tiny_hp(num_layers=2, ortho_init=True, mlp_mult=2))
    for block in model.blocks:
        for linear in (block.attn.c_q, block.attn.c_k, block.attn.c_v, block.mlp.fc):
            w = linear.weight.detach()
            gram = w @ w.T if w.size(0) <= w.size(1) else w.T @ w
            torch.testing.assert_close(gram, torch.eye(len(gram)), atol=1e-5, rtol=0)
        assert not block.attn.proj.weight.any() and not block.mlp.proj.weight.any(), "output projections stay zero"
    plain = tg.GPT(tiny_hp(num_layers=2))
    w = plain.blocks[0].attn.c_q.weight.detach()
    assert not torch.allclose(w @ w.T, torch.eye(len(w)), atol=0.1), "the default init is not orthogonal"


def field_logits(model: tg.GPT, idx: torch.Tensor) -> torch.Tensor:
    """The field's best entry's forward, written out from its equations, on our modules' weights: U-Net skips
    x <- g x + (1 - g) w skip with g = sigmoid(gate), LIFO; from PARALLEL_FROM two lanes, the skip into lane 0
    only; attention reads resid_mix(lane 0, x0), the MLP lane 1 as it is; lane_i <- r_i lane_i + p_i,a a + p_i,m m;
    the output the lanes' mean."""
    x = x0 = model.embed(idx)
    order, lanes, skips = model.layer_order(), None, []
    encoder = len(order) // 2
    for i, layer in enumerate(order):
        block = model.blocks[layer]
        if layer == model.parallel_from and lanes is None:
            lanes = [x, x]
        if i >= encoder and skips:
            g = torch.sigmoid(model.skip_gates[i - encoder])
            skip = model.skip_weights[i - encoder] * skips.pop()
            if lanes:
                lanes[0] = g * lanes[0] + (1 - g) * skip
            else:
                x = g * x + (1 - g) * skip
        mix = block.resid_mix
        if lanes:
            a = block.attn_scale * block.attn(block.norm(mix[0] * lanes[0] + mix[1] * x0))
            m = block.mlp_scale * block.mlp(block.norm(lanes[1]))
            w = block.lane_mix
            lanes = [w[j, 0] * lanes[j] + w[j, 1] * a + w[j, 2] * m for j in (0, 1)]
        else:
            x = mix[0] * x + mix[1] * x0
            x = x + block.attn_scale * block.attn(block.norm(x))
            x = x + block.mlp_scale * block.mlp(block.norm(x))
        if i < encoder:
            skips.append(x if lanes is None else (lanes[0] + lanes[1]) / 2)
    h = model.final_norm(x if lanes is None else (lanes[0] + lanes[1]) / 2)
    return model.logit_softcap * torch.tanh((h @ model.tok_emb.weight.T) / model.logit_softcap)


@pytest.mark.parametrize("looping", [False, True])
def test_lanes_and_skip_gates_match_the_fields_equations(looping):
    model = random_model(tiny_hp(**FIELD_ON))
    model.looping = looping
    idx = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(model.logits(idx), field_logits(model, idx), atol=2e-5, rtol=2e-5)


def test_lanes_start_as_the_field_initializes_them():
    block = tg.GPT(tiny_hp(**FIELD_ON)).blocks[3]
    assert torch.equal(block.lane_mix, torch.tensor([[1.1, 1.0, 1.0]] * 2)), "residual 1.1, attention and MLP 1"


def test_the_attention_gate_scales_each_head_by_its_gate_on_the_first_12_channels():
    torch.manual_seed(0)
    attn = tg.CausalSelfAttention(tg.Hyperparameters(model_dim=32, num_heads=4, num_kv_heads=2, xsa_last_n=1, train_seq_len=16,
                                                  attn_gate=True), layer=8)
    with torch.no_grad():
        for p in attn.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    x = torch.randn(2, 16, 32)
    plain = tg.CausalSelfAttention(tg.Hyperparameters(model_dim=32, num_heads=4, num_kv_heads=2, xsa_last_n=1, train_seq_len=16), 8)
    plain.load_state_dict({k: v for k, v in attn.state_dict().items() if k != "attn_gate"})
    with torch.no_grad():
        plain.proj.weight.copy_(torch.eye(32))  # expose the head outputs
        heads = plain(x).view(2, 16, 4, 8)
        gate = torch.sigmoid(0.5 * x[..., :12] @ attn.attn_gate.T)  # (B, T, H)
        expected = attn.proj((heads * gate[..., None]).reshape(2, 16, 32))
        torch.testing.assert_close(attn(x), expected, atol=1e-5, rtol=1e-5)


def test_each_kind_of_matrix_is_clipped_at_its_own_sigmas_and_gates_stay_int8():
    torch.manual_seed(1)
    state = {"tok_emb.weight": torch.randn(64, 300), "blocks.0.attn.c_q.weight": torch.randn(128, 256),
             "blocks.0.mlp.fc.weight": torch.randn(128, 256), "bigram_proj.weight": torch.randn(128, 256),
             "blocks.0.attn.attn_gate": torch.randn(4, 12)}
    hp = tg.Hyperparameters(quant_bits=6, embed_quant_bits=7, quant_sigmas=12.0, attn_quant_sigmas=13.0,
                            mlp_quant_sigmas=11.5, embed_quant_sigmas=14.0)
    stored = tg.quantize_state_dict(state, hp)
    for name, bits, sigmas in (("tok_emb.weight", 7, 14.0), ("blocks.0.attn.c_q.weight", 6, 13.0),
                               ("blocks.0.mlp.fc.weight", 6, 11.5), ("bigram_proj.weight", 6, 12.0),
                               ("blocks.0.attn.attn_gate", 8, 0.0)):
        q, scale = tg.quantize_rows(state[name], bits, sigmas)
        assert torch.equal(stored["scales"][name], scale.half()), name
        assert torch.equal(stored["ints"][name], q.to(torch.int8)), name
    assert "blocks.0.attn.attn_gate" in stored["ints"], "the gate is stored as int8 rows, not as a float"


def test_case_restore_undoes_the_fields_transform():
    cases = {"\ue001hello \ue001world": "Hello World", "\ue002nasa": "NASA", "\ue001a": "A", "i\ue003phone": "iPhone",
             "\ue001mc\ue003donald's": "McDonald's", "\ue001open\ue003a\ue003i's \ue002gpt-4": "OpenAI's GPT-4",
             "\ue001u.\ue001s.\ue001a.": "U.S.A.", "x2\ue001y": "x2Y", "\u00c9\ue002cole": "\u00c9COLE",
             "\ue004\ue001": "\ue001", "a\ue004\ue004b": "a\ue004b", "plain text, 12 \u20ac": "plain text, 12 \u20ac"}
    for encoded, original in cases.items():
        assert tg.case_restore(encoded) == original, encoded


def test_a_packed_script_trains_bitwise_like_the_readable_one(tiny_data, tmp_path):
    source = (ROOT / "train_gpt.py").read_bytes()
    packed = tg.pack_source(source)
    assert packed.startswith(tg.PACKED_HEAD) and len(packed) < len(source) / 3 and tg.pack_source(packed) == packed
    outs = {}
    for name, script in (("readable", source), ("packed", packed)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "train_gpt.py").write_bytes(script)
        out = subprocess.run([sys.executable, "train_gpt.py"], cwd=folder, capture_output=True, text=True, timeout=240,
                             env=tiny_data.env(RUN_ID=name, ITERATIONS=3, PACK_CODE=1))
        assert out.returncode == 0, out.stderr[-3000:]
        outs[name] = out.stdout
    lines = {name: re.findall(r"^(final_\w+_exact .*|artifact: \S+ bytes:\d+ sha256:\w+)", text, flags=re.M)
             for name, text in outs.items()}
    assert lines["packed"] == [line.replace("readable", "packed") for line in lines["readable"]] and lines["packed"]
    sizes = {name: int(re.search(r"^Code size: (\d+) bytes", text, flags=re.M).group(1)) for name, text in outs.items()}
    assert sizes["readable"] == sizes["packed"] == len(packed), "both count the packed file, as it will be submitted"


def test_lqer_lowers_the_quantization_error_and_round_trips_through_the_safe_loader(tmp_path):
    torch.manual_seed(2)
    state = {f"blocks.{i}.mlp.fc.weight": torch.randn(128, 136) * (1 + i) for i in range(4)}  # B: 4 x 136, padded
    plain_hp = tg.Hyperparameters(quant_bits=5, quant_sigmas=12.0, compressor="lzma")
    lqer_hp = tg.Hyperparameters(quant_bits=5, quant_sigmas=12.0, compressor="lzma", lqer_rank=4, lqer_top_k=2)
    plain = tg.dequantize_state_dict(tg.quantize_state_dict(state, plain_hp))
    stored = tg.quantize_state_dict(state, lqer_hp)
    corrected_names = {name.removesuffix(".lqer_a") for name in stored["ints"] if name.endswith(".lqer_a")}
    assert corrected_names == {"blocks.2.mlp.fc.weight", "blocks.3.mlp.fc.weight"}, "the largest errors"
    corrected = tg.dequantize_state_dict(stored)
    assert corrected.keys() == state.keys(), "the factors are no weights of their own"
    for name, w in state.items():
        before, after = (plain[name] - w).norm(), (corrected[name] - w).norm()
        assert after < 0.97 * before if name in corrected_names else torch.equal(corrected[name], plain[name]), name
    a, b = stored["ints"]["blocks.3.mlp.fc.weight.lqer_a"], stored["ints"]["blocks.3.mlp.fc.weight.lqer_b"]
    assert a.shape == (1, 128 * 4) and b.shape == (9, 64), "A: one scale; B: groups of 64"
    assert -2 <= a.min() and a.max() <= 1 and -8 <= b.min() and b.max() <= 7, "int2 A, int4 B"
    assert len(a.unique()) >= 3 and len(b.unique()) >= 12, "their ranges used"
    # the correction is A B of the stored integers, as the field reads them back
    A = a.float() * stored["scales"]["blocks.3.mlp.fc.weight.lqer_a"].float()
    B = b.float() * stored["scales"]["blocks.3.mlp.fc.weight.lqer_b"].float()[:, None]
    torch.testing.assert_close(corrected["blocks.3.mlp.fc.weight"] - plain["blocks.3.mlp.fc.weight"],
                               A.view(128, 4) @ B.flatten()[:4 * 136].view(4, 136))
    tg.save_artifact(state, tmp_path / "m.ptz", lqer_hp)
    loaded = tg.load_artifact(tmp_path / "m.ptz")  # weights_only: nothing in it can run code
    assert all(torch.equal(loaded[name], corrected[name]) for name in state)

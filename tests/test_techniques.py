"""The model and optimizer techniques of the field's stack (issue 9): each is off by default, and
each is checked against the property that defines it."""

import importlib.util
import sys

import pytest
import torch
import torch.nn.functional as F

import train_gpt as tg
from conftest import ROOT
from test_levers import cpu_layout, random_model, tiny_hp

# The script of the CPU-track record made before these techniques existed: with every new setting at
# its default, today's model and optimizer must compute exactly what it computed.
REFERENCE_SCRIPT = ROOT / "records" / "track_cpu" / "2026-11-22_Int6Qat7LayersSliding" / "train_gpt.py"

ALL_ON = dict(mlp_leaky_slope=0.5, rope_dims=4, ln_scale=True, xsa_last_n=2, smear_gate=True, bigram_buckets=97,
              bigram_dim=16, loop_start=1, loop_end=2, loop_repeats=2, parallel_from=3, muon_wd=0.1, embed_wd=0.05,
              scalar_wd=0.02, muon_row_norm=True, muon_polar=True, warmdown_frac=0.5, min_lr_scale=0.1)


def all_on_hp(**overrides) -> tg.Hyperparameters:
    return tiny_hp(**{"num_layers": 5, **ALL_ON, **overrides})


def load_reference():
    spec = importlib.util.spec_from_file_location("reference_train_gpt", REFERENCE_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_defaults_compute_what_the_reference_script_computes():
    ref = load_reference()
    values = dict(vocab_size=64, num_layers=3, model_dim=32, num_heads=4, num_kv_heads=2, train_seq_len=16)
    torch.manual_seed(0)
    ref_model = ref.GPT(ref.Hyperparameters(**values))
    model = tg.GPT(tg.Hyperparameters(**values))
    with torch.no_grad():  # make every parameter matter (the zero-initialized projections too)
        for p in ref_model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.load_state_dict(ref_model.state_dict(), strict=True)
    idx, targets = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    assert torch.equal(model.logits(idx), ref_model.logits(idx))
    for lib, m in ((ref, ref_model), (tg, model)):
        layout = lib.Layout(0, 1, 0, False, torch.device("cpu"), 1, False, False)
        optimizers, _ = lib.build_optimizers(m, lib.Hyperparameters(**values), layout)
        for step in range(2):
            m(idx, targets).backward()
            for opt in optimizers:
                opt.step()
                opt.zero_grad(set_to_none=True)
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        assert torch.equal(p, q), f"{name} differs from the reference after two optimizer steps"


def test_leaky_slope_zero_is_relu_squared_and_a_slope_passes_negatives():
    x = torch.randn(4, 32)
    mlp = tg.MLP(32, 2, leaky_slope=0.0)
    with torch.no_grad():
        mlp.proj.weight.normal_()
        assert torch.equal(mlp(x), mlp.proj(F.relu(mlp.fc(x)).square()))
        leaky = tg.MLP(32, 2, leaky_slope=0.5)
        leaky.load_state_dict(mlp.state_dict())
        h = mlp.fc(x)
        assert torch.equal(leaky(x), mlp.proj(torch.where(h > 0, h, 0.5 * h).square()))


def test_rope_dims_equal_to_head_dim_is_full_rope_and_partial_rope_leaves_the_rest():
    full, explicit = random_model(tiny_hp()), random_model(tiny_hp(rope_dims=8))  # head dim 32/4 = 8
    idx = torch.randint(0, 64, (2, 16))
    assert torch.equal(full.logits(idx), explicit.logits(idx))
    cos, sin = tg.rotary_cos_sin(16, 4, 10_000.0)
    x = torch.randn(2, 4, 16, 8)
    y = tg.apply_rotary(x, cos, sin)
    assert torch.equal(y[..., 4:], x[..., 4:]), "channels past ROPE_DIMS are not rotated"
    assert not torch.allclose(y[..., :4], x[..., :4])
    # a rotation: the rotated pairs keep their norm, and position 0 is not moved at all
    torch.testing.assert_close(y[..., :4].norm(dim=-1), x[..., :4].norm(dim=-1))
    torch.testing.assert_close(y[:, :, 0], x[:, :, 0])


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
def test_xsa_output_is_orthogonal_to_the_tokens_own_value(num_kv_heads):
    torch.manual_seed(0)
    attn = tg.CausalSelfAttention(tg.Hyperparameters(model_dim=32, num_heads=4, num_kv_heads=num_kv_heads, xsa_last_n=1,
                                                  train_seq_len=16), layer=8)
    attn.proj = torch.nn.Identity()  # expose the heads' outputs
    x = torch.randn(2, 16, 32)
    y = attn(x).view(2, 16, 4, 8)  # (B, T, H, hd)
    v = attn.c_v(x).view(2, 16, num_kv_heads, 8).repeat_interleave(4 // num_kv_heads, dim=2)  # (B, T, H, hd)
    v_hat = F.normalize(v, dim=-1)
    assert (y * v_hat).sum(-1).abs().max() < 1e-5
    attn.xsa = False  # the same heads without XSA are not orthogonal: the test can tell
    y = attn(x).view(2, 16, 4, 8)
    assert (y * v_hat).sum(-1).abs().max() > 0.1


@pytest.mark.parametrize("looping", [False, True])
def test_causal_with_every_technique_on(looping):
    model = random_model(all_on_hp())
    model.looping = looping
    idx = torch.randint(2, 64, (2, 16))
    changed = idx.clone()
    changed[:, 9] = (idx[:, 9] + 1) % 64
    with torch.no_grad():
        a, b = model.logits(idx), model.logits(changed)
    assert torch.equal(a[:, :9], b[:, :9]), "an earlier position saw a later token"
    assert not torch.allclose(a[:, 9:], b[:, 9:])


def test_smear_gate_and_bigram_do_not_cross_a_bos():
    model = random_model(all_on_hp())
    assert model.smear_gate.abs().min() > 0 and model.bigram.weight.abs().min() > 0
    idx = torch.randint(2, 64, (2, 16))
    changed = idx.clone()
    changed[:, 7] = (idx[:, 7] + 1) % 62 + 2
    with torch.no_grad():
        assert not torch.allclose(model.embed(idx)[:, 8], model.embed(changed)[:, 8]), "within a document it mixes"
        idx[:, 8] = changed[:, 8] = tg.BOS_ID  # now a document ends at 7 and the next starts at 8
        assert torch.equal(model.embed(idx)[:, 8:], model.embed(changed)[:, 8:]), "it crossed the BOS"


def test_bigram_hash_rows():
    idx = torch.tensor([[5, 9, tg.BOS_ID, 9, 5]])
    rows = tg.bigram_hash(idx, 97)
    assert rows[0, 0] == 96 and rows[0, 2] == 96, "no previous token, and BOS, use the reserved last row"
    assert rows[0, 1] == (36313 * 9 ^ 27191 * 5) % 96 and rows[0, 3] == (36313 * 9 ^ 27191 * tg.BOS_ID) % 96
    assert rows.max() < 97 and rows.min() >= 0


def test_looped_forward_equals_the_explicitly_unrolled_model():
    hp = all_on_hp()
    model = random_model(hp)
    model.looping = True
    order = [0, 1, 2, 1, 2, 1, 2, 3, 4]  # LOOP_START=1 LOOP_END=2 LOOP_REPEATS=2 over 5 layers
    assert model.layer_order() == order
    unrolled = tg.GPT(tiny_hp(**{**ALL_ON, "num_layers": len(order), "loop_repeats": 0}))
    unrolled.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("blocks.")},
                             strict=False)
    unrolled.blocks = torch.nn.ModuleList(model.blocks[i] for i in order)  # shared weights, as looped
    unrolled.parallel_from = order.index(hp.parallel_from)
    idx = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        assert torch.equal(model.logits(idx), unrolled.logits(idx))
        model.looping = False
        assert not torch.allclose(model.logits(idx), unrolled.logits(idx))


def test_loop_phase_switches_at_the_configured_fraction():
    hp = all_on_hp(iterations=20, loop_start_frac=0.5, max_wallclock_seconds=0)
    phases = [tg.looping_at(tg.training_progress(step, 0.0, hp), hp) for step in range(21)]
    assert phases.index(True) == 10 and all(phases[10:])
    hp.max_wallclock_seconds = 100.0  # under a wallclock cap, whichever of steps and time is further
    assert tg.looping_at(tg.training_progress(2, 50_000.0, hp), hp)


@pytest.mark.parametrize("row_norm, polar", [(False, False), (True, True)])
def test_muon_weight_decay_with_zero_gradient_is_exact_shrinkage(row_norm, polar):
    p = torch.nn.Parameter(torch.randn(16, 24))
    before = p.detach().clone()
    coeffs = tg.POLAR_EXPRESS_COEFFS if polar else tg.QUINTIC_COEFFS
    muon = tg.Muon([p], lr=0.05, momentum=0.95, backend_steps=5, update_dtype=torch.float32, weight_decay=0.2,
                   row_norm=row_norm, coeffs=coeffs)
    p.grad = torch.zeros_like(p)
    muon.step()
    assert torch.equal(p.detach(), before * (1 - 0.05 * 0.2))


def test_adamw_groups_decay_only_where_asked():
    hp = all_on_hp(embed_wd=0.5, scalar_wd=0.0)
    model = tg.GPT(hp)
    (adam, muon), _ = tg.build_optimizers(model, hp, cpu_layout())
    decays = {id(p): g["weight_decay"] for g in adam.param_groups for p in g["params"]}
    assert decays[id(model.tok_emb.weight)] == 0.5 and decays[id(model.bigram.weight)] == 0.5
    assert decays[id(model.smear_gate)] == 0.0 and decays[id(model.blocks[4].lane_mix)] == 0.0
    assert {id(p) for p in muon.param_groups[0]["params"]} >= {id(model.bigram_proj.weight)}
    assert muon.param_groups[0]["weight_decay"] == hp.muon_wd


@pytest.mark.parametrize("shape", [(64, 128), (128, 64), (96, 96)])
def test_polar_express_singular_values_in_a_narrow_band(shape):
    torch.manual_seed(0)
    k = min(shape)
    U, V = torch.linalg.qr(torch.randn(shape[0], k))[0], torch.linalg.qr(torch.randn(shape[1], k))[0]
    G = U @ torch.diag(torch.logspace(-2, 0, k)) @ V.T  # singular values spread over two decades
    s_polar = torch.linalg.svdvals(tg.zeropower_via_newtonschulz5(G, 5, dtype=torch.float32,
                                                                  coeffs=tg.POLAR_EXPRESS_COEFFS))
    s_quintic = torch.linalg.svdvals(tg.zeropower_via_newtonschulz5(G, 5, dtype=torch.float32))
    assert s_polar.min() > 0.85 and s_polar.max() < 1.15  # the fixed quintic: about [0.68, 1.2]
    assert s_polar.max() - s_polar.min() < s_quintic.max() - s_quintic.min(), "tighter than the fixed quintic"


def test_muon_row_norm_equalizes_rows_before_orthogonalizing():
    seen = []
    p = torch.nn.Parameter(torch.randn(8, 16))
    muon = tg.Muon([p], lr=0.0, momentum=0.0, backend_steps=5, update_dtype=torch.float32,
                   row_norm=True)
    muon.orthogonalize = lambda g, **kw: seen.append(g.clone()) or g
    p.grad = torch.randn(8, 16) * torch.arange(1, 9)[:, None]
    muon.step()
    torch.testing.assert_close(seen[0].norm(dim=1), torch.ones(8))


def test_warmdown_fraction_endpoints_and_floor():
    """The field's schedule: max(ramp, floor), the ramp falling from 1 to 0 over the last WARMDOWN_FRAC."""
    hp = tg.Hyperparameters(iterations=100, warmdown_frac=0.4, min_lr_scale=0.1, max_wallclock_seconds=0)
    lr = [tg.lr_schedule(step, 0.0, hp) for step in range(101)]
    assert lr[0] == pytest.approx(1.0) and lr[60] == pytest.approx(1.0), "flat until the last 40%"
    assert lr[61] < 1.0 and lr[80] == pytest.approx(0.5), "then the plain ramp (1 - f) / 0.4, not rescaled"
    assert lr[96] == pytest.approx(0.1) and lr[95] == pytest.approx(0.125), "the knee: the ramp meets the floor at 96"
    assert lr[97:] == [pytest.approx(0.1)] * 4, "flat at the floor to the end"
    assert all(a >= b for a, b in zip(lr, lr[1:]))
    hp = tg.Hyperparameters(iterations=10**6, warmdown_frac=0.4, min_lr_scale=0.0, max_wallclock_seconds=100)
    assert tg.lr_schedule(10, 80_000.0, hp) == pytest.approx(0.5), "by wallclock: 20 s of a 40 s warmdown left"
    assert tg.lr_schedule(10, 100_000.0, hp) == 0.0


def test_new_settings_are_validated():
    for bad, word in [(dict(rope_dims=3), "ROPE_DIMS"), (dict(loop_repeats=1, loop_start=2, loop_end=1), "LOOP_START"),
                      (dict(loop_repeats=1, loop_end=2, parallel_from=2), "PARALLEL_FROM"),
                      (dict(bigram_buckets=1), "BIGRAM_BUCKETS"), (dict(warmdown_frac=1.5), "WARMDOWN_FRAC"),
                      (dict(muon_wd=-0.1), "MUON_WD"), (dict(xsa_last_n=6), "XSA_LAST_N")]:
        with pytest.raises(tg.ConfigError, match=word):
            all_on_hp(**{**dict(loop_repeats=0, parallel_from=0), **bad}).validate()
    all_on_hp().validate()


def test_flops_count_looped_blocks_each_time():
    model = tg.GPT(all_on_hp())
    hp = all_on_hp()
    plain = tg.count_flops_per_token(model, hp)
    model.looping = True
    block = sum(p.numel() for p in model.blocks[1].parameters()) + sum(p.numel() for p in model.blocks[2].parameters())
    # blocks 1 and 2 run twice more each: their weights and their attention
    assert tg.count_flops_per_token(model, hp) - plain == 2 * 6 * block + 4 * 12 * hp.model_dim * hp.train_seq_len


def test_loop_start_frac_one_never_loops_and_zero_loops_from_the_start():
    hp = all_on_hp(loop_start_frac=1.0, iterations=100, max_wallclock_seconds=0)
    assert not tg.looping_at(tg.training_progress(100, 0.0, hp), hp), "no looping after the last step"
    hp.loop_start_frac = 0.0
    assert tg.looping_at(0.0, hp)


def test_the_loop_phase_travels_with_the_weights(tmp_path):
    hp = all_on_hp(model_dim=192, bigram_dim=16)
    model = random_model(hp)
    tg.set_phase(model, looping=True)
    tg.save_artifact(model.state_dict(), tmp_path / "m.ptz", hp)
    reloaded = tg.GPT(hp)
    assert not reloaded.looping
    reloaded.load_state_dict(tg.load_artifact(tmp_path / "m.ptz"), strict=True)
    assert reloaded.looping and reloaded.layer_order() == model.layer_order(), "scored as trained (deep_eval too)"
    assert "loop_on" not in tg.GPT(tiny_hp()).state_dict(), "without loops the state dict is as before"

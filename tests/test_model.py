"""The model: GPT, attention, MLP, blocks, lanes, loops, gates and embeddings, each checked against
the property or the equations that define it."""

import importlib.util
import sys

import pytest
import torch
import torch.nn.functional as F

import train_gpt as tg
from bench.flops import count_flops_per_token
from conftest import ROOT, TRAINING_LEVERS, all_on_hp, randomize, random_model, tiny_hp

# The script of the CPU-track record made before the field's techniques existed: with every newer
# setting at its default, today's model and optimizer must compute exactly what it computed.
REFERENCE_RECORD = ROOT / "records" / "track_cpu" / "2026-11-22_Int6Qat7LayersSliding"
REFERENCE_SCRIPT = REFERENCE_RECORD / "train_gpt.py"


def bump(idx: torch.Tensor, t: int) -> torch.Tensor:
    """idx with the token at position t changed."""
    changed = idx.clone()
    changed[:, t] = (idx[:, t] + 1) % 64
    return changed


# ---- GPT ----


def test_model_shapes_and_causality():
    torch.manual_seed(0)
    hp = tiny_hp(num_layers=3)
    model = tg.GPT(hp)
    randomize(model)
    idx = torch.randint(0, hp.vocab_size, (2, hp.train_seq_len))
    logits = model.logits(idx)
    assert logits.shape == (2, hp.train_seq_len, hp.vocab_size)
    assert logits.dtype == torch.float32
    assert logits.abs().max() <= hp.logit_softcap
    loss = model(idx, idx)
    assert loss.ndim == 0 and torch.isfinite(loss)
    t = 9
    logits2 = model.logits(bump(idx, t))
    torch.testing.assert_close(logits2[:, :t], logits[:, :t], rtol=0, atol=1e-6)
    later = (logits2[:, t + 1:] - logits[:, t + 1:]).abs().max()
    assert later > 1e-4, "later positions must see the change"


def load_reference():
    spec = importlib.util.spec_from_file_location("reference_train_gpt", REFERENCE_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_defaults_compute_what_the_reference_script_computes():
    ref = load_reference()
    values = dict(
        vocab_size=64,
        num_layers=3,
        model_dim=32,
        num_heads=4,
        num_kv_heads=2,
        train_seq_len=16,
    )
    torch.manual_seed(0)
    ref_model = ref.GPT(ref.Hyperparameters(**values))
    model = tg.GPT(tg.Hyperparameters(**values))
    # make every parameter matter (the zero-initialized projections too)
    with torch.no_grad():
        for p in ref_model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.load_state_dict(ref_model.state_dict(), strict=True)
    idx = torch.randint(0, 64, (2, 16))
    targets = torch.randint(0, 64, (2, 16))
    assert torch.equal(model.logits(idx), ref_model.logits(idx))
    cpu = torch.device("cpu")
    ref_layout = ref.Layout(0, 1, 0, False, cpu, 1, False, False)
    ref_hp = ref.Hyperparameters(**values)
    ref_optimizers, _ = ref.build_optimizers(ref_model, ref_hp, ref_layout)
    hp = tg.Hyperparameters(**values)
    optimizers = tg.build_optimizers(model, hp, tg.Layout())
    for m, opts in ((ref_model, ref_optimizers), (model, optimizers)):
        for step in range(2):
            m(idx, targets).backward()
            for opt in opts:
                opt.step()
                opt.zero_grad(set_to_none=True)
    pairs = zip(model.named_parameters(), ref_model.parameters())
    for (name, p), q in pairs:
        assert torch.equal(p, q), f"{name} differs from the reference after two optimizer steps"


@pytest.mark.parametrize("looping", [False, True])
def test_causal_with_every_technique_on(looping):
    model = random_model(all_on_hp())
    model.set_looping(looping)
    idx = torch.randint(2, 64, (2, 16))
    changed = bump(idx, 9)
    with torch.no_grad():
        a = model.logits(idx)
        b = model.logits(changed)
    assert torch.equal(a[:, :9], b[:, :9]), "an earlier position saw a later token"
    assert not torch.allclose(a[:, 9:], b[:, 9:])


def test_orthogonal_init_gives_orthogonal_q_k_v_and_mlp_input():
    model = tg.GPT(tiny_hp(num_layers=2, ortho_init=True, mlp_mult=2))
    for block in model.blocks:
        attn = block.attn
        for linear in (attn.c_q, attn.c_k, attn.c_v, block.mlp.fc):
            w = linear.weight.detach()
            gram = w @ w.T if w.size(0) <= w.size(1) else w.T @ w
            eye = torch.eye(len(gram))
            torch.testing.assert_close(gram, eye, atol=1e-5, rtol=0)
        zero = not attn.proj.weight.any() and not block.mlp.proj.weight.any()
        assert zero, "output projections stay zero"
    plain = tg.GPT(tiny_hp(num_layers=2))
    w = plain.blocks[0].attn.c_q.weight.detach()
    eye = torch.eye(len(w))
    assert not torch.allclose(w @ w.T, eye, atol=0.1), "the default init is not orthogonal"


# ---- attention ----


def test_gqa_equals_full_heads_with_repeated_kv():
    torch.manual_seed(0)
    dim = 32
    heads = 4
    kv_heads = 2
    gqa_hp = tg.Hyperparameters(model_dim=dim, num_heads=heads, num_kv_heads=kv_heads)
    gqa = tg.CausalSelfAttention(gqa_hp, layer=0)
    randomize(gqa)
    full_hp = tg.Hyperparameters(model_dim=dim, num_heads=heads, num_kv_heads=heads)
    full = tg.CausalSelfAttention(full_hp, layer=0)
    head_dim = dim // heads
    group = heads // kv_heads
    with torch.no_grad():
        full.c_q.weight.copy_(gqa.c_q.weight)
        full.proj.weight.copy_(gqa.proj.weight)
        full.q_gain.copy_(gqa.q_gain)
        # each KV head's rows, repeated for every query head of its group
        for name in ("c_k", "c_v"):
            w = getattr(gqa, name).weight.view(kv_heads, head_dim, dim)
            repeated = w.repeat_interleave(group, dim=0).reshape(dim, dim)
            getattr(full, name).weight.copy_(repeated)
    x = torch.randn(2, 12, dim)
    torch.testing.assert_close(gqa(x, {}), full(x, {}), rtol=1e-5, atol=1e-5)


def test_rope_dims_equal_to_head_dim_is_full_rope_and_partial_rope_leaves_the_rest():
    full = random_model(tiny_hp())
    explicit = random_model(tiny_hp(rope_dims=8))  # head dim 32/4 = 8
    idx = torch.randint(0, 64, (2, 16))
    assert torch.equal(full.logits(idx), explicit.logits(idx))
    cos, sin = tg.rotary_cos_sin(16, 4, 10_000.0)
    x = torch.randn(2, 4, 16, 8)
    y = tg.apply_rotary(x, cos, sin)
    assert torch.equal(y[..., 4:], x[..., 4:]), "channels past ROPE_DIMS are not rotated"
    assert not torch.allclose(y[..., :4], x[..., :4])
    # a rotation: the rotated pairs keep their norm, and position 0 is not moved at all
    norms = y[..., :4].norm(dim=-1)
    torch.testing.assert_close(norms, x[..., :4].norm(dim=-1))
    torch.testing.assert_close(y[:, :, 0], x[:, :, 0])


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
def test_xsa_output_is_orthogonal_to_the_tokens_own_value(num_kv_heads):
    torch.manual_seed(0)
    hp = tg.Hyperparameters(
        model_dim=32,
        num_heads=4,
        num_kv_heads=num_kv_heads,
        xsa_last_n=1,
        train_seq_len=16,
    )
    attn = tg.CausalSelfAttention(hp, layer=8)
    attn.proj = torch.nn.Identity()  # expose the heads' outputs
    x = torch.randn(2, 16, 32)
    y = attn(x, {}).view(2, 16, 4, 8)  # (B, T, H, hd)
    v = attn.c_v(x).view(2, 16, num_kv_heads, 8)
    v = v.repeat_interleave(4 // num_kv_heads, dim=2)  # (B, T, H, hd)
    v_hat = F.normalize(v, dim=-1)
    assert (y * v_hat).sum(-1).abs().max() < 1e-5
    # the same heads without XSA are not orthogonal: the test can tell
    attn.xsa = False
    y = attn(x, {}).view(2, 16, 4, 8)
    assert (y * v_hat).sum(-1).abs().max() > 0.1


def test_the_attention_gate_scales_each_head_by_its_gate_on_the_first_12_channels():
    torch.manual_seed(0)
    values = dict(model_dim=32, num_heads=4, num_kv_heads=2, xsa_last_n=1, train_seq_len=16)
    gated_hp = tg.Hyperparameters(**values, sparse_attn_gate_enabled=True)
    attn = tg.CausalSelfAttention(gated_hp, layer=8)
    with torch.no_grad():
        for p in attn.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    x = torch.randn(2, 16, 32)
    plain = tg.CausalSelfAttention(tg.Hyperparameters(**values), 8)
    state = {k: v for k, v in attn.state_dict().items() if k != "attn_gate"}
    plain.load_state_dict(state)
    with torch.no_grad():
        plain.proj.weight.copy_(torch.eye(32))  # expose the head outputs
        heads = plain(x, {}).view(2, 16, 4, 8)
        gate = torch.sigmoid(0.5 * x[..., :12] @ attn.attn_gate.T)  # (B, T, H)
        gated = heads * gate[..., None]
        expected = attn.proj(gated.reshape(2, 16, 32))
        torch.testing.assert_close(attn(x, {}), expected, atol=1e-5, rtol=1e-5)


# ---- MLP ----


def test_leaky_slope_zero_is_relu_squared_and_a_slope_passes_negatives():
    x = torch.randn(4, 32)
    mlp = tg.MLP(32, 2, leaky_slope=0.0)
    with torch.no_grad():
        mlp.proj.weight.normal_()
        assert torch.equal(mlp(x), mlp.proj(F.relu(mlp.fc(x)).square()))
        leaky = tg.MLP(32, 2, leaky_slope=0.5)
        leaky.load_state_dict(mlp.state_dict())
        h = mlp.fc(x)
        expected = mlp.proj(torch.where(h > 0, h, 0.5 * h).square())
        assert torch.equal(leaky(x), expected)


# ---- embeddings and gates ----


def test_smear_gate_and_bigram_do_not_cross_a_bos():
    model = random_model(all_on_hp())
    assert model.smear_gate.abs().min() > 0
    assert model.bigram.weight.abs().min() > 0
    idx = torch.randint(2, 64, (2, 16))
    changed = idx.clone()
    changed[:, 7] = (idx[:, 7] + 1) % 62 + 2
    with torch.no_grad():
        mixed = model.embed(idx)[:, 8]
        assert not torch.allclose(mixed, model.embed(changed)[:, 8]), "within a document it mixes"
        # now a document ends at 7 and the next starts at 8
        idx[:, 8] = tg.BOS_ID
        changed[:, 8] = tg.BOS_ID
        after = model.embed(idx)[:, 8:]
        assert torch.equal(after, model.embed(changed)[:, 8:]), "it crossed the BOS"


def test_bigram_hash_rows():
    idx = torch.tensor([[5, 9, tg.BOS_ID, 9, 5]])
    rows = tg.bigram_hash(idx, 97)
    reserved = rows[0, 0] == 96 and rows[0, 2] == 96
    assert reserved, "no previous token, and BOS, use the reserved last row"
    assert rows[0, 1] == (36313 * 9 ^ 27191 * 5) % 96
    assert rows[0, 3] == (36313 * 9 ^ 27191 * tg.BOS_ID) % 96
    assert rows.max() < 97 and rows.min() >= 0


def test_zero_initialized_gates_leave_the_logits_bitwise_as_without_them():
    """At step 0 the sparse attention gate (its head outputs meet a zero projection) and SmearGate
    (lambda 0) change nothing; the skip gates blend x and the skip half and half (the field's lerp
    at g = 0)."""
    idx = torch.randint(0, 64, (2, 16))
    for gate in ("sparse_attn_gate_enabled", "smear_gate_enabled"):
        torch.manual_seed(0)
        off = tg.GPT(tiny_hp(num_layers=4))
        torch.manual_seed(0)
        on = tg.GPT(tiny_hp(num_layers=4, **{gate: True}))
        on.load_state_dict(off.state_dict(), strict=False)
        assert torch.equal(on.logits(idx), off.logits(idx)), gate
    model = tg.GPT(tiny_hp(num_layers=4, skip_gates_enabled=True))
    x = torch.randn(2, 16, 32)
    skip = torch.randn(2, 16, 32)
    torch.testing.assert_close(model.add_skip(x, 0, skip), 0.5 * x + 0.5 * skip)


# ---- blocks and lanes ----


def test_a_two_lane_block_mixes_each_lane_with_both_outputs():
    """Lanes (the field's parallel residuals): attention reads lane 0 mixed with x0, the MLP reads
    lane 1, and lane i becomes lane_mix[i, 0] lane_i + lane_mix[i, 1] attn + lane_mix[i, 2] mlp."""
    hp = tiny_hp(num_layers=3, parallel_start_layer=1)
    block = tg.Block(hp, layer=2)
    assert block.lane_mix.shape == (2, 3)
    randomize(block)
    torch.manual_seed(1)
    a = torch.randn(2, 16, 32)
    b = torch.randn(2, 16, 32)
    x0 = torch.randn(2, 16, 32)
    with torch.no_grad():
        out = block([a, b], x0, {})  # no TTT adapters
        mix = block.resid_mix
        x = mix[0] * a + mix[1] * x0
        attn = block.attn_scale * block.attn(F.rms_norm(x, (32,)), {})
        mlp = block.mlp_scale * block.mlp(F.rms_norm(b, (32,)))
        w = block.lane_mix
        lane0 = w[0, 0] * a + w[0, 1] * attn + w[0, 2] * mlp
        lane1 = w[1, 0] * b + w[1, 1] * attn + w[1, 2] * mlp
    assert len(out) == 2
    torch.testing.assert_close(out[0], lane0, rtol=0, atol=1e-6)
    torch.testing.assert_close(out[1], lane1, rtol=0, atol=1e-6)
    assert not torch.allclose(out[0], out[1]), "the lanes differ: the test can tell them apart"


def field_logits(model: tg.GPT, idx: torch.Tensor) -> torch.Tensor:
    """The field's best entry's forward, written out from its equations, on our modules' weights:
    U-Net skips x <- g x + (1 - g) w skip with g = sigmoid(gate), LIFO; from PARALLEL_START_LAYER
    two lanes, the skip into lane 0 only; attention reads resid_mix(lane 0, x0), the MLP lane 1 as
    it is; lane_i <- r_i lane_i + p_i,a a + p_i,m m; the output the lanes' mean."""
    x = model.embed(idx)
    x0 = x
    order = model.layer_order()
    lanes = None
    skips = []
    encoder = len(order) // 2
    for i, layer in enumerate(order):
        block = model.blocks[layer]
        if layer == model.parallel_start_layer and lanes is None:
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
            attn_in = block.norm(mix[0] * lanes[0] + mix[1] * x0)
            a = block.attn_scale * block.attn(attn_in, {})
            m = block.mlp_scale * block.mlp(block.norm(lanes[1]))
            w = block.lane_mix
            lanes = [w[j, 0] * lanes[j] + w[j, 1] * a + w[j, 2] * m for j in (0, 1)]
        else:
            x = mix[0] * x + mix[1] * x0
            x = x + block.attn_scale * block.attn(block.norm(x), {})
            x = x + block.mlp_scale * block.mlp(block.norm(x))
        if i < encoder:
            skips.append(x if lanes is None else (lanes[0] + lanes[1]) / 2)
    h = model.final_norm(x if lanes is None else (lanes[0] + lanes[1]) / 2)
    cap = model.logit_softcap
    return cap * torch.tanh((h @ model.tok_emb.weight.T) / cap)


@pytest.mark.parametrize("looping", [False, True])
def test_lanes_and_skip_gates_match_the_fields_equations(looping):
    model = random_model(all_on_hp())
    model.set_looping(looping)
    idx = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        expected = field_logits(model, idx)
        torch.testing.assert_close(model.logits(idx), expected, atol=2e-5, rtol=2e-5)


def test_lanes_start_as_the_field_initializes_them():
    block = tg.GPT(all_on_hp()).blocks[3]
    init = torch.tensor([[1.1, 1.0, 1.0]] * 2)
    assert torch.equal(block.lane_mix, init), "residual 1.1, attention and MLP 1"


# ---- loops (depth recurrence) ----


def test_looped_forward_equals_the_explicitly_unrolled_model():
    hp = all_on_hp()
    model = random_model(hp)
    model.set_looping(True)
    order = [0, 1, 2, 1, 2, 1, 2, 3, 4]  # LOOP_START=1 LOOP_END=2 NUM_LOOPS=2 over 5 layers
    assert model.layer_order() == order
    unrolled_hp = tiny_hp(**{**TRAINING_LEVERS, "num_layers": len(order), "num_loops": 0})
    unrolled = tg.GPT(unrolled_hp)
    shared = {k: v for k, v in model.state_dict().items() if not k.startswith("blocks.")}
    unrolled.load_state_dict(shared, strict=False)
    # shared weights, as looped
    unrolled.blocks = torch.nn.ModuleList(model.blocks[i] for i in order)
    unrolled.parallel_start_layer = order.index(hp.parallel_start_layer)
    idx = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        assert torch.equal(model.logits(idx), unrolled.logits(idx))
        model.set_looping(False)
        assert not torch.allclose(model.logits(idx), unrolled.logits(idx))


def test_loop_phase_switches_at_the_configured_fraction():
    hp = all_on_hp(iterations=20, enable_looping_at=0.5, max_wallclock_seconds=0)
    phases = []
    for step in range(21):
        progress = tg.training_progress(step, 0.0, hp)
        phases.append(tg.looping_at(progress, hp))
    assert phases.index(True) == 10 and all(phases[10:])
    # under a wallclock cap, whichever of steps and time is further
    hp.max_wallclock_seconds = 100.0
    assert tg.looping_at(tg.training_progress(2, 50_000.0, hp), hp)


def test_loop_start_frac_one_never_loops_and_zero_loops_from_the_start():
    hp = all_on_hp(enable_looping_at=1.0, iterations=100, max_wallclock_seconds=0)
    last = tg.training_progress(100, 0.0, hp)
    assert not tg.looping_at(last, hp), "no looping after the last step"
    hp.enable_looping_at = 0.0
    assert tg.looping_at(0.0, hp)


def test_the_loop_phase_travels_with_the_weights(tmp_path):
    """The artifact says which phase it was trained in; loading weights changes no phase by itself, so a reader
    (deep_eval, the benches) sets it from them, and one that does not runs its own phase."""
    hp = all_on_hp(model_dim=192, bigram_dim=16)
    model = random_model(hp)
    model.set_looping(True)
    tg.save_artifact(model.state_dict(), tmp_path / "m.ptz", hp)
    reloaded = tg.GPT(hp)
    state = tg.load_artifact(tmp_path / "m.ptz")
    reloaded.load_state_dict(state, strict=True)
    assert not reloaded.looping, "set_looping alone changes the phase"
    reloaded.set_looping(bool(state["loop_on"]))
    assert reloaded.looping and reloaded.layer_order() == model.layer_order(), "scored as trained"
    sys.path.insert(0, str(ROOT / "bench"))
    import run_files
    run = tg.Run(hp, tg.Layout(), None, b"")
    run_files.load_model(run, state)
    assert run.model.looping, "the benches read the phase from the weights"
    plain = tg.GPT(tiny_hp()).state_dict()
    assert "loop_on" not in plain, "without loops the state dict is as before"


def test_flops_count_looped_blocks_each_time():
    hp = all_on_hp()
    model = tg.GPT(hp)
    plain = count_flops_per_token(model, hp)
    model.set_looping(True)
    looped = [model.blocks[1], model.blocks[2]]
    block = sum(p.numel() for b in looped for p in b.parameters())
    # blocks 1 and 2 run twice more each: their weights and their attention
    attention = 4 * 12 * hp.model_dim * hp.train_seq_len
    assert count_flops_per_token(model, hp) - plain == 2 * 6 * block + attention

"""awq-lite (stack/awq-lite.diff), on the built frontier: AWQ-lite's groups of input columns, chosen by salience
over every GPTQ matrix, stored at AWQ_LITE_BITS in the same solve; LQER's B in groups of LQER_ASYM_GROUP; the
field's names refused where they would compute something else. bench/awq_conformance.py checks the same against
the field's own code."""

import io
from types import SimpleNamespace

import pytest
import torch

import train_gpt as core
from conftest import random_model
from stack.conftest import frontier_hp

# #2014's export: int6 matrices, int7 embedding, clips in row stds
EXPORT = dict(gptq=True, matrix_bits=6, embed_bits=7, matrix_clip_sigmas=12.85, embed_clip_sigmas=20.0,
              mlp_clip_sigmas=10.0, attn_clip_sigmas=13.0)
AWQ = dict(EXPORT, awq_lite_enabled=True)
SHAPES = {"tok_emb.weight": (96, 128), "blocks.0.attn.c_q.weight": (128, 128), "blocks.0.mlp.fc.weight": (256, 128)}


def weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {name: 0.02 * torch.randn(shape, generator=g) for name, shape in SHAPES.items()}


def quiet_rms(state):
    """Every matrix's input RMS 1, except channels 70 of the MLP and 5 of the query (louder)."""
    rms = {name: torch.ones(w.size(1)) for name, w in state.items()}
    rms["blocks.0.mlp.fc.weight"][70] = 30.0
    rms["blocks.0.attn.c_q.weight"][5] = 10.0
    return rms


def identity_hessians(state):  # H = I: GPTQ is round-to-nearest, column by column
    return {name: torch.eye(w.size(1), dtype=torch.float64) for name, w in state.items()}


def artifact_bytes(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def test_the_groups_are_those_of_largest_salience_over_every_matrix_below_the_bits(fr):
    state = weights()
    rms = quiet_rms(state)
    hp = frontier_hp(fr, **AWQ, awq_lite_group_top_k=2, awq_lite_group_size=32)
    # the loud MLP channel's group first, then the query's; the order of the state dict, then of the columns
    assert fr.awq_lite_groups(state, rms, hp) == {"blocks.0.mlp.fc.weight": [(64, 96)],
                                                  "blocks.0.attn.c_q.weight": [(0, 32)]}
    # each group's salience, summed in float64 over |w| means times RMS: the chosen are the top 5
    scores = sorted(((float((rms[n].double() * w.double().abs().mean(0))[a:a + 32].sum()), n, a)
                     for n, w in state.items() for a in range(0, 128, 32)), reverse=True)
    top = frontier_hp(fr, **AWQ, awq_lite_group_top_k=5, awq_lite_group_size=32)
    chosen = {(n, a) for n, groups in fr.awq_lite_groups(state, rms, top).items() for a, _ in groups}
    assert chosen == {(n, a) for _, n, a in scores[:5]}
    # a matrix at AWQ_LITE_BITS or above is no candidate: the embedding at 8 bits, its input loudest
    rms["tok_emb.weight"][:] = 100.0
    assert "tok_emb.weight" in fr.awq_lite_groups(state, rms, hp)
    eight = frontier_hp(fr, **{**AWQ, "embed_bits": 8}, awq_lite_group_top_k=2, awq_lite_group_size=32)
    assert "tok_emb.weight" not in fr.awq_lite_groups(state, rms, eight)
    # a matrix with no RMS (not GPTQ's) is none either; a group never runs past the columns
    assert fr.awq_lite_groups(state, {}, hp) == {}
    wide = frontier_hp(fr, **AWQ, awq_lite_group_size=96)
    assert fr.awq_lite_groups(state, rms, wide) == {"tok_emb.weight": [(0, 96)]}


def test_a_group_is_stored_at_the_finer_bits_and_reads_back_within_half_its_step(fr):
    state = weights()
    hp = frontier_hp(fr, **AWQ)
    obj = fr.quantize_state_dict(state, hp, identity_hessians(state), quiet_rms(state))
    name = "blocks.0.mlp.fc.weight"
    assert obj["floats"][name + ".awq_groups"].tolist() == [[64, 128]]
    assert not any(key.endswith(".awq_groups") for key in obj["floats"] if not key.startswith(name))
    q = obj["ints"][name].int()
    fine = obj["scales"][name + ".awq"].float()[:, None]
    coarse = obj["scales"][name].float()[:, None]
    # the field's steps: the clip (MLP_CLIP_SIGMAS row stds) over 127 in the group, over 31 elsewhere
    w = state[name]
    assert torch.equal(fine.squeeze(1).half(), (10.0 * w.std(dim=1) / 127).half())
    assert torch.equal(coarse.squeeze(1).half(), (10.0 * w.std(dim=1) / 31).half())
    assert q[:, 64:].abs().max() <= 127 and q[:, 64:].abs().max() > 31 and q[:, :64].abs().max() <= 31
    restored = fr.dequantize_state_dict(obj)[name]
    # H = I: each column rounded alone, so every weight within the clip reads back within half its step
    error = (restored - w).abs()
    assert (error[:, 64:] <= fine / 2 + 1e-7).all() and (error[:, :64] <= coarse / 2 + 1e-7).all()
    plain = fr.dequantize_state_dict(fr.quantize_state_dict(state, frontier_hp(fr, **EXPORT),
                                                            identity_hessians(state)))[name]
    assert (restored - w)[:, 64:].norm() < (plain - w)[:, 64:].norm() / 3, "int8 against int6: ~4x finer"
    assert torch.equal(restored[:, :64], plain[:, :64]), "H = I: the other columns do not move"


def test_the_group_shares_the_gptq_solve(fr):
    """With a full H the group's rounding errors reach later columns as any column's do: the solve with a group
    equals the plain solve where the group's columns come last in act order and are the same where they come first."""
    g = torch.Generator().manual_seed(1)
    w = 0.02 * torch.randn(64, 128, generator=g)
    x = torch.randn(512, 128, generator=g)
    # act order (diag H descending) is the columns' own order
    H = (x.T @ x + torch.diag(100.0 * torch.arange(128, 0, -1))).double()
    q, scale, fine_scale = fr.gptq_quantize(w, H, 6, sigmas=10.0, fine=[(96, 128)], fine_bits=8)
    plain_q, plain_scale, unused = fr.gptq_quantize(w, H, 6, sigmas=10.0)
    assert torch.equal(scale, plain_scale) and torch.equal(q[:, :96], plain_q[:, :96])
    assert torch.equal(fine_scale, fr.quantize_rows(w, 8, 10.0)[1]) and torch.equal(unused, scale)
    assert not torch.equal(q[:, 96:], plain_q[:, 96:])
    first_q = fr.gptq_quantize(w, H, 6, sigmas=10.0, fine=[(0, 32)], fine_bits=8)[0]
    assert not torch.equal(first_q[:, 32:], plain_q[:, 32:]), "the finer group's errors feed the later columns"


def test_lqer_fits_the_error_left_with_the_groups_finer_steps(fr):
    state = weights()
    awq_lqer = frontier_hp(fr, **AWQ, lqer_enabled=True, lqer_rank=4, lqer_top_k=3)
    obj = fr.quantize_state_dict(state, awq_lqer, identity_hessians(state), quiet_rms(state))
    name = "blocks.0.mlp.fc.weight"
    assert name + ".lqer_a" in obj["ints"]
    base = fr.int_weights(obj["ints"], obj["scales"], obj["floats"])[name]
    correction = fr.dequantize_state_dict(obj)[name] - base
    error = state[name] - base
    # an error taken at the coarse step in the group (columns 64:128) would be ~3x the weights there, and the
    # correction would follow it; fit to the true error it stays that error's size
    assert correction[:, 64:].norm() < 2 * error[:, 64:].norm()
    assert correction.norm() < 2 * error.norm()


def test_lqer_groups_b_in_lqer_asym_group_entries(fr):
    g = torch.Generator().manual_seed(2)
    A = torch.randn(96, 4, generator=g)
    B = torch.randn(4, 128, generator=g) / 10
    for group in (16, 32, 64, 128):
        packed = fr.lqer_pack(A, B, group)
        qB, steps = packed[".lqer_b"]
        assert qB.shape == (4 * 128 // group, group) and torch.equal(qB.flatten(), qB.view(-1))
        groups = B.flatten().view(-1, group)
        assert torch.equal(steps.half(), (groups.abs().amax(dim=1) / 7.5).half())
        assert qB.min() >= -8 and qB.max() <= 7
        qA, step_a = packed[".lqer_a"]
        assert qA.shape == (1, 96 * 4) and torch.equal(step_a.half(), (A.abs().max() / 1.5).half().view(1))
        assert qA.min() >= -2 and qA.max() <= 1
    # a B whose entries do not fill the last group: zero-padded, as the core does with 64
    ragged = fr.lqer_pack(A, B[:, :100], 64)[".lqer_b"][0]
    assert ragged.shape == (7, 64) and (ragged.flatten()[400:] == 0).all()
    # #2135's 32 on a whole export: twice the steps of 64, and the round trip lowers the error as 64's does
    state = weights()
    for group in (32, 64):
        hp = frontier_hp(fr, **EXPORT, lqer_enabled=True, lqer_rank=4, lqer_top_k=1, lqer_asym_group=group)
        obj = fr.quantize_state_dict(state, hp, identity_hessians(state))
        name = next(key.removesuffix(".lqer_b") for key in obj["scales"] if key.endswith(".lqer_b"))
        assert obj["scales"][name + ".lqer_b"].numel() == 4 * state[name].size(1) // group


def test_off_the_artifact_is_the_cores_byte_for_byte(fr):
    state = weights()
    hessians = identity_hessians(state)
    settings = dict(EXPORT, lqer_enabled=True, lqer_rank=4, lqer_top_k=2)
    ours = fr.quantize_state_dict(state, frontier_hp(fr, **settings), hessians, quiet_rms(state))
    theirs = core.quantize_state_dict(state, frontier_hp(core, **settings), hessians)
    assert artifact_bytes(ours) == artifact_bytes(theirs)


def test_calibration_gives_each_inputs_rms_over_every_pass_of_a_looped_layer(fr):
    hp = frontier_hp(fr, model_dim=128, num_layers=3, num_loops=1, loop_start=1, loop_end=1, gptq_calib_seqs=4)
    model = random_model(hp, fr)
    model.set_looping(True)
    seen = []
    fc = model.blocks[1].mlp.fc
    fc.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0].flatten(0, -2)))
    tokens = torch.randint(0, hp.vocab_size, (4 * hp.train_seq_len,), generator=torch.Generator().manual_seed(3))
    loader = SimpleNamespace(take=lambda n: tokens[:n])
    run = SimpleNamespace(hp=hp, layout=fr.Layout(), model=model, log=lambda line: None)
    hessians, act_rms = fr.calibrate(run, loader)
    assert set(act_rms) == set(hessians)
    rows = torch.cat(seen)
    assert len(rows) == 2 * len(tokens), "the looped layer runs twice"
    expected = rows.double().square().mean(dim=0).sqrt().float()
    torch.testing.assert_close(act_rms["blocks.1.mlp.fc.weight"], expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("settings, message", [
    (dict(AWQ_LITE_ENABLED="1"), r"AWQ_LITE_ENABLED=1 .*set GPTQ=1"),
    (dict(AWQ_LITE_ENABLED="1", GPTQ="1", AWQ_LITE_BITS="9"), r"AWQ_LITE_BITS=9: .*at most 8"),
    (dict(AWQ_LITE_ENABLED="1", GPTQ="1", MATRIX_BITS="6", EMBED_BITS="6", AWQ_LITE_BITS="6"),
     r"AWQ_LITE_BITS=6: use more than .*\(6\)"),
    (dict(AWQ_LITE_ENABLED="1", GPTQ="1", MATRIX_BITS="6", AWQ_LITE_GROUP_SIZE="0"), r"AWQ_LITE_GROUP_SIZE=0 must be positive"),
    (dict(AWQ_LITE_ENABLED="1", GPTQ="1", MATRIX_BITS="6", AWQ_LITE_GROUP_TOP_K="0"), r"AWQ_LITE_GROUP_TOP_K=0 must be positive"),
    (dict(LQER_ASYM_GROUP="0"), r"LQER_ASYM_GROUP=0 must be positive"),
    (dict(LQER_ASYM_ENABLED="0"), r"LQER_ASYM_ENABLED=0: .*set it to 1"),
    (dict(LQER_FACTOR_BITS="2"), r"LQER_FACTOR_BITS=2: .*set it to 4"),
])
def test_bad_values_are_refused_naming_the_variable_and_the_fix(fr, settings, message):
    with pytest.raises(fr.ConfigError, match=message):
        fr.Hyperparameters.from_env(dict(settings, MAX_WALLCLOCK_SECONDS="0"))


def test_the_fields_commands_run_as_written(fr):
    """#2014's export settings and #2135's LQER, in their names and values."""
    field = dict(GPTQ="1", MAX_WALLCLOCK_SECONDS="0", MATRIX_BITS="6", EMBED_BITS="7", LQER_ENABLED="1",
                 LQER_RANK="4", LQER_TOP_K="3", LQER_FACTOR_BITS="4", LQER_ASYM_ENABLED="1", AWQ_LITE_ENABLED="1",
                 AWQ_LITE_BITS="8", AWQ_LITE_GROUP_TOP_K="1", AWQ_LITE_GROUP_SIZE="64")
    for group in ("64", "32"):
        hp = fr.Hyperparameters.from_env(dict(field, LQER_ASYM_GROUP=group))
        assert hp.awq_lite_enabled and hp.lqer_asym_group == int(group)

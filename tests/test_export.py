"""The export: low-bit integer rows (the searched clip, sigma clips, GPTQ, LQER), the artifact
(save, the safe loader, compressors), GPTQ's calibration, and the packed code."""

import copy
import io
import re
import subprocess
import sys
import zlib

import pytest
import torch

import train_gpt as tg
from conftest import ROOT, randomize, tiny_hp
from tools.packing import PACKED_HEAD, pack_source


def rows_error(q: torch.Tensor, scale: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Each row's squared error of integers q at step sizes scale against w."""
    return (q * scale[:, None] - w).square().sum(dim=1)


# ---- integer rows: the searched clip ----


@pytest.mark.parametrize("bits", [4, 5, 6, 7, 8])
def test_integers_are_stored_one_byte_each_within_the_width(bits):
    torch.manual_seed(0)
    w = torch.randn(64, 300) * torch.rand(64, 1)
    w[3, 7] = 50.0  # an outlier row
    stored = tg.quantize_state_dict({"m.weight": w}, tg.Hyperparameters(matrix_bits=bits))
    ints = stored["ints"]["m.weight"]
    qmax = 2 ** (bits - 1) - 1
    assert ints.dtype == torch.int8 and ints.shape == w.shape
    assert ints.abs().max() == qmax, "the full range is used"
    restored = tg.dequantize_state_dict(stored)["m.weight"]
    scales = stored["scales"]["m.weight"].float()[:, None]
    assert torch.equal(restored, ints.float() * scales)


@pytest.mark.parametrize("bits", [4, 6, 8])
def test_clip_search_never_worse_than_no_clip(bits):
    torch.manual_seed(0)
    w = torch.randn(64, 256)
    w[:, :3] *= 12  # heavy outliers: clipping them should pay at low widths
    q, scale = tg.quantize_rows(w, bits)
    qmax = 2 ** (bits - 1) - 1
    no_clip_scale = (w.abs().amax(dim=1) / qmax).half().float()
    no_clip_q = torch.clamp(torch.round(w / no_clip_scale[:, None]), -qmax, qmax)
    err_search = rows_error(q, scale, w)
    err_none = rows_error(no_clip_q, no_clip_scale, w)
    assert (err_search <= err_none + 1e-6).all()
    if bits == 4:
        clipped = err_search.sum() < 0.9 * err_none.sum()
        assert clipped, "at 4 bits the search should clip the outliers"
    assert q.abs().max() <= qmax and torch.equal(q, q.round())


def test_zero_rows_quantize_without_nan():
    w = torch.zeros(4, 300)
    w[1] = 1e-9
    q, scale = tg.quantize_rows(w, 6)
    assert torch.isfinite(q * scale[:, None]).all()


# ---- sigma clips: each row clipped at k standard deviations ----


@pytest.mark.parametrize("bits, sigmas", [(6, 12.85), (5, 6.0), (4, 3.0)])
def test_sigma_clip_is_k_row_stds_and_rounds_within_half_a_step(bits, sigmas):
    torch.manual_seed(3)
    w = torch.randn(32, 500) * torch.rand(32, 1)
    # an outlier past the clip: clamped to the top integer, the row's step unchanged by it
    w[0, 0] = 40.0
    qmax = 2 ** (bits - 1) - 1
    q, scale = tg.quantize_rows(w, bits, sigmas)
    assert torch.equal(scale, (sigmas * w.std(dim=1) / qmax).half().float())
    assert q[0, 0] == qmax
    assert q.abs().max() <= qmax and torch.equal(q, q.round())
    inside = w.abs() <= qmax * scale[:, None]
    within = (q * scale[:, None] - w).abs() <= scale[:, None] / 2 + 1e-6
    assert within[inside].all()


def test_a_wider_sigma_clip_spends_fewer_bytes_for_more_error():
    torch.manual_seed(4)
    w = torch.randn(128, 512)
    sizes = []
    errors = []
    # 0: the clip search, at most the row's max (~3.3 stds here)
    for sigmas in (0.0, 4.0, 8.0, 12.85):
        hp = tg.Hyperparameters(matrix_bits=6, matrix_clip_sigmas=sigmas)
        stored = tg.quantize_state_dict({"m.weight": w}, hp)
        raw = stored["ints"]["m.weight"].numpy().tobytes()
        sizes.append(len(zlib.compress(raw, 9)))
        restored = tg.dequantize_state_dict(stored)["m.weight"]
        errors.append((restored - w).square().sum().item())
    assert all(a > b for a, b in zip(sizes, sizes[1:]))
    assert all(a < b for a, b in zip(errors, errors[1:]))


def test_the_artifact_clips_blocks_and_embedding_at_their_own_sigmas(tmp_path):
    torch.manual_seed(5)
    state = {
        "tok_emb.weight": torch.randn(64, 300),
        "blocks.0.mlp.fc.weight": torch.randn(64, 300),
    }
    hp = tg.Hyperparameters(matrix_bits=6, embed_bits=7, matrix_clip_sigmas=12.0,
                            embed_clip_sigmas=16.0)
    tg.save_artifact(state, tmp_path / "model.ptz", hp)
    loaded = tg.load_artifact(tmp_path / "model.ptz")
    kinds = (("tok_emb.weight", 7, 16.0), ("blocks.0.mlp.fc.weight", 6, 12.0))
    for name, bits, sigmas in kinds:
        q, scale = tg.quantize_rows(state[name], bits, sigmas)
        assert torch.equal(loaded[name], q * scale[:, None])


def test_each_kind_of_matrix_is_clipped_at_its_own_sigmas_and_gates_stay_int8():
    torch.manual_seed(1)
    state = {
        "tok_emb.weight": torch.randn(64, 300),
        "blocks.0.attn.c_q.weight": torch.randn(128, 256),
        "blocks.0.mlp.fc.weight": torch.randn(128, 256),
        "bigram_proj.weight": torch.randn(128, 256),
        "blocks.0.attn.attn_gate": torch.randn(4, 12),
    }
    hp = tg.Hyperparameters(
        matrix_bits=6,
        embed_bits=7,
        matrix_clip_sigmas=12.0,
        attn_clip_sigmas=13.0,
        mlp_clip_sigmas=11.5,
        embed_clip_sigmas=14.0,
    )
    stored = tg.quantize_state_dict(state, hp)
    kinds = (
        ("tok_emb.weight", 7, 14.0),
        ("blocks.0.attn.c_q.weight", 6, 13.0),
        ("blocks.0.mlp.fc.weight", 6, 11.5),
        ("bigram_proj.weight", 6, 12.0),
        ("blocks.0.attn.attn_gate", 8, 0.0),
    )
    for name, bits, sigmas in kinds:
        q, scale = tg.quantize_rows(state[name], bits, sigmas)
        assert torch.equal(stored["scales"][name], scale.half()), name
        assert torch.equal(stored["ints"][name], q.to(torch.int8)), name
    gate = "blocks.0.attn.attn_gate"
    assert gate in stored["ints"], "the gate is stored as int8 rows, not as a float"


# ---- GPTQ ----


@pytest.mark.parametrize("bits, sigmas", [(4, 0.0), (6, 0.0), (6, 12.85)])
def test_identity_hessian_is_round_to_nearest(bits, sigmas):
    torch.manual_seed(0)
    w = torch.randn(48, 200)
    q, scale = tg.gptq_quantize(w, torch.eye(200), bits, damp=0.01, sigmas=sigmas)
    expected_q, expected_scale = tg.quantize_rows(w, bits, sigmas)
    assert torch.equal(q, expected_q)
    assert torch.equal(scale, expected_scale)


@pytest.mark.parametrize("bits", [4, 5, 6])
def test_correlated_inputs_lose_less_than_round_to_nearest(bits):
    torch.manual_seed(1)
    w = torch.randn(64, 300)  # 300 columns: three blocks of 128, the last one partial
    # inputs on a low-rank subspace
    x = torch.randn(2048, 24) @ torch.randn(24, 300) + 0.1 * torch.randn(2048, 300)
    q, scale = tg.gptq_quantize(w, x.T @ x, bits, damp=0.01)
    rtn_q, rtn_scale = tg.quantize_rows(w, bits)
    same = torch.equal(scale, rtn_scale)
    assert same, "the clip search's scales: the artifact format does not change"
    assert q.abs().max() <= 2 ** (bits - 1) - 1 and torch.equal(q, q.round())
    gptq_error = (x @ (q * scale[:, None]).T - x @ w.T).norm()
    rtn_error = (x @ (rtn_q * rtn_scale[:, None]).T - x @ w.T).norm()
    assert gptq_error < 0.5 * rtn_error


def textbook_gptq(w, H, bits, damp, order):
    """GPTQ as Frantar et al. write it (Algorithm 1, unblocked), on the columns in the given
    order."""
    W = w.double()[:, order].clone()
    H = H.double()[order][:, order]
    H += damp * H.diagonal().mean() * torch.eye(len(H), dtype=H.dtype)
    H_inv = torch.cholesky_inverse(torch.linalg.cholesky(H))
    U = torch.linalg.cholesky(H_inv, upper=True)
    qmax = 2 ** (bits - 1) - 1
    scale = tg.quantize_rows(w, bits)[1].double()
    Q = torch.zeros_like(W)
    for j in range(W.size(1)):
        Q[:, j] = torch.clamp(torch.round(W[:, j] / scale), -qmax, qmax)
        err = (W[:, j] - Q[:, j] * scale) / U[j, j]
        W[:, j + 1:] -= err[:, None] * U[j, j + 1:][None]
    return Q[:, torch.argsort(order)].float()


def test_columns_go_in_descending_order_of_the_hessians_diagonal():
    """Act order: GPTQ quantizes the columns whose inputs are largest first. Unblocked, it equals
    the textbook algorithm on the columns sorted by diag(H), descending, exactly; in their natural
    order it would not."""
    torch.manual_seed(3)
    w = torch.randn(32, 96)
    x = torch.randn(400, 96) * torch.linspace(0.1, 3.0, 96)  # later columns larger
    H = x.T @ x
    q, _ = tg.gptq_quantize(w, H, 4, damp=0.01, block=96)
    act_order = torch.argsort(H.diagonal(), descending=True)
    assert torch.equal(q, textbook_gptq(w, H, 4, 0.01, act_order))
    assert not torch.equal(q, textbook_gptq(w, H, 4, 0.01, torch.arange(96)))
    blocked, _ = tg.gptq_quantize(w, H, 4, damp=0.01, block=32)
    changed = (blocked != q).float().mean()
    assert changed < 0.01, "blocks change only the rounding of float noise"


def test_dead_inputs_are_zeroed():
    """An input that never fires (zero row/column of H) cannot inform the rounding; its weights
    are 0."""
    torch.manual_seed(2)
    w = torch.randn(16, 64)
    x = torch.randn(500, 64)
    x[:, 5] = 0
    q, _ = tg.gptq_quantize(w, x.T @ x, 6, damp=0.01)
    assert (q[:, 5] == 0).all() and (q[:, :5] != 0).any()


# ---- LQER ----


def test_lqer_lowers_the_quantization_error_and_round_trips_through_the_safe_loader(tmp_path):
    torch.manual_seed(2)
    # B: 4 x 136, padded
    state = {f"blocks.{i}.mlp.fc.weight": torch.randn(128, 136) * (1 + i) for i in range(4)}
    plain_hp = tg.Hyperparameters(matrix_bits=5, matrix_clip_sigmas=12.0, compressor="brotli")
    lqer_hp = tg.Hyperparameters(
        matrix_bits=5,
        matrix_clip_sigmas=12.0,
        compressor="brotli",
        lqer_enabled=True,
        lqer_rank=4,
        lqer_top_k=2,
    )
    plain = tg.dequantize_state_dict(tg.quantize_state_dict(state, plain_hp))
    stored = tg.quantize_state_dict(state, lqer_hp)
    factors = [name for name in stored["ints"] if name.endswith(".lqer_a")]
    corrected_names = {name.removesuffix(".lqer_a") for name in factors}
    largest = {"blocks.2.mlp.fc.weight", "blocks.3.mlp.fc.weight"}
    assert corrected_names == largest, "the largest errors"
    corrected = tg.dequantize_state_dict(stored)
    assert corrected.keys() == state.keys(), "the factors are no weights of their own"
    for name, w in state.items():
        before = (plain[name] - w).norm()
        after = (corrected[name] - w).norm()
        if name in corrected_names:
            assert after < 0.97 * before, name
        else:
            assert torch.equal(corrected[name], plain[name]), name
    prefix = "blocks.3.mlp.fc.weight"
    a = stored["ints"][f"{prefix}.lqer_a"]
    b = stored["ints"][f"{prefix}.lqer_b"]
    assert a.shape == (1, 128 * 4) and b.shape == (9, 64), "A: one scale; B: groups of 64"
    assert -2 <= a.min() and a.max() <= 1, "int2 A"
    assert -8 <= b.min() and b.max() <= 7, "int4 B"
    assert len(a.unique()) >= 3 and len(b.unique()) >= 12, "their ranges used"
    # the correction is A B of the stored integers, as the field reads them back
    A = a.float() * stored["scales"][f"{prefix}.lqer_a"].float()
    B = b.float() * stored["scales"][f"{prefix}.lqer_b"].float()[:, None]
    correction = A.view(128, 4) @ B.flatten()[:4 * 136].view(4, 136)
    torch.testing.assert_close(corrected[prefix] - plain[prefix], correction)
    tg.save_artifact(state, tmp_path / "m.ptz", lqer_hp)
    loaded = tg.load_artifact(tmp_path / "m.ptz")  # weights_only: nothing in it can run code
    assert all(torch.equal(loaded[name], corrected[name]) for name in state)


# ---- the artifact ----


@pytest.mark.parametrize("bits, embed_bits, compressor", [
    (8, 8, "zlib"),
    (6, 8, "zlib"),
    (4, 5, "zlib"),
    (7, 8, "brotli"),
    (5, 6, "brotli"),
    (6, 7, "zpaq"),
])
def test_export_round_trip_within_quantization_error(tmp_path, bits, embed_bits, compressor):
    torch.manual_seed(0)
    # every matrix, K and V too, past KEEP_FLOAT_MAX_NUMEL, so quantized; no larger: zpaq takes seconds a megabyte
    hp = tiny_hp(vocab_size=512, model_dim=192, matrix_bits=bits, embed_bits=embed_bits, compressor=compressor)
    model = tg.GPT(hp)
    randomize(model)
    state = model.state_dict()
    blob = tg.save_artifact(state, tmp_path / "m.ptz", hp)
    assert (tmp_path / "m.ptz").stat().st_size == len(blob)
    restored = tg.load_artifact(tmp_path / "m.ptz")
    assert restored.keys() == state.keys()
    again = tg.save_artifact(state, None, hp)
    assert again == blob, "the same bytes every time: every rank exports them"
    quantized = tg.quantize_state_dict(state, hp)
    widths = {}
    for name, q in quantized["ints"].items():
        widths[name] = int(q.abs().max()).bit_length() + 1
    assert widths["tok_emb.weight"] == embed_bits, "the large embedding has its own width"
    assert widths["blocks.0.mlp.fc.weight"] == bits
    for name, w in state.items():
        assert restored[name].dtype == w.dtype and restored[name].shape == w.shape
        if name in quantized["ints"]:
            width = widths[name]
            scale = quantized["scales"][name].float()[:, None]
            # beyond the clip, values saturate by design
            inside = w.abs() <= (2 ** (width - 1) - 1) * scale
            err = (restored[name] - w).abs()
            half_step = scale.expand_as(w) * 0.5 + 1e-6
            assert (err[inside] <= half_step[inside]).all()
        elif any(key in name for key in tg.CONTROL_PARAM_NAMES):
            assert torch.equal(restored[name], w), f"control tensor {name} must stay fp32"
        else:
            torch.testing.assert_close(restored[name], w, rtol=1e-3, atol=1e-3)


class _Payload:
    def __reduce__(self):
        return (print, ("pickled code ran",))


def test_artifact_loader_refuses_pickled_code(tmp_path):
    buffer = io.BytesIO()
    torch.save({"format": "packed_rows_v1", "evil": _Payload()}, buffer)
    (tmp_path / "evil.ptz").write_bytes(zlib.compress(buffer.getvalue()))
    with pytest.raises(Exception, match="[Ww]eights only"):
        tg.load_artifact(tmp_path / "evil.ptz")


# ---- calibration ----


def calibration_run(tiny_data, **settings):
    """A Run on the tiny data with a model wide enough that its MLP matrices are quantized
    (> 16,384 weights)."""
    env = tiny_data.env(MODEL_DIM="128", NUM_HEADS="4", NUM_KV_HEADS="2", GPTQ="1",
                        GPTQ_CALIB_SEQS="6", **settings)
    run = tg.setup(env)
    torch.manual_seed(0)
    run.model = tg.GPT(run.hp)
    # a model whose every layer does something (the init zeroes projections)
    for p in run.model.parameters():
        torch.nn.init.normal_(p, std=0.05)
    pattern = str(tiny_data.data_path / "fineweb_train_*.bin")
    loader = tg.DistributedTokenLoader(pattern)
    return run, loader


def test_calibration_covers_every_quantized_matrix_and_never_reads_validation(tiny_data):
    run, loader = calibration_run(tiny_data)
    hessians = tg.calibrate(run, loader)
    state = run.model.state_dict()
    quantized = {name for name, t in state.items() if tg.is_quantized(name, t)}
    quantized -= {"bigram.weight"}
    assert set(hessians) == quantized
    assert "tok_emb.weight" in hessians and "blocks.0.mlp.fc.weight" in hessians
    tokens = 6 * run.hp.train_seq_len
    for name, H in hessians.items():
        assert H.shape == (state[name].size(1),) * 2 and torch.allclose(H, H.T)
        assert torch.linalg.eigvalsh(H.double()).min() > -1e-3 * H.diagonal().mean()
    # the tied embedding's X is the head's input, the final norm's output: every row has mean
    # square 1
    trace = hessians["tok_emb.weight"].trace().item()
    assert trace == pytest.approx(tokens * run.hp.model_dim, rel=1e-3)
    # the same calibration with different validation tokens (and none on disk) gives the same
    # Hessians
    run2, loader2 = calibration_run(tiny_data)
    run2.val = run2.val._replace(tokens=torch.randint_like(run2.val.tokens, 2, tiny_data.vocab_size))
    for path in tiny_data.data_path.glob("fineweb_val_*.bin"):
        path.rename(path.with_suffix(".hidden"))
    try:
        again = tg.calibrate(run2, loader2)
    finally:
        for path in tiny_data.data_path.glob("fineweb_val_*.hidden"):
            path.rename(path.with_suffix(".bin"))
    assert all(torch.equal(hessians[name], again[name]) for name in hessians)


def test_gptq_artifact_round_trips_through_the_safe_loader(tiny_data, tmp_path):
    run, loader = calibration_run(tiny_data)
    hessians = tg.calibrate(run, loader)
    state = run.model.state_dict()
    hp = run.hp
    hp.matrix_bits = 5
    hp.embed_bits = 6
    tg.save_artifact(state, tmp_path / "gptq.ptz", hp, hessians)
    tg.save_artifact(state, tmp_path / "rtn.ptz", hp)
    gptq = tg.load_artifact(tmp_path / "gptq.ptz")
    rtn = tg.load_artifact(tmp_path / "rtn.ptz")
    stored = tg.quantize_state_dict(state, hp, hessians)
    for name in hessians:
        top = 31 if name == "tok_emb.weight" else 15
        assert stored["ints"][name].abs().max() <= top, name
    for name in state:
        if name in hessians:  # exactly the integers times the stored scales
            ints = stored["ints"][name].float()
            scales = stored["scales"][name].float()
            assert torch.equal(gptq[name], ints * scales[:, None])
            alone = tg.quantize_state_dict({name: state[name]}, hp)
            assert torch.equal(stored["scales"][name], alone["scales"][name])
            assert not torch.equal(gptq[name], rtn[name]), f"{name}: GPTQ changed no rounding"
        else:
            assert torch.equal(gptq[name], rtn[name])
    model = copy.deepcopy(run.model)
    model.load_state_dict(gptq, strict=True)


# ---- packed code ----


def test_a_packed_script_trains_bitwise_like_the_readable_one(tiny_data, tmp_path):
    source = (ROOT / "train_gpt.py").read_bytes()
    packed = pack_source(source)
    assert packed.startswith(PACKED_HEAD)
    assert len(packed) < len(source) / 3
    assert pack_source(packed) == packed
    outs = {}
    (tmp_path / "packed").mkdir()
    (tmp_path / "packed" / "train_gpt.py").write_bytes(packed)
    # the readable script counts itself packed (PACK_CODE=1, the repository's packer); the packed one, as a
    # record folder holds it, runs alone and counts its own bytes
    runs = {"readable": (ROOT / "train_gpt.py", dict(PACK_CODE=1)),
            "packed": (tmp_path / "packed" / "train_gpt.py", {})}
    for name, (script, extra) in runs.items():
        env = tiny_data.env(RUN_ID=name, ITERATIONS=3, **extra)
        out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=240)
        assert out.returncode == 0, out.stderr[-3000:]
        outs[name] = out.stdout
    final = r"^(final_\w+_exact .*|artifact: \S+ bytes:\d+ sha256:\w+)"
    lines = {}
    for name, text in outs.items():
        lines[name] = re.findall(final, text, flags=re.M)
    renamed = [line.replace("readable", "packed") for line in lines["readable"]]
    assert lines["packed"] == renamed and lines["packed"]
    sizes = {}
    for name, text in outs.items():
        sizes[name] = int(re.search(r"^Code size: (\d+) bytes", text, flags=re.M).group(1))
    same = sizes["readable"] == sizes["packed"] == len(packed)
    assert same, "both count the packed file, as it will be submitted"

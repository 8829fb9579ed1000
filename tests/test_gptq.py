"""GPTQ=1: the quantizer's properties, its calibration, and the artifact it writes."""

import copy
import re
import zlib

import pytest
import torch

import train_gpt as tg


@pytest.mark.parametrize("bits, sigmas", [(4, 0.0), (6, 0.0), (6, 12.85)])
def test_identity_hessian_is_round_to_nearest(bits, sigmas):
    torch.manual_seed(0)
    w = torch.randn(48, 200)
    q, scale = tg.gptq_quantize(w, torch.eye(200), bits, damp=0.01, sigmas=sigmas)
    expected_q, expected_scale = tg.quantize_rows(w, bits, sigmas)
    assert torch.equal(q, expected_q) and torch.equal(scale, expected_scale)


@pytest.mark.parametrize("bits", [4, 5, 6])
def test_correlated_inputs_lose_less_than_round_to_nearest(bits):
    torch.manual_seed(1)
    w = torch.randn(64, 300)  # 300 columns: three blocks of 128, the last one partial
    x = torch.randn(2048, 24) @ torch.randn(24, 300) + 0.1 * torch.randn(2048, 300)  # inputs on a low-rank subspace
    q, scale = tg.gptq_quantize(w, x.T @ x, bits, damp=0.01)
    rtn_q, rtn_scale = tg.quantize_rows(w, bits)
    assert torch.equal(scale, rtn_scale), "the clip search's scales: the artifact format does not change"
    assert q.abs().max() <= 2 ** (bits - 1) - 1 and torch.equal(q, q.round())
    gptq_error = (x @ (q * scale[:, None]).T - x @ w.T).norm()
    rtn_error = (x @ (rtn_q * rtn_scale[:, None]).T - x @ w.T).norm()
    assert gptq_error < 0.5 * rtn_error


def textbook_gptq(w, H, bits, damp, order):
    """GPTQ as Frantar et al. write it (Algorithm 1, unblocked), on the columns in the given order."""
    W, H = w.double()[:, order].clone(), H.double()[order][:, order]
    H += damp * H.diagonal().mean() * torch.eye(len(H), dtype=H.dtype)
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    qmax, scale = 2 ** (bits - 1) - 1, tg.quantize_rows(w, bits)[1].double()
    Q = torch.zeros_like(W)
    for j in range(W.size(1)):
        Q[:, j] = torch.clamp(torch.round(W[:, j] / scale), -qmax, qmax)
        W[:, j + 1:] -= ((W[:, j] - Q[:, j] * scale) / U[j, j])[:, None] * U[j, j + 1:][None]
    return Q[:, torch.argsort(order)].float()


def test_columns_go_in_descending_order_of_the_hessians_diagonal():
    """Act order: GPTQ quantizes the columns whose inputs are largest first. Unblocked, it equals the textbook
    algorithm on the columns sorted by diag(H), descending, exactly; in their natural order it would not."""
    torch.manual_seed(3)
    w, x = torch.randn(32, 96), torch.randn(400, 96) * torch.linspace(0.1, 3.0, 96)  # later columns larger
    H = x.T @ x
    q, _ = tg.gptq_quantize(w, H, 4, damp=0.01, block=96)
    assert torch.equal(q, textbook_gptq(w, H, 4, 0.01, torch.argsort(H.diagonal(), descending=True)))
    assert not torch.equal(q, textbook_gptq(w, H, 4, 0.01, torch.arange(96)))
    blocked, _ = tg.gptq_quantize(w, H, 4, damp=0.01, block=32)
    assert (blocked != q).float().mean() < 0.01, "blocks change only the rounding of float noise"


def test_dead_inputs_are_zeroed():
    """An input that never fires (zero row/column of H) cannot inform the rounding; its weights are 0."""
    torch.manual_seed(2)
    w, x = torch.randn(16, 64), torch.randn(500, 64)
    x[:, 5] = 0
    q, _ = tg.gptq_quantize(w, x.T @ x, 6, damp=0.01)
    assert (q[:, 5] == 0).all() and (q[:, :5] != 0).any()


# ---- QUANT_SIGMAS: each row clipped at k standard deviations ----


@pytest.mark.parametrize("bits, sigmas", [(6, 12.85), (5, 6.0), (4, 3.0)])
def test_sigma_clip_is_k_row_stds_and_rounds_within_half_a_step(bits, sigmas):
    torch.manual_seed(3)
    w = torch.randn(32, 500) * torch.rand(32, 1)
    w[0, 0] = 40.0  # an outlier past the clip: clamped to the top integer, the row's step unchanged by it
    qmax = 2 ** (bits - 1) - 1
    q, scale = tg.quantize_rows(w, bits, sigmas)
    assert torch.equal(scale, (sigmas * w.std(dim=1) / qmax).half().float())
    assert q[0, 0] == qmax and q.abs().max() <= qmax and torch.equal(q, q.round())
    inside = w.abs() <= qmax * scale[:, None]
    assert ((q * scale[:, None] - w).abs() <= scale[:, None] / 2 + 1e-6)[inside].all()


def test_a_wider_sigma_clip_spends_fewer_bytes_for_more_error():
    torch.manual_seed(4)
    w = torch.randn(128, 512)
    sizes, errors = [], []
    for sigmas in (0.0, 4.0, 8.0, 12.85):  # 0: the clip search, at most the row's max (~3.3 stds here)
        stored = tg.quantize_state_dict({"m.weight": w}, tg.Hyperparameters(quant_bits=6, quant_sigmas=sigmas))
        sizes.append(len(zlib.compress(stored["ints"]["m.weight"].numpy().tobytes(), 9)))
        errors.append((tg.dequantize_state_dict(stored)["m.weight"] - w).square().sum().item())
    assert all(a > b for a, b in zip(sizes, sizes[1:])) and all(a < b for a, b in zip(errors, errors[1:]))


def test_the_artifact_clips_blocks_and_embedding_at_their_own_sigmas(tmp_path):
    torch.manual_seed(5)
    state = {"tok_emb.weight": torch.randn(64, 300), "blocks.0.mlp.fc.weight": torch.randn(64, 300)}
    hp = tg.Hyperparameters(quant_bits=6, embed_quant_bits=7, quant_sigmas=12.0, embed_quant_sigmas=16.0)
    tg.save_artifact(state, tmp_path / "model.ptz", hp)
    loaded = tg.load_artifact(tmp_path / "model.ptz")
    for name, bits, sigmas in (("tok_emb.weight", 7, 16.0), ("blocks.0.mlp.fc.weight", 6, 12.0)):
        q, scale = tg.quantize_rows(state[name], bits, sigmas)
        assert torch.equal(loaded[name], q * scale[:, None])


def calibration_run(tiny_data, **settings):
    """A Run on the tiny data with a model wide enough that its MLP matrices are quantized (> 16,384 weights)."""
    env = tiny_data.env(MODEL_DIM="128", NUM_HEADS="4", NUM_KV_HEADS="2", GPTQ="1", GPTQ_CALIB_SEQS="6", **settings)
    run = tg.setup(env)
    torch.manual_seed(0)
    run.model, run.log = tg.GPT(run.hp), tg.RunLog(None)
    for p in run.model.parameters():  # a model whose every layer does something (the init zeroes projections)
        torch.nn.init.normal_(p, std=0.05)
    loader = tg.DistributedTokenLoader(str(tiny_data.data_path / "fineweb_train_*.bin"))
    return run, loader


def test_calibration_covers_every_quantized_matrix_and_never_reads_validation(tiny_data):
    run, loader = calibration_run(tiny_data)
    hessians = tg.calibrate(run, loader)
    quantized = {name for name, t in run.model.state_dict().items() if tg.is_quantized(name, t)} - {"bigram.weight"}
    assert set(hessians) == quantized and "tok_emb.weight" in hessians and "blocks.0.mlp.fc.weight" in hessians
    tokens = 6 * run.hp.train_seq_len
    for name, H in hessians.items():
        assert H.shape == (run.model.state_dict()[name].size(1),) * 2 and torch.allclose(H, H.T)
        assert torch.linalg.eigvalsh(H.double()).min() > -1e-3 * H.diagonal().mean()
    # the tied embedding's X is the head's input, the final norm's output: every row has mean square 1
    assert hessians["tok_emb.weight"].trace().item() == pytest.approx(tokens * run.hp.model_dim, rel=1e-3)
    # the same calibration with different validation tokens (and none on disk) gives the same Hessians
    run2, loader2 = calibration_run(tiny_data)
    run2.val_tokens = torch.randint_like(run2.val_tokens, 2, tiny_data.vocab_size)
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
    run.hp.quant_bits, run.hp.embed_quant_bits = 5, 6
    tg.save_artifact(state, tmp_path / "gptq.ptz", run.hp, hessians)
    tg.save_artifact(state, tmp_path / "rtn.ptz", run.hp)
    gptq, rtn = tg.load_artifact(tmp_path / "gptq.ptz"), tg.load_artifact(tmp_path / "rtn.ptz")
    stored = tg.quantize_state_dict(state, run.hp, hessians)
    assert all(stored["ints"][name].abs().max() <= (15 if name != "tok_emb.weight" else 31) for name in hessians)
    for name in state:
        if name in hessians:  # exactly the integers times the stored scales
            ints, scales = stored["ints"][name].float(), stored["scales"][name].float()
            assert torch.equal(gptq[name], ints * scales[:, None])
            assert torch.equal(stored["scales"][name], tg.quantize_state_dict({name: state[name]}, run.hp)["scales"][name])
            assert not torch.equal(gptq[name], rtn[name]), f"{name}: GPTQ changed no rounding"
        else:
            assert torch.equal(gptq[name], rtn[name])
    model = copy.deepcopy(run.model)
    model.load_state_dict(gptq, strict=True)


@pytest.mark.parametrize("settings, message", [
    (dict(GPTQ_RESERVE_SECONDS="20"), "GPTQ_RESERVE_SECONDS=20.0: calibration on training data must fit"),
    (dict(GPTQ="1", MAX_WALLCLOCK_SECONDS="600"), "GPTQ_RESERVE_SECONDS=0.0: calibration on training data must fit"),
    (dict(GPTQ="1", GPTQ_CALIB_SEQS="0"), "GPTQ_CALIB_SEQS=0 must be positive"),
])
def test_calibration_settings_that_would_break_the_rules_or_the_math_are_refused(settings, message):
    with pytest.raises(tg.ConfigError, match=message):
        tg.Hyperparameters.from_env({"MAX_WALLCLOCK_SECONDS": "0", **settings})


def test_gptq_run_end_to_end(tiny_data, tmp_path):
    """GPTQ=1 on training batches, with its reserve: the run logs the calibration and scores the artifact."""
    from conftest import run_trainer

    out = run_trainer(tiny_data.env(RUN_ID="gptq", GPTQ="1", GPTQ_CALIB_SEQS="8", ITERATIONS="200",
                                    MAX_WALLCLOCK_SECONDS="3", GPTQ_RESERVE_SECONDS="1", TRAIN_LOG_EVERY="1"), tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "gptq: matrices:1 calib:train sequences:8 calibration_time:" in out.stdout  # width 64: only the embedding
    assert "reserved:1000ms" in out.stdout and "final_int8_zlib_roundtrip_exact" in out.stdout
    stopped = re.search(r"stopping_early: wallclock_cap train_time:(\d+)ms step:(\d+)/200", out.stdout)
    assert stopped and int(stopped.group(2)) < 200 and int(stopped.group(1)) >= 2000, "the cap, not ITERATIONS"
    clock = {int(step): int(ms) for step, ms in re.findall(r"^step:(\d+)/200 train_loss:\S+ train_time:(\d+)ms",
                                                          out.stdout, flags=re.M)}
    last = int(stopped.group(2))
    assert clock[last] >= 2000 > clock[last - 1], \
        "training stops at MAX_WALLCLOCK_SECONDS - GPTQ_RESERVE_SECONDS: after the step that crossed it, load or not"

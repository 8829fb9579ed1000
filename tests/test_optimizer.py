"""The optimizer: Muon and its Newton-Schulz orthogonalization, the AdamW groups, the LR and
momentum schedules, and the EMA of the weights."""

import sys

import pytest
import torch

import train_gpt as tg
from conftest import ROOT, all_on_hp, tiny_hp


def ids(optimizer: torch.optim.Optimizer) -> set[int]:
    return {id(p) for g in optimizer.param_groups for p in g["params"]}


def spread_matrix(shape: tuple[int, int], singular_values: torch.Tensor) -> torch.Tensor:
    """A random matrix of the given shape with the given singular values."""
    k = min(shape)
    U, _ = torch.linalg.qr(torch.randn(shape[0], k))
    V, _ = torch.linalg.qr(torch.randn(shape[1], k))
    return U @ torch.diag(singular_values) @ V.T


# ---- parameter groups ----


def test_params_split_between_muon_and_adam():
    hp = tiny_hp(num_layers=3)
    model = tg.GPT(hp)
    adam, muon = tg.build_optimizers(model, hp, tg.Layout())
    muon_ids = ids(muon)
    adam_ids = ids(adam)
    assert muon_ids.isdisjoint(adam_ids)
    every = {id(p) for p in model.parameters()}
    assert muon_ids | adam_ids == every, "every parameter has one optimizer"
    assert all(p.ndim == 2 for g in muon.param_groups for p in g["params"])
    embedding = id(model.tok_emb.weight)
    assert embedding in adam_ids, "the tied embedding (and head) trains with Adam"
    resid_mix = id(model.blocks[0].resid_mix)
    assert resid_mix in adam_ids, "2-D control tensors belong to Adam"


def test_adamw_groups_decay_only_where_asked():
    hp = all_on_hp(embed_wd=0.5, adam_wd=0.0)
    model = tg.GPT(hp)
    adam, muon = tg.build_optimizers(model, hp, tg.Layout())
    decays = {}
    for group in adam.param_groups:
        for p in group["params"]:
            decays[id(p)] = group["weight_decay"]
    assert decays[id(model.tok_emb.weight)] == 0.5
    assert decays[id(model.bigram.weight)] == 0.5
    assert decays[id(model.smear_gate)] == 0.0
    assert decays[id(model.blocks[4].lane_mix)] == 0.0
    assert id(model.bigram_proj.weight) in ids(muon)
    assert muon.param_groups[0]["weight_decay"] == hp.muon_wd


# ---- Newton-Schulz ----


@pytest.mark.parametrize("shape", [(64, 128), (128, 64), (96, 96)])
def test_newton_schulz_singular_values_near_one(shape):
    torch.manual_seed(0)
    # singular values from 1 down to ~0.03
    G = spread_matrix(shape, torch.logspace(0, -1.5, min(shape)))
    s = torch.linalg.svdvals(tg.zeropower_via_newtonschulz5(G).float())
    assert s.min() > 0.6 and s.max() < 1.25, (s.min().item(), s.max().item())


@pytest.mark.parametrize("shape", [(64, 128), (128, 64), (96, 96)])
def test_polar_express_singular_values_in_a_narrow_band(shape):
    torch.manual_seed(0)
    # singular values spread over two decades
    G = spread_matrix(shape, torch.logspace(-2, 0, min(shape)))
    polar = tg.zeropower_via_newtonschulz5(
        G, 5, dtype=torch.float32, coeffs=tg.POLAR_EXPRESS_COEFFS)
    quintic = tg.zeropower_via_newtonschulz5(G, 5, dtype=torch.float32)
    s_polar = torch.linalg.svdvals(polar)
    s_quintic = torch.linalg.svdvals(quintic)
    # the fixed quintic: about [0.68, 1.2]
    assert s_polar.min() > 0.85 and s_polar.max() < 1.15
    band_polar = s_polar.max() - s_polar.min()
    band_quintic = s_quintic.max() - s_quintic.min()
    assert band_polar < band_quintic, "tighter than the fixed quintic"


# ---- Muon ----


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-6), (torch.bfloat16, 2e-3)])
def test_muon_step_matches_reference(dtype, atol):
    torch.manual_seed(0)
    shapes = [(16, 8), (8, 16), (12, 12)]
    params = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    reference = [p.detach().clone() for p in params]
    momentum_bufs = [torch.zeros_like(p) for p in params]
    lr = 0.05
    momentum = 0.9
    opt = tg.Muon(params, lr=lr, momentum=momentum, backend_steps=5, bf16=dtype == torch.bfloat16)
    for _ in range(3):
        grads = [torch.randn_like(p) for p in params]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
        # plain Nesterov momentum -> orthogonalize -> shape-scaled step
        for i, g in enumerate(grads):
            momentum_bufs[i] = momentum * momentum_bufs[i] + g
            nesterov = g + momentum * momentum_bufs[i]
            update = tg.zeropower_via_newtonschulz5(nesterov, dtype=dtype).float()
            update *= max(1.0, g.shape[0] / g.shape[1]) ** 0.5
            reference[i] -= lr * update
    for p, ref in zip(params, reference):
        torch.testing.assert_close(p.detach(), ref, rtol=0, atol=atol)
    assert p.dtype == torch.float32


@pytest.mark.parametrize("row_normalize, polar", [(False, False), (True, True)])
def test_muon_weight_decay_with_zero_gradient_is_exact_shrinkage(row_normalize, polar, monkeypatch):
    """Muon as the run builds it from the settings: MUON_POLAR picks the Newton-Schulz coefficients, and a zero
    gradient leaves exactly the decoupled decay p * (1 - lr * wd)."""
    hp = tiny_hp(matrix_lr=0.05, muon_momentum=0.95, muon_wd=0.2, muon_row_normalize=row_normalize,
                 muon_polar=polar)
    _, muon = tg.build_optimizers(tg.GPT(hp), hp, tg.Layout())
    params = muon.param_groups[0]["params"]
    before = [p.detach().clone() for p in params]
    coeffs = []
    real = tg.zeropower_via_newtonschulz5
    monkeypatch.setattr(tg, "zeropower_via_newtonschulz5", lambda *a, **k: coeffs.append(k["coeffs"]) or real(*a, **k))
    for p in params:
        p.grad = torch.zeros_like(p)
    muon.step()
    assert set(coeffs) == {tg.POLAR_EXPRESS_COEFFS if polar else tg.QUINTIC_COEFFS}
    for p, old in zip(params, before):
        assert torch.equal(p.detach(), old * (1 - 0.05 * 0.2))


def test_muon_row_norm_equalizes_rows_before_orthogonalizing(monkeypatch):
    seen = []

    def record(g, *args, **kwargs):
        seen.append(g.clone())
        return g
    p = torch.nn.Parameter(torch.randn(8, 16))
    muon = tg.Muon([p], lr=0.0, momentum=0.0, row_normalize=True)
    monkeypatch.setattr(tg, "zeropower_via_newtonschulz5", record)
    p.grad = torch.randn(8, 16) * torch.arange(1, 9)[:, None]
    muon.step()
    assert seen[0].shape == (1, 8, 16), "a bank of one"
    torch.testing.assert_close(seen[0][0].norm(dim=1), torch.ones(8))


# ---- schedules ----


def test_warmdown_by_steps():
    hp = tiny_hp(num_layers=3, iterations=100, warmdown_iters=20, max_wallclock_seconds=0)
    assert tg.lr_schedule(0, 0.0, hp) == 1.0
    assert tg.lr_schedule(80, 0.0, hp) == 1.0
    assert tg.lr_schedule(90, 0.0, hp) == pytest.approx(0.5)
    assert tg.lr_schedule(100, 0.0, hp) == 0.0


def test_warmdown_by_wallclock():
    hp = tiny_hp(num_layers=3, iterations=10_000, warmdown_iters=100, max_wallclock_seconds=10.0)
    # 10 ms/step: the warmdown spans the last 100 * 10 ms = 1 s of the 10 s budget
    assert tg.lr_schedule(10, 100.0, hp) == 1.0
    assert tg.lr_schedule(900, 9000.0, hp) == pytest.approx(1.0)
    assert tg.lr_schedule(950, 9500.0, hp) == pytest.approx(0.5)
    assert tg.lr_schedule(1000, 10_000.0, hp) == 0.0
    # a step cap reached before the budget still warms down by steps
    capped = tiny_hp(num_layers=3, iterations=200, warmdown_iters=100, max_wallclock_seconds=600.0)
    assert tg.lr_schedule(150, 1500.0, capped) == pytest.approx(0.5)


def test_warmdown_fraction_endpoints_and_floor():
    """The field's schedule: max(ramp, floor), the ramp falling from 1 to 0 over the last
    WARMDOWN_FRAC."""
    hp = tg.Hyperparameters(iterations=100, warmdown_frac=0.4, min_lr=0.1, max_wallclock_seconds=0)
    lr = [tg.lr_schedule(step, 0.0, hp) for step in range(101)]
    assert lr[0] == pytest.approx(1.0)
    assert lr[60] == pytest.approx(1.0), "flat until the last 40%"
    assert lr[61] < 1.0
    assert lr[80] == pytest.approx(0.5), "then the plain ramp (1 - f) / 0.4, not rescaled"
    assert lr[95] == pytest.approx(0.125)
    assert lr[96] == pytest.approx(0.1), "the knee: the ramp meets the floor at 96"
    assert lr[97:] == [pytest.approx(0.1)] * 4, "flat at the floor to the end"
    assert all(a >= b for a, b in zip(lr, lr[1:]))
    hp = tg.Hyperparameters(iterations=10**6, warmdown_frac=0.4, min_lr=0.0,
                            max_wallclock_seconds=100)
    by_time = tg.lr_schedule(10, 80_000.0, hp)
    assert by_time == pytest.approx(0.5), "by wallclock: 20 s of a 40 s warmdown left"
    assert tg.lr_schedule(10, 100_000.0, hp) == 0.0


def test_muon_momentum_warmup():
    hp = tiny_hp(num_layers=3, muon_momentum=0.95, muon_momentum_warmup_start=0.85,
                 muon_momentum_warmup_steps=100)
    assert tg.muon_momentum(0, hp) == pytest.approx(0.85)
    assert tg.muon_momentum(50, hp) == pytest.approx(0.90)
    assert tg.muon_momentum(500, hp) == pytest.approx(0.95)


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
        live = [p.detach() for p in model.parameters()]
        expected = [0.9 * e + 0.1 * p for e, p in zip(expected, live)]
    for e, got in zip(expected, ema.params):
        torch.testing.assert_close(got, e)
    live = [p.detach().clone() for p in model.parameters()]
    ema.swap(model)
    for p, e in zip(model.parameters(), expected):
        torch.testing.assert_close(p.detach(), e)
    ema.swap(model)
    for p, before in zip(model.parameters(), live):
        assert torch.equal(p.detach(), before)


# ---- Muon by banks ----


@torch.no_grad()
def per_matrix_step(muon: tg.Muon) -> None:
    """Muon's step as it was before the banks (commit 4a4721b): each matrix its own momentum, Newton-Schulz and
    update, in the parameters' order, every world_size-th on this rank."""
    settings = muon.orthogonalize.keywords
    for group in muon.param_groups:
        params = group["params"]
        sizes = [p.numel() for p in params]
        updates = torch.zeros(sum(sizes), dtype=muon.update_dtype)
        views = updates.split(sizes)
        for i, p in enumerate(params):
            if "momentum_buffer" not in muon.state[p]:
                muon.state[p]["momentum_buffer"] = torch.zeros_like(p.grad)
            buf = muon.state[p]["momentum_buffer"].mul_(group["momentum"]).add_(p.grad)
            if i % muon.world_size == muon.rank:
                g = p.grad.add(buf, alpha=group["momentum"])
                if settings["row_normalize"]:
                    g = g / g.norm(dim=1, keepdim=True).clamp_min(1e-7)
                g = tg.zeropower_via_newtonschulz5(g, settings["steps"], dtype=muon.update_dtype,
                                                   coeffs=settings["coeffs"])
                views[i].copy_((g * max(1.0, g.size(0) / g.size(1)) ** 0.5).flatten())
        if muon.world_size > 1:
            tg.dist.all_reduce(updates)
        for p, update in zip(params, views):
            if group["weight_decay"]:
                p.mul_(1.0 - group["lr"] * group["weight_decay"])
            p.add_(update.view_as(p).to(p.dtype), alpha=-group["lr"])


def default_shape_muon(seed: int, **overrides):
    """The default run's 54 matrices (9 layers: q, k, v, attention's and the MLP's projections), narrowed to
    width 64 (the same banks, the same op count), with gradients."""
    hp = tg.Hyperparameters(model_dim=64, **overrides)
    torch.manual_seed(seed)
    model = tg.GPT(hp)
    _, muon = tg.build_optimizers(model, hp, tg.Layout())
    for p in muon.param_groups[0]["params"]:
        p.grad = torch.randn_like(p)
    return model, muon


def three_steps(muon: tg.Muon, step) -> tuple[list, list]:
    """step(muon) 3 times, on the same seeded gradients whichever step it is; the weights and momenta after."""
    params = muon.param_groups[0]["params"]
    for i in range(3):
        torch.manual_seed(i + 1)
        for p in params:
            p.grad = torch.randn_like(p)
        step(muon)
    return [p.detach().clone() for p in params], [muon.state[p]["momentum_buffer"] for p in params]


def banked_steps(levers: dict, rank: int, world_size: int, peer: list) -> tuple[list, list]:
    """3 bank steps on one rank; peer: the other rank's update buffers, a bank's at each all_reduce, which
    all_reduce adds (and a rank run first appends its own to)."""
    _, muon = default_shape_muon(0, **levers)
    muon.rank = rank
    muon.world_size = world_size
    real = tg.dist.all_reduce
    tg.dist.all_reduce = lambda updates: updates.add_(peer.pop(0)) if rank == 0 else peer.append(updates.clone())
    try:
        return three_steps(muon, tg.Muon.step)
    finally:
        tg.dist.all_reduce = real


@pytest.mark.parametrize("levers", [{}, dict(muon_row_normalize=True, muon_polar=True, muon_wd=0.05)])
@pytest.mark.parametrize("world_size", [1, 2])
def test_the_bank_step_is_the_per_matrix_step(levers, world_size):
    """The banks reorder the work, not the maths: momentum buffers bitwise, weights within rounding; on 2 ranks,
    each takes its share of every bank and the sum of the two is the one process's update."""
    _, muon = default_shape_muon(0, **levers)
    reference, reference_bufs = three_steps(muon, per_matrix_step)
    peer = []
    if world_size == 2:
        banked_steps(levers, 1, 2, peer)
        assert len(peer) == 3 * 4, "a sum for each of the 4 banks, each step"
    banked, banked_bufs = banked_steps(levers, 0, world_size, peer)
    assert len(banked) == 54
    for a, b in zip(banked_bufs, reference_bufs):
        assert torch.equal(a, b)
    for a, b in zip(banked, reference):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_a_muon_step_dispatches_a_quarter_of_the_per_matrix_ops():
    """At the default run's 54 matrices: the banks' step (4 banks, each one batched Newton-Schulz) against the
    per-matrix step it replaced (bench/muon_ops.py prints both beside the challenge's), counted as it counts."""
    sys.path.insert(0, str(ROOT / "bench"))
    from muon_ops import OpCounter
    counts = []
    for step in (lambda muon: muon.step(), per_matrix_step):
        _, muon = default_shape_muon(0)
        step(muon)  # the momentum buffers exist: a steady step
        with OpCounter() as counter:
            step(muon)
        counts.append(counter.count)
    banked, per_matrix = counts
    assert banked * 4 <= per_matrix, counts

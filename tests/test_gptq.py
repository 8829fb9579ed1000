"""The GPTQ prototype (bench/gptq.py), on the properties the export will rely on."""

import sys

import pytest
import torch

import train_gpt as tg
from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from gptq import gptq_rows  # noqa: E402


@pytest.mark.parametrize("bits", [4, 6])
def test_identity_hessian_is_round_to_nearest(bits):
    torch.manual_seed(0)
    w = torch.randn(48, 200)
    q, scale = gptq_rows(w, torch.eye(200), bits)
    expected_q, expected_scale = tg.quantize_rows(w, bits)
    assert torch.equal(q, expected_q) and torch.equal(scale, expected_scale)


@pytest.mark.parametrize("bits", [4, 5, 6])
def test_correlated_inputs_lose_less_than_round_to_nearest(bits):
    torch.manual_seed(1)
    w = torch.randn(64, 256)
    x = torch.randn(2048, 24) @ torch.randn(24, 256) + 0.1 * torch.randn(2048, 256)  # inputs on a low-rank subspace
    q, scale = gptq_rows(w, (x.T @ x).double(), bits)
    rtn_q, rtn_scale = tg.quantize_rows(w, bits)
    assert q.abs().max() <= 2 ** (bits - 1) - 1 and torch.equal(q, q.round())
    gptq_error = (x @ (q * scale[:, None]).T - x @ w.T).norm()
    rtn_error = (x @ (rtn_q * rtn_scale[:, None]).T - x @ w.T).norm()
    assert gptq_error < 0.5 * rtn_error


def test_dead_inputs_are_zeroed():
    """An input that never fires (zero row/column of H) cannot inform the rounding; its weights are 0."""
    torch.manual_seed(2)
    w, x = torch.randn(16, 64), torch.randn(500, 64)
    x[:, 5] = 0
    q, _ = gptq_rows(w, (x.T @ x).double(), 6)
    assert (q[:, 5] == 0).all() and (q[:, :5] != 0).any()

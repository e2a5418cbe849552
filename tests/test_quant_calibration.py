"""Folding, calibration and GPTQ, each against a direct float computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from random_ir import random_ir

from hardwire.frontend import float_forward
from hardwire.quant.calibrate import calibrate, clip_range
from hardwire.quant.fold import fold_norms
from hardwire.quant.gptq import gptq
from hardwire.quant.weights import quantize_int, quantize_mxfp4

IDS = torch.randint(0, 40, (3, 12), generator=torch.Generator().manual_seed(5))


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_folded_model_computes_the_same_function(family):
    """Norm gains and biases moved into the next projections: the same logits, and unit norms left behind."""
    ir = random_ir(family=family)
    folded = fold_norms(ir)
    assert torch.allclose(float_forward(folded, IDS), float_forward(ir, IDS), rtol=1e-4, atol=1e-4)
    assert all(np.all(layer.attn_norm.weight == 1) and np.all(layer.mlp_norm.weight == 1) for layer in folded.layers)
    gain = ir.layers[0].attn_norm.weight.astype(np.float64)
    assert np.allclose(folded.layers[0].q.weight, ir.layers[0].q.weight * gain[None, :], rtol=1e-6)


def test_calibration_statistics_equal_a_direct_computation():
    ir = fold_norms(random_ir())
    cal = calibrate(ir, IDS)
    seen: dict[str, list[torch.Tensor]] = {}
    float_forward(ir, IDS, lambda site, v: seen.setdefault(site, []).append(v.detach().double()))
    for site, values in seen.items():
        assert cal.amax[site] == pytest.approx(max(float(v.abs().max()) for v in values), rel=1e-6)
    a = seen["layers.1.mlp_norm"][0].reshape(-1, 32)  # a projection input: (positions, channels)
    assert np.allclose(cal.mean_sq["layers.1.mlp_norm"], (a**2).mean(0).numpy(), rtol=1e-5)
    assert np.allclose(cal.gram["layers.1.mlp_norm"], (a.T @ a / a.shape[0]).numpy(), rtol=1e-5, atol=1e-9)
    q = torch.cat([v.reshape(-1) for v in seen["layers.0.q"]])  # before and after RoPE, pooled
    assert cal.samples["layers.0.q"].numel() == q.numel()


def test_clip_range_is_the_least_squared_error_candidate():
    values = torch.cat([torch.randn(5000, generator=torch.Generator().manual_seed(2)), torch.tensor([40.0, -35.0])])
    best = clip_range(values, 127)

    def error(r: float) -> float:
        q = (values.double() * 127 / r).round().clamp(-128, 127) * r / 127
        return float((values.double() - q).pow(2).sum())

    candidates = [40.0 * ratio for ratio in np.linspace(1.0, 0.2, 33)]
    assert best == pytest.approx(min(candidates, key=error))
    assert best < 40.0  # two outliers are worth clipping for 5,000 values
    assert clip_range(torch.zeros(10), 127) == 1e-12


def _output_error(w: np.ndarray, q: np.ndarray, h: np.ndarray) -> float:
    """E ||(W - Q) a||^2 = trace((W - Q) H (W - Q)^T) for H = E[a a^T]."""
    d = w - q
    return float(np.einsum("oi,ij,oj->", d, h, d))


@pytest.mark.parametrize("scheme", ["int3", "int4", "mxfp4"])
def test_gptq_lowers_the_output_error_against_the_hessian(scheme):
    rng = np.random.default_rng(3)
    w = rng.normal(size=(24, 64))
    mix = rng.normal(size=(64, 64)) * 0.3 + np.eye(64)
    a = rng.normal(size=(2000, 64)) @ mix  # correlated inputs: where GPTQ's error feedback pays
    h = a.T @ a / a.shape[0]
    base = quantize_mxfp4(w) if scheme == "mxfp4" else quantize_int(w, int(scheme[3:]))
    rounded = gptq(w, h, base)
    assert np.array_equal(rounded.row_scale, base.row_scale)  # same grid, new codes
    assert _output_error(w, rounded.dequantize(), h) < 0.8 * _output_error(w, base.dequantize(), h)
    if scheme != "mxfp4":
        top = 2 ** (base.bits - 1)
        assert rounded.codes.min() >= -top and rounded.codes.max() <= top - 1


def test_gptq_act_order_is_natural_order_on_the_permuted_problem():
    """act_order rounds the largest-diagonal input first: the same as natural order after sorting the columns."""
    rng = np.random.default_rng(6)
    w = rng.normal(size=(12, 40))
    a = rng.normal(size=(500, 40)) @ (rng.normal(size=(40, 40)) * 0.3 + np.eye(40)) * rng.uniform(0.2, 3.0, size=40)
    h = a.T @ a / a.shape[0]
    base = quantize_int(w, 3)
    order = np.argsort(-np.diag(h), kind="stable")
    assert not np.array_equal(order, np.arange(40))
    sorted_codes = gptq(w[:, order], h[np.ix_(order, order)], base, act_order=False).codes
    assert np.array_equal(gptq(w, h, base, act_order=True).codes[:, order], sorted_codes)
    assert not np.array_equal(gptq(w, h, base, act_order=False).codes, gptq(w, h, base).codes)


def test_gptq_on_uncorrelated_inputs_is_round_to_nearest():
    """A diagonal Hessian has nothing to push an error onto: GPTQ's codes are the nearest ones."""
    rng = np.random.default_rng(4)
    w = rng.normal(size=(16, 32))
    base = quantize_int(w, 4)
    h = np.diag(rng.uniform(0.5, 2.0, size=32))
    assert np.array_equal(gptq(w, h, base).codes, base.codes)

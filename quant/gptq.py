"""GPTQ rounding: choose codes column by column, pushing each column's error onto the rest.

Round-to-nearest treats every weight alone. GPTQ (Frantar et al., 2022) keeps a weight
tensor's scales but picks its codes in order of input columns, and after each column
moves the rounding error onto the columns not yet rounded, weighted by the inverse of
the calibration Hessian H = E[a a^T]. The layer's output error, not the weight error, is
what it minimises; at 3 and 4 bits that is the difference between a usable and a
broken model. The codes stay on the scheme's grid, so the integer program is unchanged.
"""

from __future__ import annotations

import numpy as np

from .weights import QuantizationError, QuantizedWeight, e2m1_decode, e2m1_encode

DAMPING = 0.01  # fraction of the mean diagonal added to H, as in the GPTQ reference code


def _element_scale(base: QuantizedWeight) -> np.ndarray:
    """Float value of one code unit, per element (out, in)."""
    if base.block_shift is None:
        return np.repeat(base.row_scale[:, None], base.codes.shape[1], axis=1)
    shift = np.repeat(base.block_shift.astype(np.int64), QuantizedWeight.BLOCK, axis=1)[:, : base.codes.shape[1]]
    return base.row_scale[:, None] * np.exp2(shift)


def _round_column(x: np.ndarray, base: QuantizedWeight) -> np.ndarray:
    """Codes (out,) nearest to x (in code units) on the scheme's grid."""
    if base.scheme == "mxfp4":  # code = 2 * E2M1 value; ties to even, saturating at 6
        return np.rint(2 * e2m1_decode(e2m1_encode(x / 2))).astype(np.int64)
    qmax = 2 ** (base.bits - 1) - 1
    return np.clip(np.rint(x), -qmax - 1, qmax).astype(np.int64)


def gptq(w: np.ndarray, hessian: np.ndarray, base: QuantizedWeight, act_order: bool = True) -> QuantizedWeight:
    """Codes for w (out, in) on base's grid and scales, chosen against hessian (in, in).

    act_order: round the columns of the largest Hessian diagonal (the inputs that carry the most energy)
    first, while the most columns remain to absorb their error (GPTQ's "act-order"); the scales stay
    the ones `base` chose, so the grid and the stored format do not change.
    """
    weights = np.asarray(w, dtype=np.float64).copy()
    n_in = weights.shape[1]
    if hessian.shape != (n_in, n_in):
        raise QuantizationError(f"GPTQ needs an ({n_in}, {n_in}) Hessian, got {hessian.shape}")
    h = np.asarray(hessian, dtype=np.float64).copy()
    dead = np.diag(h) == 0  # inputs that never fire: their weights cannot matter
    h[dead, dead] = 1.0
    weights[:, dead] = 0.0
    h += DAMPING * np.mean(np.diag(h)) * np.eye(n_in)
    order = np.argsort(-np.diag(h), kind="stable") if act_order else np.arange(n_in)
    h, weights = h[np.ix_(order, order)], weights[:, order]
    upper = np.linalg.cholesky(np.linalg.inv(h)).T  # upper Cholesky factor of H^-1
    scale = _element_scale(base)[:, order]
    codes = np.zeros(weights.shape, dtype=np.int64)
    for i in range(n_in):
        column = weights[:, i]
        codes[:, i] = _round_column(column / scale[:, i], base)
        error = (column - codes[:, i] * scale[:, i]) / upper[i, i]
        weights[:, i + 1 :] -= np.outer(error, upper[i, i + 1 :])
    codes[:, order] = codes.copy()
    result = QuantizedWeight(base.scheme, base.bits, codes.astype(np.int8), base.row_scale, base.block_shift,
                             base.block_exponent, 0.0)
    original = np.asarray(w, dtype=np.float64)
    error = float(np.linalg.norm(original - result.dequantize()) / max(np.linalg.norm(original), 1e-300))
    return QuantizedWeight(base.scheme, base.bits, result.codes, base.row_scale, base.block_shift,
                           base.block_exponent, error)

"""Weight quantizers: float (out, in) matrices to integer codes plus scales, at compile time.

Three schemes. "int": symmetric per-row integer codes of 2..8 bits, each row's scale found by
a search over clipping ratios weighted by calibration importance. "int_group": the same codes
with a power-of-two exponent per 32 inputs on top of the row scale (0..7 binades, 3 bits per
group): the grid follows each block's range as MXFP4's does, for 3/32 of a bit per weight.
"mxfp4": OCP Microscaling v1.0 FP4 (E2M1 elements, one E8M0 exponent per 32 inputs), stored
as integer codes times two so that the datapath needs only integers and shifts.
Everything is numpy float64; the codes and scales are what the hardware uses, bit for bit.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar

import numpy as np


class QuantizationError(ValueError):
    """A weight tensor or setting that cannot be quantised; the message says what is accepted."""


E2M1_VALUES: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitudes by 3-bit index
_E2M1 = np.array(E2M1_VALUES)
_E2M1_X2 = np.array([int(2 * v) for v in E2M1_VALUES], dtype=np.int8)  # (0, 1, 2, 3, 4, 6, 8, 12)
_E2M1_MIDS = (_E2M1[:-1] + _E2M1[1:]) / 2  # (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0): the rounding ties
_E8M0_MIN, _E8M0_MAX = -127, 127  # unbiased shared-exponent range (255 is NaN in E8M0)
GROUP_SHIFT_BITS = 3  # int_group: a group's exponent over its row scale, 0..7
MX_SHIFT_BITS = 5  # mxfp4: a block's exponent over its row's smallest, as the chip stores it (0..24)
ROW_SCALE_BITS = 21  # the chip's per-row rescale: a 15-bit multiplier and a 6-bit shift (docs/numerics.md §2)
_GROUP_BASES_PER_BINADE = 8  # int_group: row-scale candidates per factor of two


@dataclass(frozen=True, eq=False)  # eq=False: numpy arrays have no truth value to compare by
class QuantizedWeight:
    scheme: str  # "int", "int_group" or "mxfp4"
    bits: int  # code width: 2..8 for "int" and "int_group", 4 for "mxfp4"
    codes: np.ndarray  # int8 (out, in); int: signed codes; mxfp4: E2M1 value × 2, in {0, ±1, ±2, ±3, ±4, ±6, ±8, ±12}
    row_scale: np.ndarray  # float64 (out,): weight = codes * row_scale[:, None] * 2**shift
    block_shift: np.ndarray | None  # int16 (out, n_blocks) >= 0: mxfp4 E_block - min E of the row, int_group the
    #                                 group's exponent over the row scale; None for int
    block_exponent: np.ndarray | None  # mxfp4: int16 (out, n_blocks), E8M0 shared exponent in [-127, 127]; None for int
    error: float  # ||W - dequantize()||_F / ||W||_F, 0 for an all-zero W

    BLOCK: ClassVar[int] = 32  # MXFP4 block size along the input dimension

    def dequantize(self) -> np.ndarray:
        """The real weights the codes stand for, float64 (out, in); exact for mxfp4 (powers of two only)."""
        w = self.codes.astype(np.float64) * self.row_scale[:, None]
        if self.block_shift is None:
            return w
        shift = np.repeat(self.block_shift.astype(np.int64), self.BLOCK, axis=1)[:, : self.codes.shape[1]]  # (out, in)
        return np.ldexp(w, shift)

    @property
    def code_bits(self) -> int:
        return int(self.codes.size) * self.bits

    @property
    def scale_bits(self) -> int:
        """Side information the chip stores beside the codes (see `scale_bits`)."""
        return scale_bits(*self.codes.shape, self.scheme)


def scale_bits(rows: int, cols: int, scheme: str) -> int:
    """Bits of side information a (rows, cols) tensor in `scheme` costs on the chip: the row rescale
    (multiplier and shift) per row, plus a group's or block's exponent per 32 inputs of every row."""
    groups = rows * -(-cols // QuantizedWeight.BLOCK)
    per_group = {"int": 0, "int_group": GROUP_SHIFT_BITS, "mxfp4": MX_SHIFT_BITS}
    if scheme not in per_group:
        raise QuantizationError(f"unknown weight scheme {scheme!r}; accepted: {', '.join(per_group)}")
    return rows * ROW_SCALE_BITS + groups * per_group[scheme]


def _check_weight(w: np.ndarray) -> np.ndarray:
    """w as float64 (out, in), or a QuantizationError naming what is wrong."""
    a = np.asarray(w)
    if a.ndim != 2 or not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise QuantizationError(f"weight tensor must be a 2-D (out, in) real array, got shape {a.shape} of dtype {a.dtype}")
    if a.size == 0:
        raise QuantizationError(f"weight tensor is empty (shape {a.shape}); quantisation needs at least one row and column")
    a = a.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(a))  # row-major order
    if bad.size:
        r, c = divmod(int(bad[0]), a.shape[1])
        raise QuantizationError(
            f"weight tensor has a non-finite value ({float(a[r, c])!r}) at row {r}, column {c}; quantisation needs finite weights"
        )
    return a


def _relative_error(w: np.ndarray, q: np.ndarray) -> float:
    norm = float(np.linalg.norm(w))
    return 0.0 if norm == 0.0 else float(np.linalg.norm(w - q)) / norm


def _check_bits_and_importance(w: np.ndarray, bits: int, importance: np.ndarray | None) -> tuple[np.ndarray, int, np.ndarray]:
    """(w as float64, bits as int, importance per column) or a QuantizationError naming what is wrong."""
    if isinstance(bits, bool) or not isinstance(bits, int | np.integer) or not 2 <= bits <= 8:
        raise QuantizationError(f"bits must be between 2 and 8, got {bits!r}")
    a = _check_weight(w)
    n_in = a.shape[1]
    if importance is None:
        return a, int(bits), np.ones(n_in)
    imp = np.asarray(importance, dtype=np.float64)
    accepted = f"importance must be {n_in} finite non-negative values (one per input column)"
    if imp.shape != (n_in,):
        raise QuantizationError(f"{accepted}, got shape {imp.shape}")
    bad = np.flatnonzero(~(np.isfinite(imp) & (imp >= 0)))
    if bad.size:
        raise QuantizationError(f"{accepted}, got {float(imp[bad[0]])!r} at column {int(bad[0])}")
    return a, int(bits), imp


def quantize_int(w: np.ndarray, bits: int, importance: np.ndarray | None = None) -> QuantizedWeight:
    """Symmetric per-row integer codes; each row's scale minimises the importance-weighted squared error.

    importance (in,) is a non-negative weight per input column (mean squared activation from
    calibration): an error on a column that carries large activations costs more. The search
    tries scales from no clipping (r = 1) down to r = 0.5, then amax / 2**(bits-1) (the negative
    extreme in use); ties keep the earlier, less clipped candidate.
    """
    a, bits, imp = _check_bits_and_importance(w, bits, importance)
    out = a.shape[0]
    qmax, qmin = 2 ** (bits - 1) - 1, -(2 ** (bits - 1))
    amax = np.abs(a).max(axis=1)  # (out,)
    live = amax > 0
    ratios = [*np.linspace(1.0, 0.5, 40) / qmax, 1.0 / -qmin]  # scale = ratio * amax
    best_err = np.full(out, np.inf)
    best_scale = np.ones(out)
    for ratio in ratios:
        s = np.where(live, ratio * amax, 1.0)  # (out,)
        q = np.clip(np.rint(a / s[:, None]), qmin, qmax)  # (out, in)
        err = ((a - s[:, None] * q) ** 2 * imp).sum(axis=1)  # (out,)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_scale = np.where(better, s, best_scale)
    codes = np.clip(np.rint(a / best_scale[:, None]), qmin, qmax).astype(np.int8)
    qw = QuantizedWeight("int", bits, codes, best_scale, None, None, 0.0)
    return QuantizedWeight("int", bits, codes, best_scale, None, None, _relative_error(a, qw.dequantize()))


def quantize_int_group(w: np.ndarray, bits: int, importance: np.ndarray | None = None) -> QuantizedWeight:
    """Symmetric integer codes whose step is row_scale * 2**shift, one shift (0..7) per group of 32 inputs.

    For each candidate row scale (8 per binade below the row's largest value at code qmax or at qmin, taken
    seven binades down) every group picks the shift with the least importance-weighted squared error, the
    groups being independent once the row scale is fixed; the row keeps the candidate whose groups sum to
    the least error (ties: the earlier candidate). A row of zeros gets scale 1, shifts 0.
    """
    a, bits, imp = _check_bits_and_importance(w, bits, importance)
    out, n_in = a.shape
    group = QuantizedWeight.BLOCK
    n_groups = -(-n_in // group)
    pad = n_groups * group - n_in
    blocks = np.pad(a, ((0, 0), (0, pad))).reshape(out, n_groups, group)
    imp_blocks = np.pad(imp, (0, pad)).reshape(n_groups, group)
    qmax, qmin = 2 ** (bits - 1) - 1, -(2 ** (bits - 1))
    amax = np.abs(a).max(axis=1)  # (out,)
    live = amax > 0
    n_shifts = 1 << GROUP_SHIFT_BITS
    best_err = np.full(out, np.inf)
    best_scale = np.ones(out)
    best_shift = np.zeros((out, n_groups), dtype=np.int64)
    # The row's largest value at code qmax (no clipping) or at qmin (the negative extreme in use), clipped by up to
    # one binade, then n_shifts - 1 binades finer: the largest group takes the top shift, a smaller one a smaller
    # shift. A coarser base would only add steps coarser than any group needs, so one binade of bases is all.
    for extreme, j in [(e, j) for e in (qmax, -qmin) for j in range(_GROUP_BASES_PER_BINADE)]:
        base = np.where(live, amax, 1.0) / extreme * 2.0 ** (-(n_shifts - 1) - j / _GROUP_BASES_PER_BINADE)  # (out,)
        errs = np.empty((n_shifts, out, n_groups))
        for k in range(n_shifts):
            step = (base * 2.0**k)[:, None, None]
            q = np.clip(np.rint(blocks / step), qmin, qmax)
            errs[k] = (((blocks - step * q) ** 2) * imp_blocks).sum(axis=2)
        shift = errs.argmin(axis=0)  # (out, n_groups): ties go to the smaller shift
        err = np.take_along_axis(errs, shift[None], axis=0)[0].sum(axis=1)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_scale = np.where(better, base, best_scale)
        best_shift = np.where(better[:, None], shift, best_shift)
    best_scale = np.where(live, best_scale, 1.0)
    best_shift = np.where(live[:, None], best_shift, 0)
    step = best_scale[:, None] * np.exp2(np.repeat(best_shift, group, axis=1)[:, :n_in])
    codes = np.clip(np.rint(a / step), qmin, qmax).astype(np.int8)
    qw = QuantizedWeight("int_group", bits, codes, best_scale, best_shift.astype(np.int16), None, 0.0)
    return dataclasses.replace(qw, error=_relative_error(a, qw.dequantize()))


def e2m1_encode(x: np.ndarray) -> np.ndarray:
    """Values already divided by the block scale -> 4-bit E2M1 codes (uint8: bit 3 sign, bits 2..0 index).

    Round to nearest, ties to the even magnitude index; above 6 saturates to ±6; anything that
    rounds to zero (including -0.0) encodes as +0.
    """
    x = np.asarray(x, dtype=np.float64)
    if np.any(np.isnan(x)):
        raise QuantizationError("e2m1_encode got NaN; E2M1 has no NaN encoding")
    mag = np.abs(x)
    idx = np.searchsorted(_E2M1_MIDS, mag, side="left")  # mids[idx-1] < mag <= mids[idx]
    tie = (idx < _E2M1_MIDS.size) & (mag == _E2M1_MIDS[np.minimum(idx, _E2M1_MIDS.size - 1)])
    idx = idx + (tie & (idx % 2 == 1))  # a tie between idx and idx+1 goes to the even one
    sign = (x < 0) & (idx > 0)
    return (idx + 8 * sign).astype(np.uint8)


def e2m1_decode(codes: np.ndarray) -> np.ndarray:
    """4-bit E2M1 codes -> float64 values (code 0b1000 is -0.0)."""
    c = np.asarray(codes)
    if not np.issubdtype(c.dtype, np.integer) or np.any(c < 0) or np.any(c > 15):
        raise QuantizationError("E2M1 codes must be integers in 0..15")
    c = c.astype(np.int64)
    return np.where(c & 8, -1.0, 1.0) * _E2M1[c & 7]


def _shared_exponents(amax: np.ndarray) -> np.ndarray:
    """floor(log2 amax) - 2 from the exponent bits, clamped to E8M0; -127 where amax == 0 (int64, same shape)."""
    _, e = np.frexp(amax)  # amax = m * 2**e, m in [0.5, 1): floor(log2 amax) = e - 1
    return np.where(amax == 0, _E8M0_MIN, np.clip(e.astype(np.int64) - 3, _E8M0_MIN, _E8M0_MAX))


def mx_shared_exponent(amax: float) -> int:
    """The OCP MX shared exponent of a block whose largest magnitude is amax: floor(log2 amax) - 2.

    Taken from frexp, not a float log2: log2 rounds 2**k * (1 - 2**-53) up to k, one binade too high.
    """
    a = float(amax)
    if not math.isfinite(a) or a < 0:
        raise QuantizationError(f"amax must be finite and >= 0, got {a!r}")
    if a == 0.0:
        return _E8M0_MIN
    _, e = math.frexp(a)
    return min(max(e - 3, _E8M0_MIN), _E8M0_MAX)


def quantize_mxfp4(w: np.ndarray, importance: np.ndarray | None = None) -> QuantizedWeight:
    """OCP MXFP4: blocks of 32 inputs share an E8M0 exponent, elements are E2M1 (the last block may be short).

    Without importance the exponent is the OCP recipe's, floor(log2 amax) - 2, which saturates a block whose
    largest value lies above 6 * 2**E. With importance (in,), each block also tries one binade up (no
    saturation, a coarser grid) and keeps the exponent with the smaller importance-weighted error (ties: the
    recipe's): both are valid MXFP4, the format leaves the choice of exponent to the encoder.
    """
    a = _check_weight(w)
    out, n_in = a.shape
    block = QuantizedWeight.BLOCK
    n_blocks = -(-n_in // block)
    padded = np.zeros((out, n_blocks * block))
    padded[:, :n_in] = a
    blocks = padded.reshape(out, n_blocks, block)  # (out, n_blocks, 32); padding zeros never raise amax
    exp = _shared_exponents(np.abs(blocks).max(axis=2))  # (out, n_blocks)
    if importance is not None:
        _, _, imp = _check_bits_and_importance(a, 4, importance)
        imp_blocks = np.pad(imp, (0, n_blocks * block - n_in)).reshape(n_blocks, block)

        def block_error(e: np.ndarray) -> np.ndarray:
            scaled = np.ldexp(blocks, -e[:, :, None])
            return ((np.ldexp(e2m1_decode(e2m1_encode(scaled)), e[:, :, None]) - blocks) ** 2 * imp_blocks).sum(axis=2)

        up = np.minimum(exp + 1, _E8M0_MAX)
        exp = np.where(block_error(up) < block_error(exp), up, exp)
    enc = e2m1_encode(np.ldexp(blocks, -exp[:, :, None]))  # exact division by 2**E
    codes = np.where(enc & 8, -1, 1).astype(np.int8) * _E2M1_X2[enc & 7]  # (out, n_blocks, 32), value × 2
    codes = codes.reshape(out, n_blocks * block)[:, :n_in].astype(np.int8)
    # The row reference is the smallest exponent of a non-zero block: an all-zero block's codes are 0 whatever
    # its shift, so it must not drag the reference down to -127 and force ~130-bit shifts into the datapath.
    nonzero = np.abs(blocks).max(axis=2) > 0  # (out, n_blocks)
    e_min = np.where(nonzero, exp, _E8M0_MAX).min(axis=1)  # (out,)
    e_min = np.where(nonzero.any(axis=1), e_min, 1)  # an all-zero row: row_scale 1.0, as for int codes
    row_scale = np.ldexp(1.0, e_min - 1)  # 2**(min E - 1); the -1 undoes the ×2 in the codes
    shift = np.where(nonzero, exp - e_min[:, None], 0).astype(np.int16)
    qw = QuantizedWeight("mxfp4", 4, codes, row_scale, shift, exp.astype(np.int16), 0.0)
    return QuantizedWeight("mxfp4", 4, codes, row_scale, shift, exp.astype(np.int16), _relative_error(a, qw.dequantize()))


def allocate_bits(
    sizes: dict[str, int], sensitivity: dict[str, float], avg_bits: float, low: int = 3, high: int = 6
) -> dict[str, int]:
    """The mixed 3/6 scheme: each tensor gets low or high bits, size-weighted average <= avg_bits.

    Tensors go to low in order of increasing sensitivity per parameter until the budget holds,
    then the most sensitive per parameter come back to high while the budget still holds.
    """
    if set(sizes) != set(sensitivity):
        only_sizes, only_sens = sorted(set(sizes) - set(sensitivity)), sorted(set(sensitivity) - set(sizes))
        raise QuantizationError(
            f"sizes and sensitivity must name the same tensors; only in sizes: {only_sizes}, only in sensitivity: {only_sens}"
        )
    if not low < high:
        raise QuantizationError(f"low width {low} must be below high width {high}")
    for name, n in sizes.items():
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n <= 0:
            raise QuantizationError(f"size of {name!r} must be a positive integer, got {n!r}")
        s = float(sensitivity[name])
        if not math.isfinite(s) or s < 0:
            raise QuantizationError(f"sensitivity of {name!r} must be finite and >= 0, got {s!r}")
    if not math.isfinite(avg_bits) or avg_bits < low:
        raise QuantizationError(f"avg_bits {avg_bits} is below the low width {low}; accepted: {low} <= avg_bits")
    bits = dict.fromkeys(sizes, high)
    if avg_bits >= high:
        return bits
    budget = Fraction(avg_bits) * sum(int(n) for n in sizes.values())  # exact: no float rounding at the boundary
    used = high * sum(int(n) for n in sizes.values())
    density = {name: float(sensitivity[name]) / int(sizes[name]) for name in sizes}
    for name in sorted(sizes, key=lambda k: (density[k], k)):
        if used <= budget:
            break
        bits[name] = low
        used -= (high - low) * int(sizes[name])
    for name in sorted((k for k in sizes if bits[k] == low), key=lambda k: (-density[k], k)):
        extra = (high - low) * int(sizes[name])
        if used + extra <= budget:
            bits[name] = high
            used += extra
    return bits

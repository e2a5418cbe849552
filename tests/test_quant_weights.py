"""Weight quantizers: E2M1 and MX exponents against the OCP spec, per-row int search, the 3/6-bit allocation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hardwire.quant.weights import (
    E2M1_VALUES,
    QuantizationError,
    QuantizedWeight,
    allocate_bits,
    e2m1_decode,
    e2m1_encode,
    mx_shared_exponent,
    quantize_int,
    quantize_int_group,
    quantize_mxfp4,
)

SPEC_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _raises(message: str, fn, *args, **kwargs) -> None:
    with pytest.raises(QuantizationError) as info:
        fn(*args, **kwargs)
    assert str(info.value) == message


# E2M1 elements


def test_e2m1_decode_all_codes():
    values = e2m1_decode(np.arange(16, dtype=np.uint8))
    assert values.dtype == np.float64
    assert values.tolist() == SPEC_VALUES + [-v for v in SPEC_VALUES]
    assert math.copysign(1.0, values[8]) == -1.0  # 0b1000 is -0.0, equal to 0.0 as a value
    assert values[8] == 0.0
    assert list(E2M1_VALUES) == SPEC_VALUES


def test_e2m1_encode_round_trip():
    codes = np.array([c for c in range(16) if c != 8], dtype=np.uint8)  # -0.0 encodes as +0, tested below
    values = e2m1_decode(codes)
    assert e2m1_encode(values).tolist() == codes.tolist()
    assert e2m1_encode(values).dtype == np.uint8


def test_e2m1_ties_to_even():
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    expected = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert e2m1_decode(e2m1_encode(np.array(ties))).tolist() == expected
    assert e2m1_decode(e2m1_encode(-np.array(ties))).tolist() == [-v if v else 0.0 for v in expected]
    assert e2m1_encode(np.array([-0.25]))[0] == 0  # rounds to zero: +0, never the -0 code


def test_e2m1_near_ties():
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    above = e2m1_decode(e2m1_encode(np.nextafter(ties, np.inf)))
    below = e2m1_decode(e2m1_encode(np.nextafter(ties, 0)))
    assert above.tolist() == [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert below.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]


def test_e2m1_saturates_and_negative_zero():
    assert e2m1_decode(e2m1_encode(np.array([7.0, 100.0, -9.0, np.inf]))).tolist() == [6.0, 6.0, -6.0, 6.0]
    assert e2m1_encode(np.array([-0.0, 0.0])).tolist() == [0, 0]


# MX shared exponent


def test_mx_shared_exponent_powers_of_two():
    assert mx_shared_exponent(4.0) == 0
    assert mx_shared_exponent(np.nextafter(4.0, 0)) == -1
    assert mx_shared_exponent(1.0) == -2
    assert mx_shared_exponent(6.0) == 0
    assert mx_shared_exponent(7.999) == 0
    assert mx_shared_exponent(8.0) == 1
    assert mx_shared_exponent(0.0) == -127


def test_mx_shared_exponent_clamps():
    assert mx_shared_exponent(2.0**-124) == -126
    assert mx_shared_exponent(2.0**-125) == -127
    assert mx_shared_exponent(1e-300) == -127
    assert mx_shared_exponent(5e-324) == -127  # smallest subnormal
    assert mx_shared_exponent(2.0**128) == 126
    assert mx_shared_exponent(2.0**129) == 127
    assert mx_shared_exponent(1e300) == 127


def test_mx_shared_exponent_where_float_log2_is_wrong():
    x = np.nextafter(2.0**30, 0)  # 2**30 * (1 - 2**-53)
    assert math.floor(np.log2(x)) - 2 == 28  # log2 rounds up into the next binade
    assert mx_shared_exponent(x) == 27
    for k in (-100, -3, 2, 64, 120):
        assert mx_shared_exponent(np.nextafter(2.0**k, 0)) == k - 3
        assert mx_shared_exponent(2.0**k) == k - 2


def test_mx_shared_exponent_refuses_bad_amax():
    _raises("amax must be finite and >= 0, got nan", mx_shared_exponent, float("nan"))
    _raises("amax must be finite and >= 0, got -1.0", mx_shared_exponent, -1.0)


# MXFP4 matrices


def test_mxfp4_block_at_power_of_two():
    row = np.zeros(32)
    row[:8] = [4.0, 1.0, 0.25, 0.75, -3.5, 5.0, -0.1, 2.9]  # amax 4 = 2**2: E = 0, elements unscaled
    q = quantize_mxfp4(row[None, :])
    assert q.scheme == "mxfp4" and q.bits == 4
    assert q.block_exponent.tolist() == [[0]]
    assert q.block_shift.tolist() == [[0]]
    assert q.row_scale.tolist() == [0.5]
    assert q.codes.dtype == np.int8
    assert q.codes[0, :8].tolist() == [8, 2, 0, 2, -8, 8, 0, 6]
    assert q.dequantize()[0, :8].tolist() == [4.0, 1.0, 0.0, 1.0, -4.0, 4.0, 0.0, 3.0]


def test_mxfp4_block_just_below_power_of_two():
    x = np.nextafter(4.0, 0)  # binade [2, 4): E = -1, so x / 2**E = 7.99.. saturates to 6
    row = np.zeros(32)
    row[:3] = [x, -1.0, 0.3]
    q = quantize_mxfp4(row[None, :])
    assert q.block_exponent.tolist() == [[-1]]
    assert q.codes[0, :3].tolist() == [12, -4, 1]
    assert q.dequantize()[0, :3].tolist() == [3.0, -1.0, 0.25]


def test_mxfp4_zero_block_and_short_last_block():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(3, 40))
    w[1, :32] = 0.0  # an all-zero first block
    w[2, 32:] *= 1000.0  # a short last block (8 elements) far above the first
    q = quantize_mxfp4(w)
    assert q.codes.shape == (3, 40)
    assert q.block_exponent.shape == q.block_shift.shape == (3, 2)
    assert q.block_exponent.dtype == q.block_shift.dtype == np.int16
    assert q.block_exponent[1, 0] == -127
    assert not q.codes[1, :32].any()
    amax = np.abs(w.reshape(3, 40)[:, :32]).max(axis=1), np.abs(w[:, 32:]).max(axis=1)
    for o in range(3):
        for b in range(2):
            expected = -127 if amax[b][o] == 0 else mx_shared_exponent(amax[b][o])
            assert q.block_exponent[o, b] == expected
    # the row reference ignores the all-zero block (its shift is 0), so shifts stay small
    nonzero = np.array([[amax[b][o] > 0 for b in range(2)] for o in range(3)])
    e_min = np.where(nonzero, q.block_exponent, 127).min(axis=1)
    assert q.block_shift[1, 0] == 0 and e_min[1] == q.block_exponent[1, 1]
    assert (q.block_shift == np.where(nonzero, q.block_exponent - e_min[:, None], 0)).all()
    assert (q.block_shift >= 0).all() and q.block_shift.max() < 16
    assert q.row_scale.tolist() == [2.0 ** (int(e) - 1) for e in e_min]
    assert q.code_bits == 3 * 40 * 4
    assert q.scale_bits == 3 * 21 + 6 * 5  # a 15-bit multiplier and a 6-bit shift per row, a 5-bit shift per block


def test_mxfp4_dequantize_exact():
    rng = np.random.default_rng(1)
    w = rng.normal(size=(5, 70)) * np.exp(rng.normal(size=(5, 1)) * 4)
    q = quantize_mxfp4(w)
    assert set(np.unique(q.codes).tolist()) <= {0, 1, 2, 3, 4, 6, 8, 12, -1, -2, -3, -4, -6, -8, -12}
    exact = np.empty_like(w)
    for o in range(5):
        for b in range(3):
            cols = slice(32 * b, min(32 * b + 32, 70))
            e = int(q.block_exponent[o, b])
            exact[o, cols] = e2m1_decode(e2m1_encode(w[o, cols] / 2.0**e)) * 2.0**e
    assert (q.dequantize() == exact).all()
    assert q.error == np.linalg.norm(w - exact) / np.linalg.norm(w)
    assert 0 < q.error < 0.2


def test_mxfp4_importance_chooses_between_the_recipe_and_one_binade_up():
    """A block whose maximum saturates at 6 * 2**E keeps the recipe's exponent when the column that saturates does not
    matter, and goes one binade up when it does; both are valid MXFP4 (same codes set, E8M0 exponents)."""
    w = np.zeros((1, 32))
    w[0, 0] = 7.9  # E = floor(log2 7.9) - 2 = 0: 7.9 saturates to 6 (error 1.9), one binade up codes it as 8
    w[0, 1:] = np.linspace(0.3, 1.2, 31)  # fine values: at E = 1 the grid step near them doubles
    recipe = quantize_mxfp4(w)
    assert recipe.block_exponent.tolist() == [[0]]
    low = np.ones(32)
    low[0] = 1e-6
    assert quantize_mxfp4(w, low).block_exponent.tolist() == [[0]]
    high = np.ones(32)
    high[0] = 1e3
    chosen = quantize_mxfp4(w, high)
    assert chosen.block_exponent.tolist() == [[1]]
    assert set(np.abs(chosen.codes).ravel().tolist()) <= {0, 1, 2, 3, 4, 6, 8, 12}
    assert chosen.dequantize()[0, 0] == 8.0
    weighted = [float(((w - q.dequantize()) ** 2 * high).sum()) for q in (recipe, chosen)]
    assert weighted[1] < weighted[0]


def test_mxfp4_all_zero_matrix():
    q = quantize_mxfp4(np.zeros((2, 32)))
    assert q.error == 0.0
    assert not q.codes.any()
    assert q.block_exponent.tolist() == [[-127], [-127]]
    assert q.dequantize().tolist() == np.zeros((2, 32)).tolist()


@pytest.mark.parametrize("fn", [quantize_mxfp4, lambda w: quantize_int(w, 4), lambda w: quantize_int_group(w, 4)])
def test_non_finite_refused(fn):
    w = np.ones((3, 40))
    w[1, 7] = np.nan
    w[2, 0] = np.inf
    _raises("weight tensor has a non-finite value (nan) at row 1, column 7; quantisation needs finite weights", fn, w)
    w[1, 7] = 0.0
    _raises("weight tensor has a non-finite value (inf) at row 2, column 0; quantisation needs finite weights", fn, w)
    w[0, 39] = -np.inf
    _raises("weight tensor has a non-finite value (-inf) at row 0, column 39; quantisation needs finite weights", fn, w)


def test_bad_shape_refused():
    _raises("weight tensor must be a 2-D (out, in) real array, got shape (4,) of dtype float64", quantize_mxfp4, np.ones(4))
    _raises(
        "weight tensor is empty (shape (0, 4)); quantisation needs at least one row and column", quantize_int, np.ones((0, 4)), 4
    )


# per-row integer codes


@pytest.mark.parametrize("bits", [3, 4, 6, 8])
def test_int_codes_in_range(bits):
    w = np.random.default_rng(bits).normal(size=(16, 48))
    q = quantize_int(w, bits)
    assert q.scheme == "int" and q.bits == bits
    assert q.codes.dtype == np.int8 and q.codes.shape == (16, 48)
    assert q.codes.min() >= -(2 ** (bits - 1)) and q.codes.max() <= 2 ** (bits - 1) - 1
    assert q.block_shift is None and q.block_exponent is None
    assert q.row_scale.dtype == np.float64 and q.row_scale.shape == (16,)
    assert (q.dequantize() == q.codes * q.row_scale[:, None]).all()
    assert q.code_bits == 16 * 48 * bits
    assert q.scale_bits == 16 * 21


def test_int_error_decreases_with_bits():
    w = np.random.default_rng(7).normal(size=(32, 64))
    errors = [quantize_int(w, b).error for b in (2, 3, 4, 6, 8)]
    assert errors == sorted(errors, reverse=True)
    assert len(set(errors)) == 5
    assert errors[-1] < 0.01


def test_int_exact_with_negative_extreme():
    q = quantize_int(np.array([[-4.0, -2.0, 0.0, 3.0]]), 3)  # scale amax / 2**(bits-1) = 1 represents it exactly
    assert q.codes.tolist() == [[-4, -2, 0, 3]]
    assert q.row_scale.tolist() == [1.0]
    assert q.error == 0.0


def test_int_importance_reduces_weighted_error():
    rng = np.random.default_rng(3)
    w = rng.normal(size=(24, 64))
    importance = np.exp(rng.normal(size=64) * 2)  # a few columns carry most of the activation energy

    def weighted(q: QuantizedWeight) -> float:
        return float(((w - q.dequantize()) ** 2 * importance).sum())

    with_imp, uniform = quantize_int(w, 3, importance), quantize_int(w, 3)
    assert weighted(with_imp) < weighted(uniform)
    assert with_imp.error >= uniform.error  # the unweighted error is what the uniform search minimises


def test_int_all_zero_row():
    w = np.array([[0.0, 0.0, 0.0], [1.0, -0.5, 0.25]])
    q = quantize_int(w, 4)
    assert q.row_scale[0] == 1.0
    assert q.codes[0].tolist() == [0, 0, 0]
    assert quantize_int(np.zeros((2, 3)), 4).error == 0.0


def test_int_bad_bits_and_importance():
    w = np.ones((2, 3))
    _raises("bits must be between 2 and 8, got 9", quantize_int, w, 9)
    _raises("bits must be between 2 and 8, got 1", quantize_int, w, 1)
    _raises("bits must be between 2 and 8, got 4.0", quantize_int, w, 4.0)
    _raises(
        "importance must be 3 finite non-negative values (one per input column), got shape (2,)", quantize_int, w, 4, np.ones(2)
    )
    _raises(
        "importance must be 3 finite non-negative values (one per input column), got -1.0 at column 1",
        quantize_int,
        w,
        4,
        np.array([1.0, -1.0, 1.0]),
    )
    _raises(
        "importance must be 3 finite non-negative values (one per input column), got nan at column 2",
        quantize_int,
        w,
        4,
        np.array([1.0, 1.0, np.nan]),
    )


# integer codes with a power-of-two exponent per group of 32 inputs


def _group_weights(rows: int, cols: int, seed: int) -> np.ndarray:
    """Gaussian rows whose groups of 32 differ in scale by up to 2**6, as outlier input blocks do."""
    rng = np.random.default_rng(seed)
    scale = np.ldexp(1.0, rng.integers(0, 7, size=(rows, -(-cols // 32))))
    return rng.normal(size=(rows, cols)) * np.repeat(scale, 32, axis=1)[:, :cols]


@pytest.mark.parametrize("bits", [3, 4, 6])
def test_int_group_codes_shifts_and_dequantize(bits):
    w = _group_weights(12, 80, bits)  # a short last group of 16
    q = quantize_int_group(w, bits)
    assert q.scheme == "int_group" and q.bits == bits and q.block_exponent is None
    assert q.codes.min() >= -(2 ** (bits - 1)) and q.codes.max() <= 2 ** (bits - 1) - 1
    assert q.block_shift.shape == (12, 3) and q.block_shift.min() >= 0 and q.block_shift.max() <= 7
    assert q.block_shift.max() > 0  # the groups' scales are used
    step = q.row_scale[:, None] * 2.0 ** np.repeat(q.block_shift.astype(np.int64), 32, axis=1)[:, :80]
    assert np.array_equal(q.dequantize(), q.codes * step)
    assert q.scale_bits == 12 * 21 + 12 * 3 * 3  # the row rescale, then 3 bits per group
    assert q.error < quantize_int(w, bits).error  # one scale per row cannot follow the groups


def test_int_group_each_shift_is_the_best_for_its_group():
    """Once the row scale is fixed the groups are independent: no group's error drops with a neighbouring shift."""
    w = _group_weights(6, 96, 11)
    importance = np.exp(np.random.default_rng(12).normal(size=96))
    q = quantize_int_group(w, 3, importance)
    for r in range(6):
        for g in range(3):
            cols = slice(32 * g, 32 * g + 32)

            def group_error(shift: int, r: int = r, cols: slice = cols) -> float:
                step = q.row_scale[r] * 2.0**shift
                codes = np.clip(np.rint(w[r, cols] / step), -4, 3)
                return float(((w[r, cols] - step * codes) ** 2 * importance[cols]).sum())

            chosen = int(q.block_shift[r, g])
            assert all(group_error(chosen) <= group_error(k) for k in range(8))
            assert np.array_equal(q.codes[r, cols], np.clip(np.rint(w[r, cols] / (q.row_scale[r] * 2.0**chosen)), -4, 3))


def test_int_group_zero_row_and_exact_grid():
    w = np.zeros((2, 40))
    w[1, :32] = [3.0, -4.0] * 16  # exactly int3 codes at scale 1
    w[1, 32:] = [24.0, -32.0, 0.0, 8.0] * 2  # the same codes at scale 2**3
    q = quantize_int_group(w, 3)
    assert q.row_scale[0] == 1.0 and not q.codes[0].any() and q.block_shift[0].tolist() == [0, 0]
    assert q.error == 0.0
    assert q.block_shift[1, 1] - q.block_shift[1, 0] == 3


# the mixed 3/6-bit allocation


def _average(bits: dict[str, int], sizes: dict[str, int]) -> float:
    return sum(bits[k] * sizes[k] for k in sizes) / sum(sizes.values())


def test_allocate_within_budget():
    rng = np.random.default_rng(5)
    sizes = {f"t{i}": int(n) for i, n in enumerate(rng.integers(10, 1000, size=12))}
    sensitivity = {k: float(s) for k, s in zip(sizes, rng.random(12), strict=True)}
    for avg in (3.0, 3.3, 4.0, 4.5, 5.0, 5.9):
        bits = allocate_bits(sizes, sensitivity, avg)
        assert set(bits.values()) <= {3, 6}
        assert _average(bits, sizes) <= avg
    assert set(allocate_bits(sizes, sensitivity, 3.0).values()) == {3}


def test_allocate_least_sensitive_per_parameter_go_low():
    sizes = {"a": 100, "b": 100, "c": 100, "d": 100}
    sensitivity = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}
    assert allocate_bits(sizes, sensitivity, 4.5) == {"a": 3, "b": 3, "c": 6, "d": 6}  # exactly on the budget
    assert allocate_bits(sizes, sensitivity, 5.25) == {"a": 3, "b": 6, "c": 6, "d": 6}
    # per parameter: a large tensor with a larger total sensitivity can still be the cheapest to cut
    assert allocate_bits({"big": 1000, "small": 10}, {"big": 5.0, "small": 1.0}, 5.0) == {"big": 3, "small": 6}
    # ties in sensitivity per parameter go by name
    assert allocate_bits({"y": 10, "x": 10}, {"y": 1.0, "x": 1.0}, 4.5) == {"y": 6, "x": 3}


def test_allocate_moves_back_to_high():
    sizes = {"small": 100, "big": 300, "x": 600}
    sensitivity = {"small": 0.1, "big": 0.6, "x": 6.0}  # per parameter 0.001, 0.002, 0.01
    # small then big must go low to fit 5.4; small then fits back at high
    assert allocate_bits(sizes, sensitivity, 5.4) == {"small": 6, "big": 3, "x": 6}


def test_allocate_all_high():
    sizes, sensitivity = {"a": 10, "b": 20}, {"a": 0.0, "b": 1.0}
    assert allocate_bits(sizes, sensitivity, 6) == {"a": 6, "b": 6}
    assert allocate_bits(sizes, sensitivity, 8.0) == {"a": 6, "b": 6}


def test_allocate_errors():
    _raises("avg_bits 2.5 is below the low width 3; accepted: 3 <= avg_bits", allocate_bits, {"a": 1}, {"a": 1.0}, 2.5)
    _raises(
        "sizes and sensitivity must name the same tensors; only in sizes: ['b'], only in sensitivity: ['c']",
        allocate_bits,
        {"a": 1, "b": 2},
        {"a": 1.0, "c": 1.0},
        4.0,
    )

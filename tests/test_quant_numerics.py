"""The integer primitives and tables, on edge values, compared with exact expectations."""

from __future__ import annotations

import math

import pytest
import torch

from hardwire.quant import blocks
from hardwire.quant.fixedpoint import WidthError, check_width, multiplier, rescale, round_shift, saturate
from hardwire.quant.tables import exp_table, gelu_table, rope_tables, rsqrt_table, silu_table

T = torch.tensor


def test_round_shift_rounds_half_up_on_both_signs():
    x = T([5, 6, 7, -5, -6, -7, 4, -4, 0])  # /4: 1.25 1.5 1.75 -1.25 -1.5 -1.75 1 -1 0
    assert round_shift(x, 2).tolist() == [1, 2, 2, -1, -1, -2, 1, -1, 0]


def test_round_shift_per_element_shifts():
    assert round_shift(T([3, 3, 3]), T([1, 2, 3])).tolist() == [2, 1, 0]


def test_rescale_saturates_at_both_ends():
    x = T([1000, -1000, 254, -255, 253])
    assert rescale(x, 1, 1, 8).tolist() == [127, -128, 127, -127, 127]  # 253/2 = 126.5 -> 127
    assert rescale(T([-257]), 1, 1, 8).tolist() == [-128]
    assert rescale(T([1 << 40]), 3, 2, None).tolist() == [3 << 38]  # unsaturated


def test_saturate_edges():
    assert saturate(T([127, 128, -128, -129]), 8).tolist() == [127, 127, -128, -128]


def test_multiplier_is_normalised_and_accurate():
    for scale in (1.0, 0.5, 0.123456, 3e-7, 0.999999, 1.5e-3):
        mult, shift = multiplier(scale)
        assert 1 << 14 <= mult < 1 << 15 and shift >= 1
        assert abs(mult / 2**shift - scale) <= scale * 2**-15
    assert multiplier(1.0) == (1 << 14, 14)
    with pytest.raises(ValueError, match=r"scale must be positive and finite, got 0\.0"):
        multiplier(0.0)
    with pytest.raises(ValueError, match=r"scale 1000000\.0 is too large"):
        multiplier(1e6)


def test_check_width_names_the_site_and_value():
    check_width(T([127, -128]), 8, "x")
    with pytest.raises(WidthError, match=r"^layer0.q accumulator: value 128 does not fit its declared int8 \[-128, 127\]$"):
        check_width(T([5, 128]), 8, "layer0.q accumulator")


def test_exp_table():
    table = exp_table()
    assert table.shape == (256,) and table[0] == 1 << 15
    assert table[16] == math.floor(2**15 * math.exp(-1) + 0.5) == 12055
    assert table[255] == 0 and bool((table[1:] <= table[:-1]).all())


def test_rsqrt_table():
    table = rsqrt_table()
    assert table.shape == (1024,)
    assert table[1] == 1 << 23 and table[4] == 1 << 22 and table[256] == 1 << 19
    assert table[1023] == math.floor(2**23 / math.sqrt(1023) + 0.5)


def test_activation_tables():
    s = 0.05
    silu = silu_table(s)
    for c in (-128, -20, -1, 0, 1, 50, 127):
        expected = max(-255, min(255, math.floor(c * s / (1 + math.exp(-c * s)) / (s / 2) + 0.5)))
        assert silu[c + 128] == expected
    assert silu[127 + 128] == 254 and int(silu.min()) == -11  # silu(6.35) = 6.34; silu >= -0.278 = -11.1 half-steps
    for step in (0.0005, 0.01, 0.05, 0.3):  # never saturates: silu(x) / x is in (0, 1/2) below 0, (1/2, 1) above
        assert int(silu_table(step).min()) > -128 and int(silu_table(step).max()) <= 254
    gelu = gelu_table(0.05, 0.04, approximate=False)
    assert gelu[128] == 0 and gelu[127 + 128] == 127  # gelu(6.35) / 0.04 = 159: saturates
    assert gelu[20 + 128] == math.floor(0.5 * 1.0 * (1 + math.erf(1.0 / math.sqrt(2))) / 0.04 + 0.5)
    tanh_form = gelu_table(0.05, 0.04, approximate=True)
    assert int((tanh_form - gelu).abs().max()) <= 1


def test_rope_tables():
    cos, sin = rope_tables(8, 10000.0, 5)
    assert cos.shape == sin.shape == (5, 4)
    assert cos[0].tolist() == [1 << 14] * 4 and sin[0].tolist() == [0] * 4
    assert cos[3, 1] == math.floor(math.cos(3 * 10000 ** (-2 / 8)) * 2**14 + 0.5)


def test_norm_matches_float_rmsnorm_to_int8_precision():
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(-20000, 20000, (16, 64), generator=gen)
    s_out = 4 / 127  # int8 step for a unit-RMS output clipped at 4
    mult, shift = multiplier(math.sqrt(64) / (2**15 * s_out))
    got = blocks.norm(x, "rms", 1, mult, shift, rsqrt_table(), "n")
    expected = (x.double() / x.double().pow(2).mean(-1, keepdim=True).sqrt() / s_out).round().clamp(-128, 127)
    assert int((got - expected).abs().max()) <= 1


def test_norm_layer_centres_exactly():
    x = torch.full((1, 32), 1234)  # constant row: LayerNorm output is all zeros
    assert blocks.norm(x, "layer", 1, 1 << 14, 10, rsqrt_table(), "n").tolist() == [[0] * 32]


def test_attention_all_equal_scores_average_v():
    exp = exp_table()
    q = torch.zeros(1, 1, 1, 4, dtype=torch.int64)
    k = torch.randint(-100, 100, (1, 3, 1, 4))
    v = torch.tensor([[[[30, 0, -60, 90]], [[0, 30, 60, 0]], [[60, 30, 0, 30]]]])
    valid = torch.ones(1, 3, dtype=torch.bool)
    out = blocks.attention(q, k, v, valid, 1 << 14, 15, 1 << 14, 29, exp, "a")  # out = sum p*v / 2**15
    # e = 2**15 each, r = floor(2**30 / 3*2**15) = 10922, p = 10922; sum p*v = 10922 * (90, 60, 0, 120)
    assert out.tolist() == [[[[30, 20, 0, 40]]]]


def test_attention_one_dominant_score_selects_its_value():
    exp = exp_table()
    q = torch.tensor([[[[100, 0]]]])
    k = torch.tensor([[[[-100, 0]], [[100, 0]], [[0, 0]]]])
    v = torch.tensor([[[[-7, 1]], [[55, -3]], [[9, 9]]]])
    out = blocks.attention(q, k, v, torch.ones(1, 3, dtype=torch.bool), 1 << 14, 1, 1 << 14, 29, exp, "a")
    assert out.tolist() == [[[[55, -3]]]]  # every other score is >= 255 table steps below: e = 0


def test_attention_masks_future_positions():
    exp = exp_table()
    v = torch.tensor([[[[10]], [[100]]]])
    k = torch.zeros(1, 2, 1, 1, dtype=torch.int64)
    q = torch.zeros(1, 2, 1, 1, dtype=torch.int64)
    valid = torch.tensor([[True, False], [True, True]])
    out = blocks.attention(q, k, v, valid, 1 << 14, 15, 1 << 14, 29, exp, "a")
    assert out[0, :, 0, 0].tolist() == [10, 55]


def test_argmax_ties_go_to_lowest_id():
    assert blocks.argmax(T([[3, 9, 9, 1], [5, 5, 5, 5], [-1, -2, -1, -3]])).tolist() == [1, 0, 0]


def test_rope_rotates_pairs():
    cos, sin = rope_tables(4, 10000.0, 2)
    x = torch.tensor([[[100, 50, -20, 10]]])  # (p=1, heads=1, hd=4)
    out = blocks.rope(x, cos[1:2], sin[1:2])
    c, s = cos[1].tolist(), sin[1].tolist()
    first = [math.floor((100 * c[0] - (-20) * s[0]) / 2**14 + 0.5), math.floor((50 * c[1] - 10 * s[1]) / 2**14 + 0.5)]
    second = [math.floor((-20 * c[0] + 100 * s[0]) / 2**14 + 0.5), math.floor((10 * c[1] + 50 * s[1]) / 2**14 + 0.5)]
    assert out.tolist() == [[first + second]]

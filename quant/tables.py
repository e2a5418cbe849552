"""Lookup tables: the decoder's non-linear functions as constants (docs/numerics.md §3).

Tables are computed once at compile time (floats allowed here) and are then exact in
both executions by construction: the reference indexes them, the RTL holds them in ROM.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

EXP_BITS = 15  # exp table output: Q15, EXP[0] = 2**15
EXP_STEP = 1 / 16  # nats per softmax table index; EXP rounds to 0 from index 178 (11.1 nats below the max)
RSQRT_INDEX_BITS = 10  # rsqrt table index: the top 10 bits of the sum of squares (even shift)
RSQRT_BITS = 23  # RSQRT[m] = round(2**23 / sqrt(m))
ROPE_BITS = 14  # cos/sin in Q14
NORM_OUT_FRAC = 4  # every norm writes int12, 16x finer than its calibrated int8 step (the MAC lanes take 17 bits)
ROPE_IN_FRAC = 4  # q and k reach RoPE with 4 more fraction bits (int12), rounded to int8 once, after it
PROB_BITS = 15  # softmax probabilities in Q15
RECIP_BITS = 30  # softmax reciprocal: floor(2**30 / sum)
SILU_OUT_BITS = 9  # SILU table output: +-255, symmetric, so that SILU * int8 fits int16


CAP_UNITS_MAX = 1024  # attention soft-cap: at most this many table units per cap (the table then has ~4,300 entries)


def cap_units(cap: float) -> int:
    """K: the soft-capped scores' units per cap, c / K nats each: EXP_STEP / 4 (a quarter of the softmax's own step)
    where the table stays small, else c / CAP_UNITS_MAX (Gemma 2's cap of 50: 0.049 nats, 0.78 EXP_STEP)."""
    return min(CAP_UNITS_MAX, max(1, _round(4 * cap / EXP_STEP)))


def tanh_cap_table(units: int) -> torch.Tensor:
    """TANH[i] = round(K tanh(i / K)) for i = 0 .. N, N the first index where it reaches K (K = units): the soft-cap
    K tanh(t / K) of a non-negative score t in units of c / K, odd, and K from N on (numerics §6)."""
    values = []
    while not values or values[-1] < units:
        values.append(_round(units * math.tanh(len(values) / units)))
    return torch.tensor(values, dtype=torch.int64)


def _round(x: float) -> int:
    """Round half up: the same rule as the datapath, for reproducible tables."""
    return math.floor(x + 0.5)


def exp_table() -> torch.Tensor:
    """EXP[z] = round(2**15 * exp(-z * EXP_STEP)), z in 0..255 (int64)."""
    return torch.tensor([_round((1 << EXP_BITS) * math.exp(-z * EXP_STEP)) for z in range(256)], dtype=torch.int64)


def rsqrt_table() -> torch.Tensor:
    """RSQRT[m] = round(2**23 / sqrt(m)) for m in 1..1023; RSQRT[0] is never read (sums are >= 1)."""
    return torch.tensor([0] + [_round((1 << RSQRT_BITS) / math.sqrt(m)) for m in range(1, 1 << RSQRT_INDEX_BITS)],
                        dtype=torch.int64)


def _int8(x: float) -> int:
    return max(-128, min(127, _round(x)))


def silu_table(in_scale: float, activation: str = "silu_glu") -> torch.Tensor:
    """SILU[c + 128] = sat(round(silu(c * s) / (s / 2)), +-255): int8 in, 9 bits out at half the input's step.

    activation "gelu_tanh_glu" (GeGLU, Gemma) fills the same table with GELU-tanh: the same bounds hold
    (gelu(x) <= x above 0, gelu(x) / x = Phi(x) < 1/2 below), so the gated unit is the same.

    The output half-step is where the int8 gate lost most (the error budget, docs/numerics.md §14):
    silu's negative lobe (>= -0.28) got a handful of codes. 9 bits still fit the product:
    |SILU * up| <= 255 * 128 < 2**15. The clamp is never reached: silu(x) <= x above 0 (<= 254 half-steps) and
    silu(x) / x < 1/2 below (> -128).
    """
    def silu(x: float) -> float:  # x * sigmoid(x), without overflowing exp for large |x|
        return x / (1 + math.exp(-x)) if x >= 0 else x * math.exp(x) / (1 + math.exp(x))

    act = {"silu_glu": silu, "gelu_tanh_glu": _gelu_tanh}[activation]
    top = 2 ** (SILU_OUT_BITS - 1) - 1
    return torch.tensor([max(-top, min(top, _round(act(c * in_scale) / (in_scale / 2)))) for c in range(-128, 128)],
                        dtype=torch.int64)


def _gelu_tanh(x: float) -> float:
    return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def gelu_table(in_scale: float, out_scale: float, approximate: bool | str) -> torch.Tensor:
    """GELU[c + 128] = round(gelu(c * s_in) / s_out), exact (erf) or tanh form; approximate="relu" makes the
    same 256-entry table of ReLU (OPT), which the chip's table lookup uses unchanged."""
    def gelu(x: float) -> float:
        if approximate == "relu":
            return max(x, 0.0)
        if approximate:
            return _gelu_tanh(x)
        return 0.5 * x * (1 + math.erf(x / math.sqrt(2)))

    return torch.tensor([_int8(gelu(c * in_scale) / out_scale) for c in range(-128, 128)], dtype=torch.int64)


def rope_tables(head_dim: int, theta: float, positions: int, rotary_dims: int | None = None,
                inv_freq: Sequence[float] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin in Q14, shape (positions, head_dim // 2): angle(p, i) = p * f_i for the rotary_dims // 2 rotated
    pairs (all of them by default), f_i = inv_freq[i] where given (a schedule read from the graph: Llama 3, linear,
    YaRN scaling; `ModelConfig.rope_freqs`) or theta**(-2i / rotary_dims); a pair past them is passed through
    (cos 1, sin 0: partial rotary, quant/partial_rotary.py). The one source of the chip's tables: the reference
    indexes them, the RTL holds them in ROM."""
    half, rd = head_dim // 2, rotary_dims or head_dim
    freqs = [float(f) for f in inv_freq] if inv_freq is not None else [theta ** (-2 * i / rd) for i in range(rd // 2)]
    if len(freqs) != rd // 2:
        raise ValueError(f"{len(freqs)} RoPE frequencies for {rd // 2} rotated pairs")

    def entry(fn, p: int, i: int) -> int:
        return _round(fn(p * freqs[i]) * (1 << ROPE_BITS)) if i < rd // 2 else (1 << ROPE_BITS if fn is math.cos else 0)

    cos = [[entry(math.cos, p, i) for i in range(half)] for p in range(positions)]
    sin = [[entry(math.sin, p, i) for i in range(half)] for p in range(positions)]
    return torch.tensor(cos, dtype=torch.int64).reshape(positions, half), \
        torch.tensor(sin, dtype=torch.int64).reshape(positions, half)

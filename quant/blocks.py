"""The integer blocks of the decoder, one reference function each (docs/numerics.md §2-§8).

These functions are the definition the RTL is tested against, block by block. They take
plain int64 tensors with a leading batch of positions, so the reference decoder can run
one position (incremental decoding) or a whole prefix (teacher forcing) through the very
same code. Every intermediate is checked against its declared width.
"""

from __future__ import annotations

import torch

from .fixedpoint import check_width, rescale, round_shift, saturate
from .tables import PROB_BITS, RECIP_BITS, ROPE_BITS, RSQRT_INDEX_BITS

ACC_BITS = 32  # default accumulator width of matrix-vector products
SCORE_BITS = 32  # q·k scores
NORM_SUM_BITS = 63  # sum of squares inside a norm
PRE_SATURATION_BITS = 48  # a projection's rescaled output plus its LoRA term, before saturation
_BIT_POSITIONS = torch.arange(63, dtype=torch.int64)


def matvec(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, acc_bits: int, what: str) -> torch.Tensor:
    """acc = a @ weight.T + bias: int8 activations (..., in), integer weights (out, in) -> (..., out)."""
    acc = a @ weight.T
    if bias is not None:
        acc = acc + bias
    return check_width(acc, acc_bits, f"{what} accumulator")


def bit_length(x: torch.Tensor) -> torch.Tensor:
    """Number of significant bits of non-negative integers (a priority encoder in hardware)."""
    return ((x.unsqueeze(-1) >> _BIT_POSITIONS) != 0).sum(-1)


def norm(x: torch.Tensor, kind: str, eps_q: int, mult: int, shift: int, rsqrt: torch.Tensor, what: str,
         out_bits: int = 8) -> torch.Tensor:
    """RMSNorm or LayerNorm of the int16 residual (..., d) to `out_bits` (12 in a compiled model, 8 in one
    saved before QNorm.out_bits; gain folded into the next weights).

    u = x (rms) or d*x - sum(x) (layer); ss = sum(u^2) + eps_q; the top 10 bits of ss (at an even
    shift e, so 9 or 10 bits) index RSQRT; t = u * RSQRT[m] >> (e/2 + 8) is u / sqrt(ss) in Q15; then one rescale.
    """
    d = x.shape[-1]
    u = x if kind == "rms" else d * x - x.sum(-1, keepdim=True)
    ss = check_width((u * u).sum(-1) + eps_q, NORM_SUM_BITS, f"{what} sum of squares")
    e = (bit_length(ss) - RSQRT_INDEX_BITS).clamp(min=0)
    e = e + (e & 1)
    r = rsqrt[ss >> e]
    t = check_width(round_shift(u * r.unsqueeze(-1), (e // 2 + 8).unsqueeze(-1)), 17, f"{what} normalised")
    return rescale(t, mult, shift, out_bits)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, frac: int = 0) -> torch.Tensor:
    """Rotate-half RoPE on heads (..., heads, head_dim) with Q14 tables (..., head_dim / 2), to int8.

    x carries `frac` more fraction bits than the int8 result (int12 with frac 4 from the q/k projections):
    the rotation's own rounding is then the only one that lands on the int8 grid.
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)  # broadcast over heads
    y1 = round_shift(x1 * c - x2 * s, ROPE_BITS + frac)
    y2 = round_shift(x2 * c + x1 * s, ROPE_BITS + frac)
    return saturate(torch.cat((y1, y2), dim=-1), 8)


def softmax(scores: torch.Tensor, valid: torch.Tensor, sm_mult: int, sm_shift: int, exp: torch.Tensor,
            what: str) -> torch.Tensor:
    """Integer softmax over the last axis: int32 scores -> Q15 probabilities (docs/numerics.md §6).

    z = min(255, rescale(max - score)); e = EXP[z] (0 where not valid); r = floor(2^30 / sum e);
    p = round_shift(e * r, 15).
    """
    floor = torch.iinfo(torch.int64).min
    best = scores.masked_fill(~valid, floor).amax(-1, keepdim=True)
    delta = (best - scores).masked_fill(~valid, 0)  # >= 0 where valid
    z = rescale(delta, sm_mult, sm_shift, None).clamp(max=255)
    e = exp[z].masked_fill(~valid, 0)
    total = check_width(e.sum(-1, keepdim=True), 32, f"{what} exp sum")
    recip = torch.div(1 << RECIP_BITS, total, rounding_mode="floor")
    return round_shift(e * recip, RECIP_BITS - PROB_BITS)


def alibi_bias(slopes: torch.Tensor, keys: int) -> torch.Tensor:
    """ALiBi in score units (docs/numerics.md §6): slopes[h] * t for the key at position t, (H, 1, keys). The key's
    position, not its distance from the query: the softmax subtracts the row's maximum, so the two give the same
    integers, and this one needs no query position on the chip."""
    return slopes[:, None, None] * torch.arange(keys, dtype=torch.int64)


def soft_cap(scores: torch.Tensor, mult: int, shift: int, table: torch.Tensor) -> torch.Tensor:
    """The attention soft-cap in the scores' integer domain (numerics §6): t = rescale(score, mult, shift) to int32
    (units of c / K), then sign(t) * TANH[min(|t|, N)], N = len(TANH) - 1 (TANH[N] = K): c tanh(s / c) in units of
    c / K, an odd table read at |t|."""
    t = rescale(scores, mult, shift, 32)
    capped = table[t.abs().clamp(max=table.numel() - 1)]
    return torch.where(t < 0, -capped, capped)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor, sm_mult: int, sm_shift: int,
              out_mult: int, out_shift: int, exp: torch.Tensor, what: str,
              bias: torch.Tensor | None = None, cap: tuple[int, int, torch.Tensor] | None = None) -> torch.Tensor:
    """Integer softmax attention.

    q (B, P, H, hd), k and v (B, T, Hkv, hd) int8; valid (P, T) bool says which cached positions
    each query sees; bias (H, 1 or P, T) integers added to the scores (ALiBi) or None. Per head: scores = q·k
    (+ bias; int32); p = softmax(scores) in Q15; out = rescale(sum p*v, out_mult, out_shift) to int8: the weighted
    mean of v is smaller than v, so it gets its own, finer step. With CAP (mult, shift, table: Gemma 2's attention
    soft-cap) the softmax reads soft_cap(scores). -> (B, P, H, hd) int8.
    """
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)  # head h reads kv head h // group
    v = v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bphd,bthd->bhpt", q, k)
    if bias is not None:
        scores = scores + bias
    scores = check_width(scores, SCORE_BITS, f"{what} scores")
    if cap is not None:
        scores = soft_cap(scores, *cap)
    p = softmax(scores, valid, sm_mult, sm_shift, exp, what)
    y = check_width(torch.einsum("bhpt,bthd->bphd", p, v), 32, f"{what} weighted sum")
    return rescale(y, out_mult, out_shift, 8)


def lookup(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """A 256-entry table indexed by an int8 value."""
    return table[x + 128]


def glu(gate: torch.Tensor, up: torch.Tensor, silu: torch.Tensor) -> torch.Tensor:
    """SwiGLU: SILU[gate] (9 bits at half the gate's step) * up, kept exact as int16 (step s_gate / 2 * s_up):
    rounding it to int8 was the largest single error of the int8 decoder, so down takes 16-bit inputs."""
    return lookup(gate, silu) * up


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """Index of the largest logit; ties go to the lowest token id."""
    best = logits.amax(-1, keepdim=True)
    ids = torch.arange(logits.shape[-1], dtype=torch.int64).expand_as(logits)
    return torch.where(logits == best, ids, logits.shape[-1]).amin(-1)

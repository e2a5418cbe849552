"""Integer rounding at chosen sites of the float model: what each integer format costs alone.

The integer decoder changes many things at once (weight codes, int8 activations, the int16
residual, the table softmax), so its loss against float says nothing about where the loss
comes from. Here the float model runs with one group of sites rounded to exactly the grid
and saturation the integer decoder uses there (the steps `quantize` chose from the same
calibration), everything else in float: the error budget of docs/numerics.md.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ..frontend.float_model import Transform
from ..frontend.ir import ModelConfig
from .tables import EXP_STEP, NORM_OUT_FRAC, PROB_BITS, RECIP_BITS, ROPE_IN_FRAC, SILU_OUT_BITS, exp_table

SITE_GROUPS = ("norm", "q", "k", "v", "probs", "attn_out", "gate", "up", "hidden", "residual", "logits")
_EXP = exp_table().double()


def _grid(value: torch.Tensor, step: np.ndarray | float, bits: int, symmetric: bool = False) -> torch.Tensor:
    """round(value / step) saturated to a signed `bits`-bit integer (symmetric: -(2^(b-1) - 1) at the bottom),
    times step (half up, as the datapath)."""
    s = torch.as_tensor(np.asarray(step, dtype=np.float64)).to(value.dtype)
    top = 2 ** (bits - 1)
    return torch.floor(value / s + 0.5).clamp(-top + symmetric, top - 1) * s


def integer_softmax(probs: torch.Tensor) -> torch.Tensor:
    """The integer softmax (quant/blocks.py softmax) applied to float probabilities.

    The distance of each score below the row's maximum is log(p_max / p); it is rounded to the
    exponent table's step and capped at 255 steps, looked up, and normalised with the same
    floor reciprocal and Q15 rounding as the hardware. Float score rounding (q, k) is a site of its own.
    """
    p = probs.double()
    gap = torch.log(p.amax(-1, keepdim=True)) - torch.log(p)  # +inf where p == 0 (masked or underflowed)
    z = torch.floor(gap / EXP_STEP + 0.5).clamp(max=255)  # EXP[255] = 0: masked keys drop out
    e = _EXP[z.long()]
    recip = torch.floor(2.0**RECIP_BITS / e.sum(-1, keepdim=True))
    q = torch.floor(e * recip / 2.0 ** (RECIP_BITS - PROB_BITS) + 0.5)
    return (q / 2.0**PROB_BITS).to(probs.dtype)


def site_group(site: str) -> str:
    """`layers.3.attn_norm` -> `norm`, `layers.0.q` -> `q`, `residual` -> `residual`."""
    if site.endswith("norm"):
        return "norm"
    last = site.rsplit(".", 1)[-1]
    return {"gate_act": "gate", "q_raw": "q", "k_raw": "k", "q_proj": "q", "k_proj": "k"}.get(last, last)


def rounding(cfg: ModelConfig, steps: dict[str, np.ndarray], scales: dict[str, float], groups: set[str]) -> Transform:
    """A float_forward transform that rounds the sites of `groups` (names from SITE_GROUPS) as the chip does.

    steps: `activation_steps`; scales: `residual_and_logit_scales`.
    """
    unknown = sorted(set(groups) - set(SITE_GROUPS))
    if unknown:
        raise ValueError(f"unknown site groups {unknown}; accepted: {', '.join(SITE_GROUPS)}")
    gated = cfg.gated
    rules: dict[str, Callable[[str, torch.Tensor], torch.Tensor]] = {
        "residual": lambda s, v: _grid(v, scales["residual"], 16),
        "logits": lambda s, v: _grid(v, scales["logits"], 32),
        "probs": lambda s, v: integer_softmax(v),
    }

    def chip_grid(site: str, value: torch.Tensor) -> torch.Tensor:
        if site.endswith("gate_act"):  # SILU table: 9 bits out at half the gate's step, +-255
            return _grid(value, steps[site.removesuffix("_act")] / 2, SILU_OUT_BITS, symmetric=True)
        if site.endswith("_raw"):  # q, k into RoPE: int12 at a 16x finer step (ROPE_IN_FRAC)
            return _grid(value, steps[site.removesuffix("_raw")] / 2**ROPE_IN_FRAC, 8 + ROPE_IN_FRAC)
        if site.endswith("_proj"):  # q, k into their per-head norms: int12 at a 16x finer step of their own
            return _grid(value, steps[site] / 2**ROPE_IN_FRAC, 8 + ROPE_IN_FRAC)
        if site.endswith("norm"):  # norms write int12 (their steps are already 16x finer)
            return _grid(value, steps[site], 8 + NORM_OUT_FRAC)
        if site.endswith(".hidden") and gated:  # SILU[g] * u is exact in int16: nothing to round
            return value
        step = steps[site]
        if step.size > 1 and value.dim() == 4:  # per-channel step on a (b, heads, t, hd) view: never (q/k/v are scalar)
            raise ValueError(f"site {site}: per-channel steps on a head view")
        return _grid(value, step, 8)

    def transform(site: str, value: torch.Tensor) -> torch.Tensor:
        group = site_group(site)
        if group not in groups:
            return value
        return rules.get(group, chip_grid)(site, value)

    return transform

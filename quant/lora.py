"""Host-side LoRA quantisation: float adapters -> what the host writes into the chip's SRAM.

A LoRA adapter adds (alpha / rank) * B @ A to a projection (A: rank x in, B: out x rank).
The chip holds A and B as int8 codes and two fixed-point rescales (docs/numerics.md §9);
this module picks them from the float adapter and the projection's compile-time scales.
"""

from __future__ import annotations

import numpy as np
import torch

from .fixedpoint import multiplier
from .partial_rotary import qk_row_order
from .qmodel import QModel
from .reference import LoraAdapter
from .weights import QuantizationError


def _codes(m: np.ndarray) -> tuple[torch.Tensor, float]:
    amax = float(np.abs(m).max())
    if amax == 0:
        return torch.zeros(m.shape, dtype=torch.int64), 0.0
    scale = amax / 127
    return torch.from_numpy(np.clip(np.floor(m / scale + 0.5), -127, 127).astype(np.int64)), scale


def quantize_lora(qm: QModel, layer: int, site: str, a: np.ndarray, b: np.ndarray, alpha: float) -> LoraAdapter:
    """Integer adapter for projection `site` of `layer` from float A (rank, in), B (out, rank) and alpha."""
    if site not in qm.lora.sites or not 0 <= layer < len(qm.layers):
        raise QuantizationError(f"no LoRA slot at layer {layer}, projection '{site}'; this build has slots on "
                                f"{', '.join(qm.lora.sites)} of layers 0..{len(qm.layers) - 1}")
    lin = getattr(qm.layers[layer], site)
    out_features, in_features = lin.codes.shape
    rank = qm.lora.rank
    if a.shape != (rank, in_features) or b.shape != (out_features, rank):
        raise QuantizationError(f"LoRA for layers.{layer}.{site} must be A ({rank}, {in_features}) and "
                                f"B ({out_features}, {rank}); got A {a.shape} and B {b.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all() and np.isfinite(alpha)) or alpha < 0:
        raise QuantizationError(f"LoRA for layers.{layer}.{site} needs finite A and B and a finite alpha >= 0")
    if site in ("q", "k"):  # partial rotary: the chip holds q and k's rows in its RoPE unit's order
        order = qk_row_order(qm.config, out_features // qm.config.head_dim)
        b = b if order is None else b[order]
    in_steps, out_steps = (np.asarray(v) for v in qm.steps[f"layers.{layer}.{site}"])
    a_codes, s_a = _codes(np.asarray(a, np.float64) * in_steps[None, :])  # A sees integer inputs
    b_codes, s_b = _codes(np.asarray(b, np.float64) / out_steps[:, None])  # B writes output units
    if s_a == 0 or s_b == 0 or alpha == 0:  # an all-zero adapter: the base model, exactly
        return LoraAdapter(a=torch.zeros_like(a_codes), b=torch.zeros_like(b_codes), a_mult=1 << 14, a_shift=15,
                           b_mult=1 << 14, b_shift=15)
    worst = max(1, int(a_codes.abs().sum(1).max()) * (1 << (lin.in_bits - 1)))  # |A a| in codes, never exceeded
    if worst >= 1 << 31:
        raise QuantizationError(f"LoRA A for layers.{layer}.{site} could overflow its int32 accumulator "
                                f"(worst case {worst}); use fewer input features or a smaller A")
    s_t = s_a * worst / 32767  # step of the int16 intermediate, chosen so that it cannot saturate
    a_mult, a_shift = multiplier(s_a / s_t, "LoRA A")
    b_mult, b_shift = multiplier(s_b * s_t * (alpha / rank), "LoRA B")
    return LoraAdapter(a=a_codes, b=b_codes, a_mult=a_mult, a_shift=a_shift, b_mult=b_mult, b_shift=b_shift)

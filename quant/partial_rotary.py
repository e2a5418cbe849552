"""Partial rotary (GPT-NeoX, Phi) on the chip's full-width RoPE unit, by reordering q and k's rows.

A partial rotary model rotates pairs (j, j + r/2) of the first r dims of each head and passes the
other head_dim - r dims through. The chip's RoPE unit rotates pairs (j, j + head_dim/2) of every
dim. Scores are q·k, which is unchanged when q and k's dims are reordered the same way, so the
quantiser stores q and k's rows (and biases, and LoRA B rows) in the order `rotary_order` gives:
the rotated pairs land on the unit's pairs j < r/2, the passed dims on the rest, whose table entries
are cos 1, sin 0 (`quant.tables.rope_tables`). The rotation then rounds a passed dim exactly as the
int12 -> int8 step after RoPE rounds any other: the hardware needs nothing new.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..frontend.ir import Linear, ModelConfig, ModelIR, Norm


def rotary_order(head_dim: int, rotary_dims: int) -> np.ndarray:
    """Within one head: order[n] = the model's dim stored at place n (rotated pair halves at n and n + hd/2)."""
    half, r_half = head_dim // 2, rotary_dims // 2
    passed = np.arange(rotary_dims, head_dim)  # an even count: head_dim and rotary_dims are both even
    first, second = passed[: half - r_half], passed[half - r_half:]
    return np.concatenate((np.arange(r_half), first, np.arange(r_half, rotary_dims), second))


def qk_row_order(cfg: ModelConfig, heads: int) -> np.ndarray | None:
    """The stored order of a q (heads = n_heads) or k (n_kv_heads) projection's rows; None: the model's own."""
    if cfg.positions != "rope" or cfg.rotary_dims is None or cfg.rotary_dims == cfg.head_dim:
        return None
    order = rotary_order(cfg.head_dim, cfg.rotary_dims)
    return np.concatenate([h * cfg.head_dim + order for h in range(heads)])


def _rows(lin: Linear, order: np.ndarray) -> Linear:
    return Linear(lin.weight[order], None if lin.bias is None else lin.bias[order])


def reorder_rotary_rows(ir: ModelIR) -> ModelIR:
    """The IR with q and k's rows in the chip's order (the same IR when every dim rotates). Only the quantiser's
    codes come from it: its float forward is not the model's (the config still says which dims rotate)."""
    cfg = ir.config
    q_order, k_order = qk_row_order(cfg, cfg.n_heads), qk_row_order(cfg, cfg.n_kv_heads)
    if q_order is None:
        return ir
    head = rotary_order(cfg.head_dim, cfg.rotary_dims)  # a per-head q/k norm's gains follow their rows
    layers = tuple(dataclasses.replace(layer, q=_rows(layer.q, q_order), k=_rows(layer.k, k_order),
                                       **{part: Norm(getattr(layer, part).weight[head]) for part in ("q_norm", "k_norm")
                                          if getattr(layer, part) is not None})
                   for layer in ir.layers)
    return dataclasses.replace(ir, layers=layers)

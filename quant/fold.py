"""Folding norm gains and biases into the projections that follow them.

The hardware normalises without a gain: g * n feeding W equals n feeding W * g, and a
LayerNorm bias beta feeding W adds W @ beta to that projection's bias. The folded model
computes the same function in float, and its projection weights are what the chip holds.
A tied head stops being tied: it becomes embedding * final gain.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..frontend.ir import Linear, ModelIR, Norm


def _fold(lin: Linear | None, norm: Norm) -> Linear | None:
    if lin is None:
        return None
    w = lin.weight.astype(np.float64)
    bias = None if lin.bias is None else lin.bias.astype(np.float64)
    if norm.bias is not None:
        bias = (0 if bias is None else bias) + w @ norm.bias.astype(np.float64)
    folded = (w * norm.weight.astype(np.float64)[None, :]).astype(np.float32)
    return Linear(folded, None if bias is None else bias.astype(np.float32))


def _unit(norm: Norm) -> Norm:
    return Norm(np.ones_like(norm.weight), None if norm.bias is None else np.zeros_like(norm.bias))


def fold_norms(ir: ModelIR) -> ModelIR:
    """The same model with every norm gain and bias moved into the next projections."""
    layers = tuple(
        dataclasses.replace(layer, attn_norm=_unit(layer.attn_norm), mlp_norm=_unit(layer.mlp_norm),
                            q=_fold(layer.q, layer.attn_norm), k=_fold(layer.k, layer.attn_norm),
                            v=_fold(layer.v, layer.attn_norm), gate=_fold(layer.gate, layer.mlp_norm),
                            up=_fold(layer.up, layer.mlp_norm))
        for layer in ir.layers)
    return dataclasses.replace(ir, layers=layers, final_norm=_unit(ir.final_norm), head=_fold(ir.head, ir.final_norm),
                               config=dataclasses.replace(ir.config, tied_head=False), proof=None)


def qk_signs(norm: Norm | None, heads: int) -> np.ndarray | None:
    """+1 or -1 for each row of a q (or k) projection of `heads` heads: the sign of its per-head norm's gain."""
    if norm is None:
        return None
    return np.tile(np.where(norm.weight < 0, -1.0, 1.0), heads)


def fold_qk_signs(ir: ModelIR) -> ModelIR:
    """The same model with every per-head q/k norm gain made non-negative: the sign of gain j moves into row j of
    each head of the projection before the norm (a row negated negates its element of the head, leaves the sum of
    squares alone, and the negated gain gives it back). The chip's norm multipliers hold only magnitudes
    (numerics §6); the quantiser stores the projection's rows from this IR."""
    cfg = ir.config
    if not cfg.qk_norm:
        return ir

    def flipped(lin: Linear, norm: Norm, heads: int) -> Linear:
        sign = qk_signs(norm, heads)
        w = (lin.weight.astype(np.float64) * sign[:, None]).astype(np.float32)
        return Linear(w, None if lin.bias is None else (lin.bias.astype(np.float64) * sign).astype(np.float32))

    layers = tuple(dataclasses.replace(layer, q=flipped(layer.q, layer.q_norm, cfg.n_heads),
                                       k=flipped(layer.k, layer.k_norm, cfg.n_kv_heads),
                                       q_norm=Norm(np.abs(layer.q_norm.weight)), k_norm=Norm(np.abs(layer.k_norm.weight)))
                   for layer in ir.layers)
    return dataclasses.replace(ir, layers=layers)


def fold_post_signs(ir: ModelIR) -> ModelIR:
    """The same model with every post-sublayer norm gain (Gemma 2, 3) made non-negative: the sign of gain j moves into
    row j of the projection the norm reads (o or down), as fold_qk_signs does for the per-head norms: a negated row
    negates its element, leaves the sum of squares alone, and the negated gain gives it back. The chip's multipliers
    hold magnitudes (numerics §5)."""
    if not ir.config.post_norms:
        return ir

    def flipped(lin: Linear, norm: Norm) -> Linear:
        sign = np.where(norm.weight < 0, -1.0, 1.0)
        w = (lin.weight.astype(np.float64) * sign[:, None]).astype(np.float32)
        return Linear(w, None if lin.bias is None else (lin.bias.astype(np.float64) * sign).astype(np.float32))

    layers = tuple(dataclasses.replace(layer, o=flipped(layer.o, layer.post_attn_norm),
                                       down=flipped(layer.down, layer.post_mlp_norm),
                                       post_attn_norm=Norm(np.abs(layer.post_attn_norm.weight)),
                                       post_mlp_norm=Norm(np.abs(layer.post_mlp_norm.weight)))
                   for layer in ir.layers)
    return dataclasses.replace(ir, layers=layers)

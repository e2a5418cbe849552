"""The float forward of a ModelIR in PyTorch: the meaning of the IR, in a page.

It is what the import proof compares with onnxruntime, and what quantisation quality
is measured against.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from .ir import Linear, ModelIR, Norm


def _t(array: np.ndarray | None) -> torch.Tensor | None:
    return None if array is None else torch.from_numpy(np.array(array, dtype=np.float32))


def _linear(x: torch.Tensor, lin: Linear) -> torch.Tensor:
    return F.linear(x, _t(lin.weight), _t(lin.bias))


def _norm(x: torch.Tensor, norm: Norm, kind: str, eps: float) -> torch.Tensor:
    if kind == "layer":
        return F.layer_norm(x, x.shape[-1:], _t(norm.weight), _t(norm.bias), eps)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * _t(norm.weight)


def rope_tables(head_dim: int, theta: float, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (positions, head_dim) in the rotate-half layout."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(positions, dtype=torch.float32), inv_freq)  # (positions, hd/2)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


@torch.no_grad()
def float_forward(ir: ModelIR, ids: torch.Tensor) -> torch.Tensor:
    """ids (batch, seq) int64 -> logits (batch, seq, vocab) float32."""
    cfg = ir.config
    b, t = ids.shape
    x = _t(ir.embed)[ids]  # (b, t, d)
    if cfg.positions == "learned":
        x = x + _t(ir.pos_embed)[:t]
    else:
        cos, sin = rope_tables(cfg.head_dim, cfg.rope_theta, t)  # (t, hd)
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    for layer in ir.layers:
        h = _norm(x, layer.attn_norm, cfg.norm, cfg.norm_eps)
        q = _linear(h, layer.q).view(b, t, cfg.n_heads, cfg.head_dim).transpose(1, 2)  # (b, h, t, hd)
        k = _linear(h, layer.k).view(b, t, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)  # (b, kvh, t, hd)
        v = _linear(h, layer.v).view(b, t, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        if cfg.positions == "rope":
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        group = cfg.n_heads // cfg.n_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (b, h, t, hd)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(cfg.head_dim)  # (b, h, t, t)
        scores = scores.masked_fill(~mask, float("-inf"))
        y = scores.softmax(-1) @ v  # (b, h, t, hd)
        x = x + _linear(y.transpose(1, 2).reshape(b, t, cfg.n_heads * cfg.head_dim), layer.o)
        h = _norm(x, layer.mlp_norm, cfg.norm, cfg.norm_eps)
        if cfg.activation == "silu_glu":
            inner = F.silu(_linear(h, layer.gate)) * _linear(h, layer.up)
        else:
            inner = F.gelu(_linear(h, layer.up), approximate="tanh" if cfg.activation == "gelu_tanh" else "none")
        x = x + _linear(inner, layer.down)
    return _linear(_norm(x, ir.final_norm, cfg.norm, cfg.norm_eps), ir.head)

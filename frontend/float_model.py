"""The float forward of a ModelIR in PyTorch: the meaning of the IR, in a page.

It is what the import proof compares with onnxruntime, and what quantisation quality
is measured against.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .ir import Layer, Linear, ModelConfig, ModelIR, Norm


def _t(array: np.ndarray | torch.Tensor | None) -> torch.Tensor | None:
    if array is None or isinstance(array, torch.Tensor):  # weights already in torch (the KV-cached decoder's copy)
        return array
    return torch.from_numpy(np.array(array, dtype=np.float32))


def _linear(x: torch.Tensor, lin: Linear) -> torch.Tensor:
    return F.linear(x, _t(lin.weight), _t(lin.bias))


Observer = Callable[[str, torch.Tensor], None]
Transform = Callable[[str, torch.Tensor], torch.Tensor]  # (site, value) -> the value the model goes on with


def _ignore(name: str, value: torch.Tensor) -> None:
    pass


def _keep(name: str, value: torch.Tensor) -> torch.Tensor:
    return value


def _norm(x: torch.Tensor, norm: Norm, kind: str, eps: float, observe: Observer, name: str,
          transform: Transform = _keep, also: str | None = None) -> torch.Tensor:
    """`also`: a second site this norm's output is (a shared norm feeds the MLP too: its calibration site)."""
    if kind == "layer":
        x = x - x.mean(-1, keepdim=True)
    normed = transform(name, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    observe(name, normed)  # before the gain: the gain folds into the next projection's weights
    if also is not None:
        observe(also, normed)
    out = normed * _t(norm.weight)
    return out if norm.bias is None else out + _t(norm.bias)


def head_norm(x: torch.Tensor, norm: Norm, eps: float) -> torch.Tensor:
    """The per-head q/k norm (ModelConfig.qk_norm): RMSNorm over the last axis (one head's head_dim elements) times
    its gain."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * _t(norm.weight)


def soft_cap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """Gemma 2's logit soft-cap, cap * tanh(logits / cap), or the logits themselves (no cap). It is increasing, so the
    argmax is that of the logits it caps: the chip takes that one (numerics §8), and so do greedy comparisons here
    (float32 tanh rounds to +-1 far out, which could tie what the uncapped logits order)."""
    return logits if cap is None else cap * torch.tanh(logits / cap)


def rope_tables(head_dim: int, theta: float, positions: int,
                inv_freq: tuple[float, ...] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (positions, head_dim) in the rotate-half layout (head_dim: the rotated dims): the angle per
    position of pair i is inv_freq[i] where given (a schedule read from the graph, ModelConfig.rope_freqs), else
    theta**(-2i / head_dim)."""
    if inv_freq is not None:
        inv_freq = torch.tensor(inv_freq, dtype=torch.float32)
    else:
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(positions, dtype=torch.float32), inv_freq)  # (positions, hd/2)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of the first cos.shape[-1] dims of each head (all of them unless partial rotary)."""
    rd = cos.shape[-1]
    if rd < x.shape[-1]:
        return torch.cat((_rotate(x[..., :rd], cos, sin), x[..., rd:]), dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def attention_mask(t: int, window: int | None, start: int = 0) -> torch.Tensor:
    """(t, start + t) of allowed keys for queries at positions start..: causal, and within the last `window` keys."""
    query = torch.arange(start, start + t)[:, None]
    key = torch.arange(start + t)[None, :]
    allowed = key <= query
    return allowed if window is None else allowed & (key > query - window)


def alibi_bias(cfg: ModelConfig, queries: torch.Tensor, keys: int) -> torch.Tensor | None:
    """ALiBi's bias on the scaled scores, (h, t, keys): slope_h * (key - query position) for queries at positions
    QUERIES (t,); None without ALiBi. Softmax is shift-invariant per row, so this equals BLOOM's slope_h * key."""
    if cfg.alibi_slopes is None:
        return None
    distance = (torch.arange(keys)[None, :] - queries[:, None]).to(torch.float32)  # (t, keys), <= 0 where causal
    return torch.tensor(cfg.alibi_slopes, dtype=torch.float32)[:, None, None] * distance


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, cfg: ModelConfig,
            transform: Transform = _keep, name: str = "", bias: torch.Tensor | None = None) -> torch.Tensor:
    """q (b, h, t, hd), k/v (b, kvh, T, hd), mask (t, T) of allowed keys, bias (h, t, T) or None -> (b, t, h * hd)."""
    b, _, t, _ = q.shape
    group = cfg.n_heads // cfg.n_kv_heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (b, h, T, hd)
    scores = soft_cap((q @ k.transpose(-1, -2)) / math.sqrt(cfg.head_dim), cfg.attn_softcap)  # (b, h, t, T)
    if bias is not None:  # ALiBi
        scores = scores + bias
    scores = scores.masked_fill(~mask, float("-inf"))
    y = transform(f"{name}.probs", scores.softmax(-1)) @ v  # (b, h, t, hd)
    return y.transpose(1, 2).reshape(b, t, cfg.n_heads * cfg.head_dim)


def _mlp(h: torch.Tensor, layer: Layer, cfg: ModelConfig, observe: Observer, i: int,
         transform: Transform = _keep) -> torch.Tensor:
    """The MLP of block i on the normed residual h: its contribution to the residual."""
    up = transform(f"layers.{i}.up", _linear(h, layer.up))
    observe(f"layers.{i}.up", up)
    if cfg.gated:
        gate = transform(f"layers.{i}.gate", _linear(h, layer.gate))
        observe(f"layers.{i}.gate", gate)
        act = F.silu(gate) if cfg.activation == "silu_glu" else F.gelu(gate, approximate="tanh")
        inner = transform(f"layers.{i}.gate_act", act) * up
    elif cfg.activation == "relu":
        inner = F.relu(up)
    else:
        inner = F.gelu(up, approximate="tanh" if cfg.activation == "gelu_tanh" else "none")
    inner = transform(f"layers.{i}.hidden", inner)
    observe(f"layers.{i}.hidden", inner)
    return _linear(inner, layer.down)


def _post(site: Callable[[str, torch.Tensor], torch.Tensor], out: torch.Tensor, norm: Norm | None, cfg: ModelConfig,
          name: str) -> torch.Tensor:
    """A sublayer's output on its way to the residual: through its post-sublayer RMSNorm (Gemma 2, 3), whose input is
    a site of its own (`name`: the projection's output, int16 at its own step on the chip), or as it is."""
    return out if norm is None else head_norm(site(name, out), norm, cfg.norm_eps)


@torch.no_grad()
def float_forward(ir: ModelIR, ids: torch.Tensor, observe: Observer = _ignore, transform: Transform = _keep,
                  capped: bool = True) -> torch.Tensor:
    """ids (batch, seq) int64 -> logits (batch, seq, vocab) float32; with a logit soft-cap (Gemma 2) the capped
    logits, or (capped=False) the head's output before the cap: what the chip's argmax reads, and the `logits` site.

    observe(site, tensor) sees the values at each site that becomes an integer format in
    hardware (calibration uses it): residual, norm outputs, q/k (before and after RoPE), v,
    attention output, gate, up, MLP hidden, logits. transform(site, tensor) may replace the
    value at those sites and at two more (`layers.i.probs`, the softmax's output, and
    `layers.i.gate_act`, SiLU of the gate; q and k before RoPE are `layers.i.q_raw`, `k_raw`; with a per-head q/k
    norm, q and k as projected are a site of their own, `layers.i.q_proj`, `k_proj`, and the norm's output is what
    reaches RoPE)
    before the model goes on: the error budget rounds one site at a time to its integer grid
    this way (quant/fake_quant.py).
    """
    cfg = ir.config
    b, t = ids.shape
    x = _t(ir.embed)[ids]  # (b, t, d)
    if cfg.positions == "learned":
        x = x + _t(ir.pos_embed)[:t]
    elif cfg.positions == "rope":
        cos, sin = rope_tables(cfg.rotary_dims or cfg.head_dim, cfg.rope_theta, t, cfg.rope_freqs)  # (t, rotated dims)

    def site(name: str, value: torch.Tensor, form: str = "") -> torch.Tensor:
        """transform sees `name` + form (`_raw`: q or k before RoPE), observe pools them under `name`."""
        value = transform(name + form, value)
        observe(name, value)
        return value

    x = site("residual", x)
    bias = alibi_bias(cfg, torch.arange(t), t)
    windows = cfg.layer_windows
    raw = "_raw" if cfg.positions == "rope" else ""  # q and k before RoPE
    for i, layer in enumerate(ir.layers):
        shared = f"layers.{i}.mlp_norm" if cfg.shared_norm else None
        h = _norm(x, layer.attn_norm, cfg.norm, cfg.norm_eps, observe, f"layers.{i}.attn_norm", transform, shared)
        q = _linear(h, layer.q).view(b, t, cfg.n_heads, cfg.head_dim).transpose(1, 2)  # (b, h, t, hd)
        k = _linear(h, layer.k).view(b, t, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)  # (b, kvh, t, hd)
        v = _linear(h, layer.v).view(b, t, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        if cfg.qk_norm:  # each head of q and k normalised (times its gain) before RoPE
            q = head_norm(site(f"layers.{i}.q_proj", q), layer.q_norm, cfg.norm_eps)
            k = head_norm(site(f"layers.{i}.k_proj", k), layer.k_norm, cfg.norm_eps)
        q, k, v = site(f"layers.{i}.q", q, raw), site(f"layers.{i}.k", k, raw), site(f"layers.{i}.v", v)
        if cfg.positions == "rope":
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            q, k = site(f"layers.{i}.q", q), site(f"layers.{i}.k", k)
        mask = attention_mask(t, windows[i])
        y = site(f"layers.{i}.attn_out", _attend(q, k, v, mask, cfg, transform, f"layers.{i}", bias))
        if cfg.parallel_residual:  # both sublayers read the block's input; one residual Add
            h = h if cfg.shared_norm else _norm(x, layer.mlp_norm, cfg.norm, cfg.norm_eps, observe,
                                                f"layers.{i}.mlp_norm", transform)
            x = site("residual", x + _linear(y, layer.o) + _mlp(h, layer, cfg, observe, i, transform))
            continue
        x = site("residual", x + _post(site, _linear(y, layer.o), layer.post_attn_norm, cfg, f"layers.{i}.o_out"))
        h = _norm(x, layer.mlp_norm, cfg.norm, cfg.norm_eps, observe, f"layers.{i}.mlp_norm", transform)
        mlp = _mlp(h, layer, cfg, observe, i, transform)
        x = site("residual", x + _post(site, mlp, layer.post_mlp_norm, cfg, f"layers.{i}.down_out"))
    logits = site("logits", _linear(_norm(x, ir.final_norm, cfg.norm, cfg.norm_eps, observe, "final_norm", transform),
                                    ir.head))
    return soft_cap(logits, cfg.logit_softcap) if capped else logits

"""The bundled example model: a tiny Llama-style character model, readable in a page.

It is deliberately the same shape as Hugging Face's Llama (RMSNorm, rotate-half RoPE,
SwiGLU, causal attention, tied embeddings) so that what hardwire learns to import from
this model carries over to real exports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TinyLlamaConfig:
    vocab_size: int = 65  # distinct characters of the corpus
    d_model: int = 128  # residual stream width
    n_layers: int = 3  # transformer blocks
    n_heads: int = 4  # attention heads (head_dim = d_model / n_heads)
    ffn: int = 224  # SwiGLU hidden width
    context: int = 128  # longest sequence the model is trained for
    rope_theta: float = 10000.0  # RoPE base
    norm_eps: float = 1e-5  # RMSNorm epsilon


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: TinyLlamaConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.d_model // cfg.n_heads
        self.q_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.o_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # (b, h, t, hd)
        k = self.k_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, h, t, hd)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, cfg: TinyLlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.ffn, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.ffn, bias=False)
        self.down_proj = nn.Linear(cfg.ffn, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: TinyLlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class TinyLlama(nn.Module):
    def __init__(self, cfg: TinyLlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        head_dim = cfg.d_model // cfg.n_heads
        inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
        freqs = torch.outer(torch.arange(cfg.context).float(), inv_freq)  # (context, hd/2)
        angles = torch.cat((freqs, freqs), dim=-1)  # (context, hd)
        self.register_buffer("rope_cos", angles.cos(), persistent=False)
        self.register_buffer("rope_sin", angles.sin(), persistent=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2 style scaled init of residual outputs
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx (b, t) int64 token ids -> logits (b, t, vocab)."""
        t = idx.shape[1]
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]  # (t, hd)
        x = self.embed_tokens(idx)  # (b, t, d)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return F.linear(self.norm(x), self.embed_tokens.weight)  # tied head


def export_onnx(model: TinyLlama, path: str, *, dynamo: bool = True, metadata: dict[str, str] | None = None) -> None:
    """Write the model as ONNX with a dynamic sequence axis, weights inline."""
    import onnx

    model.eval()
    example = torch.zeros((1, 8), dtype=torch.long)
    if dynamo:
        seq = torch.export.Dim("seq", min=1, max=model.cfg.context)
        torch.onnx.export(model, (example,), path, dynamo=True, input_names=["input_ids"],
                          output_names=["logits"], dynamic_shapes=({1: seq},), external_data=False)
    else:
        torch.onnx.export(model, (example,), path, dynamo=False, input_names=["input_ids"],
                          output_names=["logits"], dynamic_axes={"input_ids": {1: "seq"}, "logits": {1: "seq"}},
                          opset_version=17)
    proto = onnx.load(path)
    entries = {"hardwire.context": str(model.cfg.context), **(metadata or {})}
    for key, value in entries.items():
        proto.metadata_props.add(key=key, value=value)
    onnx.save(proto, path)

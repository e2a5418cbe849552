"""ModelIR: what the frontend recovers from a graph, and all that later stages may use.

A decoder-only transformer is few enough choices (norm, activation, positions, head
counts) that a frozen config plus typed weight records describe every model hardwire
accepts. Weights are float32 numpy arrays in PyTorch's orientation: (out, in).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from .proof_record import Proof

NormKind = Literal["rms", "layer"]
Activation = Literal["silu_glu", "gelu_tanh_glu", "gelu_tanh", "gelu", "relu"]
GATED = ("silu_glu", "gelu_tanh_glu")  # down(act(gate) * up)
Positions = Literal["rope", "learned", "alibi"]  # alibi: no position in the stream, a bias on the scores


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int  # number of token ids
    d_model: int  # residual stream width
    n_layers: int  # transformer blocks
    n_heads: int  # query heads
    n_kv_heads: int  # key/value heads (< n_heads: grouped-query attention)
    head_dim: int  # width of one head
    ffn: int  # hidden width of the MLP
    context: int | None  # longest sequence the model declares; None when the graph does not say (RoPE)
    norm: NormKind  # RMSNorm or LayerNorm
    norm_eps: float  # epsilon inside the square root
    activation: Activation  # *_glu: down(act(gate) * up); gelu*, relu: down(act(up))
    positions: Positions  # rotary (rotate-half layout), a learned table added to the embedding, or ALiBi
    rope_theta: float | None  # RoPE base, None for learned positions and ALiBi (with rope_freqs: the one pair 1 implies)
    tied_head: bool  # output head shares the token embedding
    # Block layout beyond the sequential pre-norm Llama/GPT-2 block (the defaults are that block):
    parallel_residual: bool = False  # x + attn(norm1(x)) + mlp(norm2(x)): both sublayers read the block's input
    shared_norm: bool = False  # parallel blocks with one norm for both sublayers (Phi); mlp_norm is attn_norm
    rotary_dims: int | None = None  # RoPE rotates the first rotary_dims of each head (partial rotary); None: all
    attn_windows: tuple[int | None, ...] | None = None  # per layer: a query sees the last w keys; None: causal
    rope_freqs: tuple[float, ...] | None = None  # per rotated pair: its angle per position, read from the graph
    #   (Llama 3, linear, YaRN scaling); None: rope_theta**(-2i / rotary dims)
    qk_norm: bool = False  # an RMSNorm over each head of q and of k (Layer.q_norm, k_norm; norm_eps), after their
    #   projections and before RoPE (Qwen3, Gemma 3)
    alibi_slopes: tuple[float, ...] | None = None  # per query head h: ALiBi adds slope_h * (key - query position) to
    #   the scaled scores before the softmax (BLOOM, MPT); positions is "alibi"
    post_norms: bool = False  # an RMSNorm (Layer.post_attn_norm, post_mlp_norm; norm_eps) of the attention's and the
    #   MLP's outputs before each residual Add: Gemma 2's and Gemma 3's "sandwich" norms
    attn_softcap: float | None = None  # the softmax reads c * tanh(s / c) of the scaled scores s (Gemma 2;
    #   numerics §6: a table in the scores' integer domain)
    logit_softcap: float | None = None  # logits are cap * tanh(z / cap) of the head's output z (Gemma 2); the chip
    #   takes the argmax of z, the same token (numerics §8)
    folded: tuple[str, ...] = ()  # what import folded into the fields above (embedding scale, score scale, ...)

    @property
    def gated(self) -> bool:
        return self.activation in GATED

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Per layer: its attention window, or None (causal): attn_windows, or every layer causal."""
        return self.attn_windows or (None,) * self.n_layers

    @property
    def inv_freq(self) -> np.ndarray:
        """RoPE's angle per position step of each rotated pair i (float64): rope_freqs, or theta**(-2i / dims)."""
        if self.rope_freqs is not None:
            return np.array(self.rope_freqs, dtype=np.float64)
        rd = self.rotary_dims or self.head_dim
        return float(self.rope_theta) ** (-np.arange(0, rd, 2, dtype=np.float64) / rd)

    @property
    def features(self) -> tuple[str, ...]:
        """Every recovered feature beyond the baseline block, as `name` or `name: detail`, in a fixed order."""
        out = []
        if self.parallel_residual:
            out.append("parallel residual")
        if self.shared_norm:
            out.append("shared norm")
        if self.rotary_dims is not None and self.rotary_dims != self.head_dim:
            out.append(f"partial rotary: {self.rotary_dims} of {self.head_dim} dims")
        if self.rope_freqs is not None:
            out.append("RoPE schedule from the graph (frequencies not base^(-2i/d): scaled RoPE)")
        if self.qk_norm:
            out.append("per-head q/k norm (RMSNorm of each head of q and k before RoPE)")
        if self.alibi_slopes is not None:
            slopes = ", ".join(f"{s:.6g}" for s in self.alibi_slopes)
            out.append(f"ALiBi (a linear bias per head on the scores, slopes {slopes})")
        if self.attn_windows is not None and any(w is not None for w in self.attn_windows):
            layers = ", ".join(f"layer {i}: {w}" for i, w in enumerate(self.attn_windows) if w is not None)
            out.append(f"windowed attention ({layers})")
        if self.post_norms:
            out.append("post-sublayer norms (RMSNorm of the attention's and the MLP's outputs before the residual Adds)")
        if self.attn_softcap is not None:
            out.append(f"attention soft-capping {self.attn_softcap:g} (scores cap * tanh(s / cap) before the softmax)")
        if self.logit_softcap is not None:
            out.append(f"logit soft-capping {self.logit_softcap:g} (cap * tanh(logits / cap): the argmax of the "
                       "uncapped logits is the same token)")
        return tuple(out)


@dataclass(frozen=True)
class Linear:
    weight: np.ndarray  # (out, in)
    bias: np.ndarray | None = None  # (out,)

    @property
    def shape(self) -> tuple[int, int]:
        return self.weight.shape  # type: ignore[return-value]


@dataclass(frozen=True)
class Norm:
    weight: np.ndarray  # (d_model,) gain
    bias: np.ndarray | None = None  # (d_model,), LayerNorm only


@dataclass(frozen=True)
class Layer:
    attn_norm: Norm
    q: Linear  # (n_heads * head_dim, d_model)
    k: Linear  # (n_kv_heads * head_dim, d_model)
    v: Linear  # (n_kv_heads * head_dim, d_model)
    o: Linear  # (d_model, n_heads * head_dim)
    mlp_norm: Norm
    up: Linear  # (ffn, d_model)
    down: Linear  # (d_model, ffn)
    gate: Linear | None = None  # (ffn, d_model), gated MLPs only
    q_norm: Norm | None = None  # (head_dim,) gain of the RMSNorm of each head of q (ModelConfig.qk_norm), no bias
    k_norm: Norm | None = None  # (head_dim,) the same for k
    post_attn_norm: Norm | None = None  # (d_model,) gain of the RMSNorm of o's output (ModelConfig.post_norms), no bias
    post_mlp_norm: Norm | None = None  # (d_model,) the same for down's output


@dataclass(frozen=True)
class ModelIR:
    config: ModelConfig
    embed: np.ndarray  # (vocab, d_model)
    layers: tuple[Layer, ...]
    final_norm: Norm
    head: Linear  # (vocab, d_model); the embedding itself when tied
    pos_embed: np.ndarray | None = None  # (positions, d_model), learned positions only
    source: str = ""  # where the model came from
    vocab: tuple[str, ...] | None = field(default=None)  # characters of a char-level model, when the file says
    proof: Proof | None = field(default=None, compare=False)  # the import check against onnxruntime

    def named_weights(self) -> Iterator[tuple[str, np.ndarray]]:
        """Every distinct weight tensor under a stable name (the tied head is not counted twice)."""
        yield "embed", self.embed
        if self.pos_embed is not None:
            yield "pos_embed", self.pos_embed
        for i, layer in enumerate(self.layers):
            for part in ("attn_norm", "q", "q_norm", "k", "k_norm", "v", "o", "post_attn_norm", "mlp_norm", "gate", "up",
                         "down", "post_mlp_norm"):
                item = getattr(layer, part)
                if item is None or (part == "mlp_norm" and item is layer.attn_norm):  # a shared norm once
                    continue
                yield f"layers.{i}.{part}.weight", item.weight
                if item.bias is not None:
                    yield f"layers.{i}.{part}.bias", item.bias
        yield "final_norm.weight", self.final_norm.weight
        if self.final_norm.bias is not None:
            yield "final_norm.bias", self.final_norm.bias
        if not self.config.tied_head:
            yield "head.weight", self.head.weight
        if self.head.bias is not None:
            yield "head.bias", self.head.bias

    @property
    def n_params(self) -> int:
        return sum(int(w.size) for _, w in self.named_weights())

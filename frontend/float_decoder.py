"""Greedy decoding of a ModelIR in float32 with a KV cache: the CPU baseline the chip is timed against.

float_forward recomputes the whole prefix for every token, which is the meaning of the IR
but not how anyone decodes. FloatDecoder runs the same functions (float_model's norm,
projections, RoPE, attention and MLP, op for op) on only the new tokens, keeping each
layer's keys and values, so its logits equal the full forward's up to float summation
order, and its greedy tokens are those of argmax over the full forward.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from .float_model import (
    _attend,
    _ignore,
    _keep,
    _linear,
    _mlp,
    _norm,
    _post,
    _rotate,
    _t,
    alibi_bias,
    head_norm,
    rope_tables,
    soft_cap,
)
from .ir import Linear, ModelIR, Norm

Step = Callable[..., torch.Tensor]


class DecodeError(Exception):
    """A request the decoder cannot serve (empty prompt, context exceeded, token out of range)."""


def torch_weights(ir: ModelIR) -> ModelIR:
    """The IR with every weight converted once to a float32 torch tensor.

    float_model converts numpy weights at each use; for one token at a time that copy would
    cost more than the arithmetic and the benchmark would time numpy, not decoding.
    """
    def lin(x: Linear) -> Linear:
        return Linear(_t(x.weight).contiguous(), _t(x.bias))

    def norm(x: Norm) -> Norm:
        return Norm(_t(x.weight), _t(x.bias))

    layers = tuple(dataclasses.replace(layer, attn_norm=norm(layer.attn_norm), q=lin(layer.q), k=lin(layer.k),
                                       q_norm=None if layer.q_norm is None else norm(layer.q_norm),
                                       k_norm=None if layer.k_norm is None else norm(layer.k_norm),
                                       post_attn_norm=None if layer.post_attn_norm is None else norm(layer.post_attn_norm),
                                       post_mlp_norm=None if layer.post_mlp_norm is None else norm(layer.post_mlp_norm),
                                       v=lin(layer.v), o=lin(layer.o), mlp_norm=norm(layer.mlp_norm),
                                       up=lin(layer.up), down=lin(layer.down),
                                       gate=None if layer.gate is None else lin(layer.gate))
                   for layer in ir.layers)
    return dataclasses.replace(ir, embed=_t(ir.embed), layers=layers, final_norm=norm(ir.final_norm), head=lin(ir.head),
                               pos_embed=_t(ir.pos_embed), proof=None)


class FloatDecoder:
    """Single-stream float32 decoding with a per-layer KV cache.

    Eager calls attend over the filled part of the cache only; compile() switches to the
    whole cache with the unfilled part masked, so a token step always has the same shapes
    and torch.compile traces it once instead of recompiling (or guarding) per position.
    """

    def __init__(self, ir: ModelIR, capacity: int | None = None) -> None:
        self.ir = torch_weights(ir)
        cfg = ir.config
        limits = [c for c in (cfg.context, None if ir.pos_embed is None else ir.pos_embed.shape[0]) if c]
        self.context: int | None = min(limits) if limits else None  # None: RoPE without a declared context
        self.capacity = capacity or self.context or 2048
        if self.context is not None and self.capacity > self.context:
            raise DecodeError(f"capacity {self.capacity} exceeds the model's context of {self.context}")
        if cfg.positions == "rope":
            self.cos, self.sin = rope_tables(cfg.rotary_dims or cfg.head_dim, cfg.rope_theta, self.capacity,
                                                   cfg.rope_freqs)
        self.step_fn: Step = self.forward
        self.static = False  # attend over the whole cache (fixed shapes) rather than the filled part
        self.reset()

    def compile(self, **options: object) -> None:
        """Run every later call through torch.compile(**options), with fixed-shape attention."""
        self.static = True
        self.step_fn = torch.compile(self._forward_static, **options)

    def _forward_static(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.forward(ids, positions, None)

    def reset(self) -> None:
        """Start a new sequence: the cache is emptied (zeroed, so stale keys never leak into a later run)."""
        cfg = self.ir.config
        shape = (1, cfg.n_kv_heads, self.capacity, cfg.head_dim)
        self.cache = [(torch.zeros(shape), torch.zeros(shape)) for _ in self.ir.layers]
        self.position = 0

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, end: int | None = None) -> torch.Tensor:
        """ids (1, t) at positions (t,) (consecutive, the cache holding all before) -> logits (1, t, vocab).

        The same sequence of operations as float_forward, with attention over the cached keys:
        cache[:end], or the whole cache when end is None (masked beyond each token's position).
        """
        ir, cfg = self.ir, self.ir.config
        b, t = ids.shape
        end = self.capacity if end is None else end
        x = ir.embed[ids]
        if cfg.positions == "learned":
            x = x + ir.pos_embed[positions]
        elif cfg.positions == "rope":
            cos, sin = self.cos[positions], self.sin[positions]
        bias = alibi_bias(cfg, positions, end)
        causal = positions[:, None] >= torch.arange(end)  # (t, end): token at position p sees keys 0..p
        windows = cfg.layer_windows
        for i, layer in enumerate(ir.layers):
            mask = causal if windows[i] is None else causal & (torch.arange(end) > positions[:, None] - windows[i])
            h = _norm(x, layer.attn_norm, cfg.norm, cfg.norm_eps, _ignore, "")
            q = _linear(h, layer.q).view(b, t, cfg.n_heads, cfg.head_dim).transpose(1, 2)
            k = _linear(h, layer.k).view(b, t, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
            v = _linear(h, layer.v).view(b, t, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
            if cfg.qk_norm:
                q, k = head_norm(q, layer.q_norm, cfg.norm_eps), head_norm(k, layer.k_norm, cfg.norm_eps)
            if cfg.positions == "rope":
                q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            keys, values = self.cache[i]
            keys.index_copy_(2, positions, k)
            values.index_copy_(2, positions, v)
            y = _attend(q, keys[:, :, :end], values[:, :, :end], mask, cfg, bias=bias)
            if cfg.parallel_residual:  # as float_forward: one residual Add for both sublayers
                h = h if cfg.shared_norm else _norm(x, layer.mlp_norm, cfg.norm, cfg.norm_eps, _ignore, "")
                x = x + _linear(y, layer.o) + _mlp(h, layer, cfg, _ignore, i)
                continue
            x = x + _post(_keep, _linear(y, layer.o), layer.post_attn_norm, cfg, "")
            h = _norm(x, layer.mlp_norm, cfg.norm, cfg.norm_eps, _ignore, "")
            x = x + _post(_keep, _mlp(h, layer, cfg, _ignore, i), layer.post_mlp_norm, cfg, "")
        return _linear(_norm(x, ir.final_norm, cfg.norm, cfg.norm_eps, _ignore, ""), ir.head)

    def feed(self, tokens: list[int]) -> torch.Tensor:
        """Append tokens to the sequence in one call; -> float32 logits (len(tokens), vocab), soft-capped where the
        model caps them (Gemma 2), as float_forward's."""
        return soft_cap(self._advance(tokens), self.ir.config.logit_softcap)

    def _advance(self, tokens: list[int]) -> torch.Tensor:
        """feed's work: -> the head's output before any soft-cap, which greedy decoding takes the argmax of."""
        vocab = self.ir.config.vocab_size
        bad = [tok for tok in tokens if not 0 <= tok < vocab]
        if bad:
            raise DecodeError(f"token id {bad[0]} is out of range; accepted: 0..{vocab - 1}")
        if self.position + len(tokens) > self.capacity:
            raise DecodeError(f"{self.position + len(tokens)} positions exceed the capacity of {self.capacity}"
                              + (" (the model's context)" if self.capacity == self.context else ""))
        positions = torch.arange(self.position, self.position + len(tokens))
        ids = torch.tensor([tokens], dtype=torch.int64)
        logits = self.step_fn(ids, positions) if self.static else self.step_fn(ids, positions, self.position + len(tokens))
        self.position += len(tokens)
        return logits[0]

    def generate(self, prompt: list[int], n: int) -> list[int]:
        """Greedy: the prompt in one call, then n tokens, each the argmax of the last logits (ties: lowest id).

        A new sequence each call, like ReferenceDecoder.generate; the last token is not fed back.
        """
        if not prompt:
            raise DecodeError("the prompt is empty; at least one token is needed")
        self.reset()
        logits = self._advance(list(prompt))[-1]  # uncapped: the soft-cap keeps the argmax (numerics §8)
        out: list[int] = []
        for _ in range(n):
            out.append(int(logits.argmax()))
            if len(out) < n:
                logits = self._advance(out[-1:])[-1]
        return out


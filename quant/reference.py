"""The integer reference decoder: the one definition of what the hardware computes.

It reads like the float model it mirrors (frontend/float_model.py), op for op, but every
value is an integer and every op is a block from blocks.py. `ReferenceDecoder` decodes
one token at a time with a KV cache, as the chip does; `forward` runs a whole prefix at
once through the same code, for evaluation and for checking the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import blocks
from .fixedpoint import check_width, rescale, round_shift, saturate
from .qmodel import QEmbedding, QLinear, QModel, QNorm


class DecodeError(Exception):
    """A condition the hardware flags instead of decoding: full context, token out of range."""


LORA_MAX_SHIFT = 63  # a_shift / b_shift registers are 6 bits (rtl/lora_map.py); quantize_lora makes at most 62


@dataclass(frozen=True)
class LoraAdapter:
    """One adapter in the chip's SRAM (docs/numerics.md §9): out += B (A a) at a fixed-point scale."""

    a: torch.Tensor  # int64 (rank, in): int8 codes
    b: torch.Tensor  # int64 (out, rank): int8 codes
    a_mult: int  # A a (int32) -> int16
    a_shift: int
    b_mult: int  # B t (int32) -> the projection's output units
    b_shift: int

    def __post_init__(self) -> None:
        """Refuse a shift the chip cannot take wherever an adapter is made (quantize_lora, lora_writes' callers, the
        emulator, tests, scripts): the rescale adds 2**(shift - 1) before shifting, so a shift of 0 adds 2**63 on the
        chip's A path (and fails in round_shift here); the registers hold 6 bits, so 1 to 63 is what works."""
        for name in ("a_shift", "b_shift"):
            value = getattr(self, name)
            if not 1 <= value <= LORA_MAX_SHIFT:
                raise ValueError(f"LoRA {name} must be between 1 and {LORA_MAX_SHIFT}, got {value} (the rescale adds "
                                 "2**(shift - 1): a shift of 0 would add 2**63 on the chip)")


LoraSet = dict[tuple[int, str], LoraAdapter]  # (layer, projection) -> adapter


def lora_delta(a: torch.Tensor, adapter: LoraAdapter, what: str) -> torch.Tensor:
    t = blocks.matvec(a, adapter.a, None, 32, f"{what} LoRA A")
    t16 = rescale(t, adapter.a_mult, adapter.a_shift, 16)
    low = blocks.matvec(t16, adapter.b, None, 32, f"{what} LoRA B")
    return round_shift(low * adapter.b_mult, adapter.b_shift)


def linear(a: torch.Tensor, lin: QLinear, what: str, adapter: LoraAdapter | None = None) -> torch.Tensor:
    """rescale(W a + bias) into the output format, plus the LoRA term before saturation."""
    acc = blocks.matvec(a, lin.weight, lin.bias, lin.acc_bits, what)
    y = rescale(acc, lin.mult, lin.shift, None)
    if adapter is not None:
        y = check_width(y + lora_delta(a, adapter, what), blocks.PRE_SATURATION_BITS, f"{what} output")
    return saturate(y, lin.out_bits)


def qnorm(x: torch.Tensor, norm: QNorm, rsqrt: torch.Tensor, what: str) -> torch.Tensor:
    """A norm site of the model: its kind, epsilon, per-channel rescale and output width."""
    return blocks.norm(x, norm.kind, norm.eps_q, norm.mult, norm.shift, rsqrt, what, norm.out_bits)


def embed(table: QEmbedding, rows: torch.Tensor) -> torch.Tensor:
    return rescale(table.weight[rows], table.mult[rows].unsqueeze(-1), table.shift[rows].unsqueeze(-1), 16)


def run(qm: QModel, ids: torch.Tensor, start: int, cache: list[list[torch.Tensor]] | None,
        lora: LoraSet | None = None) -> torch.Tensor:
    """Decode positions start.. of ids (batch, P); extends cache (per layer [k, v]) in place if given.

    -> logits (batch, P, vocab) int32 at scale qm.scales["logits"].
    """
    cfg = qm.config
    lora = lora or {}
    b, p = ids.shape
    positions = torch.arange(start, start + p)
    windows = cfg.layer_windows  # per layer: attention window, or None (causal)
    x = embed(qm.embed, ids)  # (b, p, d) int16 residual
    if qm.pos is not None:
        x = saturate(x + embed(qm.pos, positions), 16)
    for i, layer in enumerate(qm.layers):
        name = f"layers.{i}"
        a = qnorm(x, layer.attn_norm, qm.rsqrt, f"{name}.attn_norm")  # (b, p, d) int12
        q = linear(a, layer.q, f"{name}.q", lora.get((i, "q"))).view(b, p, cfg.n_heads, cfg.head_dim)
        k = linear(a, layer.k, f"{name}.k", lora.get((i, "k"))).view(b, p, cfg.n_kv_heads, cfg.head_dim)
        v = linear(a, layer.v, f"{name}.v", lora.get((i, "v"))).view(b, p, cfg.n_kv_heads, cfg.head_dim)
        if layer.q_norm is not None:  # per-head q/k norm (§6): §4's RMSNorm over each head, int12 in and out
            q = qnorm(q, layer.q_norm, qm.rsqrt, f"{name}.q_norm")
            k = qnorm(k, layer.k_norm, qm.rsqrt, f"{name}.k_norm")
        if cfg.positions == "rope":
            cos, sin = qm.rope_cos[positions], qm.rope_sin[positions]  # (p, hd/2) Q14
            frac = layer.q.out_bits - 8  # ROPE_IN_FRAC: q and k come out of their projections this much finer
            q, k = blocks.rope(q, cos, sin, frac), blocks.rope(k, cos, sin, frac)
        if cache is not None:
            cache[i][0] = torch.cat((cache[i][0], k), dim=1)  # (b, t, kvh, hd)
            cache[i][1] = torch.cat((cache[i][1], v), dim=1)
            k, v = cache[i]
        key = torch.arange(k.shape[1])[None, :]  # (1, t): the cached positions
        valid = key <= positions[:, None]  # (p, t): causal
        if windows[i] is not None:  # a local layer sees the last w keys only (numerics §6)
            valid &= key > positions[:, None] - windows[i]
        bias = None if layer.alibi is None else blocks.alibi_bias(layer.alibi, k.shape[1])  # (H, 1, t): ALiBi (§6)
        cap = None if qm.cap_table is None else (layer.cap_mult, layer.cap_shift, qm.cap_table)  # Gemma 2 (§6)
        y = blocks.attention(q, k, v, valid, layer.sm_mult, layer.sm_shift, layer.att_mult, layer.att_shift, qm.exp,
                             f"{name}.attention", bias, cap)
        attn_out = linear(y.reshape(b, p, -1), layer.o, f"{name}.o", lora.get((i, "o")))
        if layer.post_attn_norm is not None:  # Gemma 2, 3 (§5): o's int16 output normed to the residual's step
            attn_out = qnorm(attn_out, layer.post_attn_norm, qm.rsqrt, f"{name}.post_attn_norm")
        if cfg.parallel_residual and not cfg.shared_norm:  # the MLP reads the block's input too, through its norm
            a = qnorm(x, layer.mlp_norm, qm.rsqrt, f"{name}.mlp_norm")
        x = saturate(x + attn_out, 16)
        if not cfg.parallel_residual:  # sequential: the MLP reads the residual after attention
            a = qnorm(x, layer.mlp_norm, qm.rsqrt, f"{name}.mlp_norm")
        up = linear(a, layer.up, f"{name}.up", lora.get((i, "up")))
        if layer.gate is not None:
            gate = linear(a, layer.gate, f"{name}.gate", lora.get((i, "gate")))
            h = blocks.glu(gate, up, layer.act_table)
        else:
            h = blocks.lookup(up, layer.act_table)
        mlp_out = linear(h, layer.down, f"{name}.down", lora.get((i, "down")))
        if layer.post_mlp_norm is not None:
            mlp_out = qnorm(mlp_out, layer.post_mlp_norm, qm.rsqrt, f"{name}.post_mlp_norm")
        x = saturate(x + mlp_out, 16)
    return linear(qnorm(x, qm.final_norm, qm.rsqrt, "final_norm"), qm.head, "head")


def forward(qm: QModel, ids: torch.Tensor, lora: LoraSet | None = None) -> torch.Tensor:
    """Logits for every position of ids (batch, T), recomputing the whole prefix (no cache)."""
    if ids.shape[1] > qm.context:
        raise DecodeError(f"sequence of {ids.shape[1]} tokens exceeds the context of {qm.context}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= qm.config.vocab_size):
        bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
        raise DecodeError(f"token id {bad} is out of range; accepted: 0..{qm.config.vocab_size - 1}")
    return run(qm, ids, 0, None, lora)


class ReferenceDecoder:
    """Token-at-a-time decoding with a KV cache, exactly as the chip does it."""

    def __init__(self, qm: QModel, lora: LoraSet | None = None) -> None:
        self.qm = qm
        self.lora = lora
        self.reset()

    def reset(self) -> None:
        """The new-sequence flag: forget the KV cache."""
        cfg = self.qm.config
        empty = torch.zeros((1, 0, cfg.n_kv_heads, cfg.head_dim), dtype=torch.int64)
        self.cache = [[empty, empty] for _ in self.qm.layers]
        self.position = 0

    def step(self, token: int) -> torch.Tensor:
        """Feed one token; -> int32 logits (vocab,) for the next one."""
        if not 0 <= token < self.qm.config.vocab_size:
            raise DecodeError(f"token id {token} is out of range; accepted: 0..{self.qm.config.vocab_size - 1}")
        if self.position >= self.qm.context:
            raise DecodeError(f"context full: all {self.qm.context} positions are used; start a new sequence")
        logits = run(self.qm, torch.tensor([[token]]), self.position, self.cache, self.lora)
        self.position += 1
        return logits[0, 0]

    def outputs(self, prompt: list[int], n: int) -> list[int]:
        """What the chip outputs after each token fed, from the decoder's current state (reset() first for a new
        sequence): the prompt, then n generated tokens (greedy: the argmax of the last logits, ties to the lowest
        id), each fed back but the last. -> len(prompt) - 1 predictions inside the prompt, then the n generated
        tokens: a test compares every one of them."""
        if not prompt:
            raise DecodeError("the prompt is empty; at least one token is needed")
        out = [int(blocks.argmax(self.step(token))) for token in prompt]
        while len(out) < len(prompt) - 1 + n:
            out.append(int(blocks.argmax(self.step(out[-1]))))
        return out[:len(prompt) - 1 + n]

    def generate(self, prompt: list[int], n: int) -> list[int]:
        """Greedy: feed the prompt, then n tokens, each the argmax of the last logits (ties: lowest id)."""
        return self.outputs(prompt, n)[len(prompt) - 1:]

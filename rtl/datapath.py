"""What every stage of the decoder speaks: the engine's modes and sources, a product's start, an
element reader, and the sizes the stages build to (Dims).

The Decoder is built in stages, one file each, joined in Decoder.elaborate (rtl/decoder.py): its
memories (rtl/decoder_memories.py) and units (rtl/decoder_units.py), the engine's address generator
(rtl/decoder_engine.py), the epilogue with its destinations (rtl/decoder_epilogue.py), the units
that run beside the schedule (rtl/decoder_side.py) and the schedule's FSM (rtl/decoder_schedule.py).
Each stage is a function of the records it reads and returns a record of what it provides; the
records whose signals the schedule (built last) drives are made first. docs/hardware.md draws the whole.
A record of signals declares them in its constructor; the ones declared several to a line keep
Amaranth's default name ($signal) as before the records, so that the Verilog stayed byte-identical.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.lib import enum

from ..quant.qmodel import QModel
from .banked_vector import BankedVector
from .plan import HardwarePlan

ACT_BITS = 17  # MAC activations: int8 and int16 values, and Q15 probabilities up to 32768
MAX_LORA_RANK = 64  # LoRA B t: one multiplier per rank, all in the epilogue


class Mode(enum.Enum, shape=4):
    """Where a matrix-vector result goes (the epilogue)."""

    Q = 0  # int8 -> raw q, rotated later
    K = 1  # int8 -> raw k, rotated into the K cache
    V = 2  # int8 -> the transposed V cache at this position
    RESID = 3  # int16 -> added to the residual (o, down)
    GATE = 4  # int8 -> gate buffer
    UP = 5  # int8 -> SILU[gate] * up (or GELU[up]) -> hidden buffer
    SCORES = 6  # int32 scores -> softmax
    PV = 7  # attention output int8 -> activation buffer
    LOGITS = 8  # int32 -> argmax
    LORA_A = 9  # LoRA A a, rescaled to int16 -> the t16 registers
    POST = 10  # int16 -> the norm unit: a post-sublayer norm's input (o, down: Gemma 2, 3), added to the residual after


class Source(enum.Enum, shape=3):
    """Where the MAC lanes' activations come from."""

    ACT = 0  # norm output or attention output
    HID = 1  # MLP hidden
    Q = 2  # rotated q
    PROBS = 3  # softmax probabilities


class MvStart(list):
    """The statements that start a matrix-vector product, and what they start (for LoRA)."""

    def __init__(self, stmts: list, tensor: object, chunks: object, src: Source) -> None:
        super().__init__(stmts)
        self.tensor, self.chunks, self.src = tensor, chunks, src

    def plus(self, stmts: list) -> MvStart:
        """The same start with more statements."""
        return MvStart([*self, *stmts], self.tensor, self.chunks, self.src)


class Reader:
    """Element reader `r` of a BankedVector, read one element at a time (`addr`, `data`) or as a run (`run`)."""

    def __init__(self, vector: BankedVector, r: int) -> None:
        self.addr, self.data, self.run = vector.rd_base[r], vector.rd_values[r][0], vector.rd_values[r]


@dataclass(frozen=True)
class Dims:
    """The sizes every stage builds to: the engine's shape (the plan) and the model's widths."""

    plan: HardwarePlan
    lanes: int  # MACs per row unit: the width of a buffer word
    rows: int  # row units
    wide: int  # epilogue lanes: rows per beat through the epilogue
    d: int  # d_model
    hd: int  # head width
    ctx: int  # context
    kvdim: int  # K (or V) elements of all heads
    qdim: int  # q elements of all heads
    attn_rows: int  # rows of the attention products: the KV cache's banks
    gated: bool  # a gated MLP (GLU) rather than one activation table
    raw_bits: int  # q and k as projected, before the rotation: int8 or int12
    post_norms: bool  # o and down write into their post-sublayer norms (Mode.POST), not the residual (Gemma 2, 3)
    c_ctx: int  # words of the context (probabilities, a row of V transposed)
    c_kv: int  # words of K (all heads) at one position

    @classmethod
    def of(cls, qm: QModel, plan: HardwarePlan) -> Dims:
        cfg = qm.config
        raw = {lin.out_bits for layer in qm.layers for lin in (layer.q, layer.k)}  # q, k into RoPE (or copied)
        if len(raw) != 1 or not raw <= {8, 12}:
            raise ValueError(f"q and k projections must all output int8 or all int12 (RoPE input); got {sorted(raw)}")
        kvdim = cfg.n_kv_heads * cfg.head_dim
        return cls(plan=plan, lanes=plan.lanes, rows=plan.rows, wide=plan.epilogue_lanes, d=cfg.d_model,
                   hd=cfg.head_dim, ctx=qm.context, kvdim=kvdim, qdim=cfg.n_heads * cfg.head_dim,
                   attn_rows=plan.attn_rows(cfg.head_dim), gated=cfg.gated, raw_bits=raw.pop(),
                   post_norms=any(layer.post_attn_norm is not None for layer in qm.layers),
                   c_ctx=plan.chunks(qm.context), c_kv=kvdim // plan.lanes)

    def chunks(self, n: int) -> int:
        """Words of `lanes` elements that hold n elements."""
        return self.plan.chunks(n)

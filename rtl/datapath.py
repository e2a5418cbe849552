"""What the decoder's stages share: the engine's modes and sources, and the Datapath they build together.

The Decoder is built in stages, one file each: its memories and units (rtl/decoder_units.py), the
engine's address generator (rtl/decoder_engine.py), the epilogue with its destinations
(rtl/decoder_epilogue.py), the units that run beside the schedule (rtl/decoder_side.py) and the
schedule's FSM (rtl/decoder_schedule.py). Each stage reads what the earlier ones put on the
Datapath and adds its own signals; docs/hardware.md draws the whole.
"""

from __future__ import annotations

from amaranth.hdl import Module
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


class Datapath:
    """The module being built and every signal, port and unit that more than one stage uses.

    A plain namespace, filled in stage order: each stage's function documents what it adds.
    """

    def __init__(self, m: Module, qm: QModel, plan: HardwarePlan) -> None:
        self.m, self.qm, self.plan = m, qm, plan
        cfg = qm.config
        self.lanes, self.rows, self.wide = plan.lanes, plan.rows, plan.epilogue_lanes
        self.d, self.hd, self.ctx = cfg.d_model, cfg.head_dim, qm.context
        self.kvdim, self.qdim = cfg.n_kv_heads * cfg.head_dim, cfg.n_heads * cfg.head_dim
        self.attn_rows = plan.attn_rows(cfg.head_dim)
        self.gated = cfg.gated
        raw = {lin.out_bits for layer in qm.layers for lin in (layer.q, layer.k)}  # q, k into RoPE (or copied)
        if len(raw) != 1 or not raw <= {8, 12}:
            raise ValueError(f"q and k projections must all output int8 or all int12 (RoPE input); got {sorted(raw)}")
        self.raw_bits = raw.pop()
        self.c_ctx, self.c_kv = plan.chunks(qm.context), self.kvdim // plan.lanes

    def chunks(self, n: int) -> int:
        return self.plan.chunks(n)

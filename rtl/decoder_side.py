"""The units that run beside the schedule once started: the norm feeder, the RoPE driver and the head norm driver.

The norm unit takes the residual either as the residual update streams it (fused: a beat per beat the
epilogue writes) or from the residual memory, and writes its output words into the activation buffer.
RoPE rotates q while the K projection runs and k while V runs, and ends itself. A per-head q/k norm (Qwen3)
normalises raw q (or raw k) head by head in place, before its rotation starts, and ends itself.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, Value, signed

from ..quant.qmodel import QModel
from .datapath import Dims
from .decoder_control import Control
from .decoder_memories import Buffers, KvCache, Vectors
from .norm import NormUnit
from .rope import Rope
from .word_runs import beat_bank_write, lane_group_write, run_into


class NormLink:
    """A residual update streamed into the norm unit, beat by beat as it is written: the epilogue's residual stage
    drives it (and the embedding, an element a beat), the norm feeder takes it and drives `ready`. Created before
    both: the feeder is built after the epilogue."""

    def __init__(self, wide: int) -> None:
        self.values = [Signal(signed(16), name=f"resid_new{e}") for e in range(wide)]  # the residual's new values
        self.valid, self.count = Signal(), Signal(range(wide + 1))  # a beat of `count` values
        self.ready = Signal(init=1, name="norm_in_ready")  # the beat is taken: 1 unless a fused norm holds it


class NormFeeder:
    """The feeder's registers: the schedule starts a norm site (`start`), the feeder counts its elements in and its
    words out, and `done` says the output is in the activation buffer."""

    def __init__(self, d: int, norm_words: int, names: list[str]) -> None:
        self._names = names
        self.n_in, self.n_out = Signal(range(d + 1)), Signal(range(norm_words + 1))  # elements in, words out
        self.sel = Signal(range(max(2, len(names))), name="norm_sel")  # the site
        self.done, self.running, self.fused = Signal(), Signal(), Signal()  # fused: fed by the residual update

    def start(self, key: str) -> list:
        """The statements that start norm site `key` (its feeder's counters at zero)."""
        return [self.running.eq(1), self.sel.eq(self._names.index(key)), self.n_in.eq(0), self.n_out.eq(0)]


def build_norm_feeder(m: Module, dims: Dims, norm_unit: NormUnit, norm_names: list[str], vectors: Vectors,
                      buffers: Buffers, link: NormLink) -> NormFeeder:
    """The norm unit's input, fused or from the residual memory, and its output words into the act buffer."""
    d, wide = dims.d, dims.wide
    norm_words = -(-d // norm_unit.lanes)
    f = NormFeeder(d, norm_words, norm_names)
    m.d.comb += norm_unit.site.eq(f.sel)
    with m.If(f.running):
        with m.If(f.fused):  # fed by the residual update's epilogue, a beat per beat it writes
            m.d.comb += [norm_unit.i.valid.eq(link.valid), norm_unit.i.payload.count.eq(link.count),
                         link.ready.eq(norm_unit.i.ready)]
            m.d.comb += [norm_unit.i.payload.values[e].eq(link.values[e]) for e in range(wide)]
        with m.Else():  # fed from the residual memory
            m.d.comb += [norm_unit.i.valid.eq(f.n_in < d), norm_unit.i.payload.values[0].eq(vectors.resid_rd.data),
                         norm_unit.i.payload.count.eq(1)]
        m.d.comb += norm_unit.o.ready.eq(1)
        with m.If(norm_unit.i.valid & norm_unit.i.ready):
            m.d.sync += f.n_in.eq(f.n_in + norm_unit.i.payload.count)
        with m.If(norm_unit.o.valid):  # a word of vector_lanes elements into its lanes of an act word
            m.d.sync += f.n_out.eq(f.n_out + 1)
            lane_group_write(m, buffers.wr["act"], f.n_out, norm_unit.o.payload, dims.lanes)
    m.d.comb += f.done.eq(f.n_out == norm_words)
    return f


class RopeDriver:
    """The driver's registers: the schedule starts a rotation of q or k (`start`), which ends itself (`running`
    falls)."""

    def __init__(self, qdim: int) -> None:
        self.pair_in, self.pair_out = Signal(range(qdim // 2 + 1)), Signal(range(qdim // 2 + 1))  # pairs in, out
        self.is_k, self.running = Signal(), Signal()
        self.pairs = Signal(range(qdim // 2 + 1), name="rope_pairs")  # pairs to rotate: all of q, or of k

    def start(self, is_k: bool, pairs: int) -> list:
        """The statements that start rotating `pairs` pairs of k (is_k) or q."""
        return [self.running.eq(1), self.is_k.eq(is_k), self.pairs.eq(pairs), self.pair_in.eq(0), self.pair_out.eq(0)]


def build_rope_driver(m: Module, qm: QModel, dims: Dims, rope: Rope | None, vectors: Vectors, buffers: Buffers,
                      kv: KvCache, control: Control) -> RopeDriver:
    """Pairs (head, i) from raw q or k through the RoPE unit into q (rotated) or the K cache at this position."""
    hd, qdim = dims.hd, dims.qdim
    drv = RopeDriver(qdim)
    if rope is None:
        return drv
    half, heads = hd // 2, max(2, qm.config.n_heads)
    hi, ii = Signal(range(heads)), Signal(range(max(2, half)))
    rq1, rq2, rk1, rk2 = vectors.rq1, vectors.rq2, vectors.rk1, vectors.rk2
    m.d.comb += [hi.eq(drv.pair_in // half), ii.eq(drv.pair_in % half),
                 rq1.addr.eq(hi * hd + ii), rq2.addr.eq(hi * hd + ii + half),
                 rk1.addr.eq(hi * hd + ii), rk2.addr.eq(hi * hd + ii + half),
                 rope.i.valid.eq(drv.running & (drv.pair_in < drv.pairs)),
                 rope.i.payload.x1.eq(Mux(drv.is_k, rk1.data, rq1.data)),
                 rope.i.payload.x2.eq(Mux(drv.is_k, rk2.data, rq2.data)),
                 rope.i.payload.pos.eq(control.position), rope.i.payload.pair.eq(ii)]
    with m.If(rope.i.valid & rope.i.ready):
        m.d.sync += drv.pair_in.eq(drv.pair_in + 1)
    # each result is two elements, hd/2 apart: write y1 now, y2 from a holding register next cycle
    ho, io = Signal(range(heads)), Signal(range(max(2, half)))
    second, second_el, second_val = Signal(), Signal(range(qdim)), Signal(signed(8))
    write_el, write_val, write_en = Signal(range(qdim)), Signal(signed(8)), Signal()
    m.d.comb += [ho.eq(drv.pair_out // half), io.eq(drv.pair_out % half), rope.o.ready.eq(~second)]
    with m.If(second):
        m.d.comb += [write_el.eq(second_el), write_val.eq(second_val), write_en.eq(1)]
        m.d.sync += second.eq(0)
    with m.Elif(rope.o.valid):
        m.d.comb += [write_el.eq(ho * hd + io), write_val.eq(rope.o.payload.y1), write_en.eq(1)]
        m.d.sync += [drv.pair_out.eq(drv.pair_out + 1), second.eq(1), second_el.eq(ho * hd + io + half),
                     second_val.eq(rope.o.payload.y2)]
    with m.If(~drv.is_k):
        q_write(m, dims, buffers, write_el, write_val, write_en)
    with m.Else():
        k_write(m, dims, kv, control, write_el, write_val, write_en)
    # the rotation runs beside the schedule (q during the K projection, k during V): it ends itself
    with m.If(drv.running & (drv.pair_out == drv.pairs) & ~second):
        m.d.sync += drv.running.eq(0)
    return drv


def q_write(m: Module, dims: Dims, buffers: Buffers, el: Value, val: Value, en: Value) -> None:
    """One element of q (rotated, or copied) into its lane of the qrot buffer."""
    port, lanes = buffers.wr["qrot"], dims.lanes
    m.d.comb += [port.addr.eq(el // lanes), port.en.eq(Mux(en, 1 << (el % lanes), 0))]
    m.d.comb += [port.data[j].eq(val) for j in range(lanes)]


def k_write(m: Module, dims: Dims, kv: KvCache, control: Control, el: Value, val: Value, en: Value) -> None:
    """One element of k (rotated, or copied) into this layer's K cache at its slot (bank slot % attn_rows): the
    position, or in a windowed layer the position's slot of the ring."""
    slot = control.kv_slot
    beat_bank_write(m, kv.k_wr, slot, control.layer_sel * kv.k_layer + (slot // dims.attn_rows) * dims.c_kv +
                    el // dims.lanes, el % dims.lanes, [val], 1, en)


class HeadNormDriver:
    """The head norm driver's registers: the schedule starts the per-head norm of raw q or raw k (`start`), which
    ends itself (`running` falls) once every head is back in place."""

    def __init__(self, qdim: int, sites: int) -> None:
        self.n_in, self.n_out = Signal(range(qdim + 1)), Signal(range(qdim + 1))  # elements in, elements written back
        self.count = Signal(range(qdim + 1), name="head_norm_count")  # elements of all heads: q's or k's
        self.sel = Signal(range(max(2, sites)), name="head_norm_sel")  # the site: 2 * layer + (1 for k)
        self.is_k, self.running = Signal(), Signal()

    def start(self, layer: int, is_k: bool, count: int) -> list:
        """The statements that start normalising the `count` elements (whole heads) of raw k (is_k) or raw q."""
        return [self.running.eq(1), self.is_k.eq(is_k), self.sel.eq(2 * layer + is_k), self.count.eq(count),
                self.n_in.eq(0), self.n_out.eq(0)]


def build_head_norm_driver(m: Module, qm: QModel, dims: Dims, unit: NormUnit | None, vectors: Vectors) -> HeadNormDriver:
    """Raw q or raw k, an element per cycle, through the head-wide norm unit (one head per vector: its input waits
    while the unit finishes a head) and back into the same places, int12 (numerics §6)."""
    drv = HeadNormDriver(max(dims.qdim, dims.kvdim), 2 * qm.config.n_layers)
    if unit is None:
        return drv
    m.d.comb += [unit.site.eq(drv.sel), unit.o.ready.eq(1)]
    with m.If(drv.running):
        m.d.comb += [unit.i.payload.count.eq(1), vectors.rq1.addr.eq(drv.n_in), vectors.rk1.addr.eq(drv.n_in),
                     unit.i.valid.eq(drv.n_in < drv.count),
                     unit.i.payload.values[0].eq(Mux(drv.is_k, vectors.rk1.data, vectors.rq1.data))]
        with m.If(unit.i.valid & unit.i.ready):
            m.d.sync += drv.n_in.eq(drv.n_in + 1)
        with m.If(unit.o.valid):  # element n_out, normalised, back into its place
            m.d.sync += drv.n_out.eq(drv.n_out + 1)
            for vec, is_k in ((vectors.raw_q, 0), (vectors.raw_k, 1)):
                run_into(m, vec, drv.n_out, [unit.o.payload[0]], 1, drv.is_k == is_k)
        with m.If((drv.n_out == drv.count) & ~unit.o.valid):
            m.d.sync += drv.running.eq(0)
    return drv

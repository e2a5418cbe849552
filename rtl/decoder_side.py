"""The units that run beside the schedule once started: the norm feeder and the RoPE driver.

The norm unit takes the residual either as the residual update streams it (fused: a beat per beat the
epilogue writes) or from the residual memory, and writes its output words into the activation buffer.
RoPE rotates q while the K projection runs and k while V runs, and ends itself.
"""

from __future__ import annotations

from amaranth.hdl import Const, Mux, Signal, signed

from .datapath import Datapath
from .word_runs import beat_bank_write, lane_group_write


class NormLink:
    """A residual update streamed into the norm unit, beat by beat as it is written: the epilogue's residual stage
    drives it (and the embedding, an element a beat), the norm feeder takes it and drives `ready`. Created before
    both: the feeder is built after the epilogue."""

    def __init__(self, wide: int) -> None:
        self.values = [Signal(signed(16), name=f"resid_new{e}") for e in range(wide)]  # the residual's new values
        self.valid, self.count = Signal(), Signal(range(wide + 1))  # a beat of `count` values
        self.ready = Signal(init=1, name="norm_in_ready")  # the norm takes it (always, unless it is loading)


def build_norm_feeder(dp: Datapath) -> None:
    """Adds: norm_running, norm_fused, norm_sel, n_in, n_out, norm_done."""
    m, d, norm_unit, wide = dp.m, dp.d, dp.norm_unit, dp.wide
    norm_words = -(-d // norm_unit.lanes)
    dp.n_in, dp.n_out = Signal(range(d + 1)), Signal(range(norm_words + 1))
    dp.norm_sel = Signal(range(max(2, len(dp.norm_names))))
    dp.norm_done, dp.norm_running, dp.norm_fused = Signal(), Signal(), Signal()
    m.d.comb += norm_unit.site.eq(dp.norm_sel)
    with m.If(dp.norm_running):
        with m.If(dp.norm_fused):  # fed by the residual update's epilogue, a beat per beat it writes
            m.d.comb += [norm_unit.i.valid.eq(dp.resid_took), norm_unit.i.payload.count.eq(dp.resid_beat),
                         dp.norm_in_ready.eq(norm_unit.i.ready)]
            m.d.comb += [norm_unit.i.payload.values[e].eq(dp.resid_new[e]) for e in range(wide)]
        with m.Else():  # fed from the residual memory
            m.d.comb += [norm_unit.i.valid.eq(dp.n_in < d), norm_unit.i.payload.values[0].eq(dp.resid_rd.data),
                         norm_unit.i.payload.count.eq(1)]
        m.d.comb += norm_unit.o.ready.eq(1)
        with m.If(norm_unit.i.valid & norm_unit.i.ready):
            m.d.sync += dp.n_in.eq(dp.n_in + norm_unit.i.payload.count)
        with m.If(norm_unit.o.valid):  # a word of vector_lanes elements into its lanes of an act word
            m.d.sync += dp.n_out.eq(dp.n_out + 1)
            lane_group_write(m, dp.wr["act"], dp.n_out, norm_unit.o.payload, dp.lanes)
    m.d.comb += dp.norm_done.eq(dp.n_out == norm_words)


def norm_start(dp: Datapath, key: str) -> list:
    """The statements that start norm site `key` (its feeder's counters at zero)."""
    return [dp.norm_running.eq(1), dp.norm_sel.eq(dp.norm_names.index(key)), dp.n_in.eq(0), dp.n_out.eq(0)]


def build_rope_driver(dp: Datapath) -> None:
    """Pairs (head, i) from raw q or k through the RoPE unit into q (rotated) or the K cache at this position.
    Adds: rope_running, rope_is_k, rope_pairs, pair_in, pair_out, rope_second."""
    m, hd, qdim, rope = dp.m, dp.hd, dp.qdim, dp.rope
    dp.pair_in, dp.pair_out = Signal(range(qdim // 2 + 1)), Signal(range(qdim // 2 + 1))
    dp.rope_is_k, dp.rope_running = Signal(), Signal()
    dp.rope_pairs = Signal(range(qdim // 2 + 1))
    if rope is None:
        dp.rope_second = Const(0)
        return
    half, heads = hd // 2, max(2, dp.qm.config.n_heads)
    hi, ii = Signal(range(heads)), Signal(range(max(2, half)))
    m.d.comb += [hi.eq(dp.pair_in // half), ii.eq(dp.pair_in % half),
                 dp.rq1.addr.eq(hi * hd + ii), dp.rq2.addr.eq(hi * hd + ii + half),
                 dp.rk1.addr.eq(hi * hd + ii), dp.rk2.addr.eq(hi * hd + ii + half),
                 rope.i.valid.eq(dp.rope_running & (dp.pair_in < dp.rope_pairs)),
                 rope.i.payload.x1.eq(Mux(dp.rope_is_k, dp.rk1.data, dp.rq1.data)),
                 rope.i.payload.x2.eq(Mux(dp.rope_is_k, dp.rk2.data, dp.rq2.data)),
                 rope.i.payload.pos.eq(dp.position), rope.i.payload.pair.eq(ii)]
    with m.If(rope.i.valid & rope.i.ready):
        m.d.sync += dp.pair_in.eq(dp.pair_in + 1)
    # each result is two elements, hd/2 apart: write y1 now, y2 from a holding register next cycle
    ho, io = Signal(range(heads)), Signal(range(max(2, half)))
    second, second_el, second_val = Signal(), Signal(range(qdim)), Signal(signed(8))
    write_el, write_val, write_en = Signal(range(qdim)), Signal(signed(8)), Signal()
    m.d.comb += [ho.eq(dp.pair_out // half), io.eq(dp.pair_out % half), rope.o.ready.eq(~second)]
    with m.If(second):
        m.d.comb += [write_el.eq(second_el), write_val.eq(second_val), write_en.eq(1)]
        m.d.sync += second.eq(0)
    with m.Elif(rope.o.valid):
        m.d.comb += [write_el.eq(ho * hd + io), write_val.eq(rope.o.payload.y1), write_en.eq(1)]
        m.d.sync += [dp.pair_out.eq(dp.pair_out + 1), second.eq(1), second_el.eq(ho * hd + io + half),
                     second_val.eq(rope.o.payload.y2)]
    with m.If(~dp.rope_is_k):
        q_write(dp, write_el, write_val, write_en)
    with m.Else():
        k_write(dp, write_el, write_val, write_en)
    # the rotation runs beside the schedule (q during the K projection, k during V): it ends itself
    with m.If(dp.rope_running & (dp.pair_out == dp.rope_pairs) & ~second):
        m.d.sync += dp.rope_running.eq(0)
    dp.rope_second = second


def q_write(dp: Datapath, el: object, val: object, en: object) -> None:
    """One element of q (rotated, or copied) into its lane of the qrot buffer."""
    port, lanes = dp.wr["qrot"], dp.lanes
    dp.m.d.comb += [port.addr.eq(el // lanes), port.en.eq(Mux(en, 1 << (el % lanes), 0))]
    dp.m.d.comb += [port.data[j].eq(val) for j in range(lanes)]


def k_write(dp: Datapath, el: object, val: object, en: object) -> None:
    """One element of k (rotated, or copied) into this layer's K cache at its slot (bank slot % attn_rows): the
    position, or in a windowed layer the position's slot of the ring."""
    slot = dp.kv_slot
    beat_bank_write(dp.m, dp.k_wr, slot, dp.layer_sel * dp.k_layer + (slot // dp.attn_rows) * dp.c_kv +
                    el // dp.lanes, el % dp.lanes, [val], 1, en)

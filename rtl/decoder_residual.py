"""The residual written an element a cycle, each element handed to the norm unit that loads it (when one does): the
embedding's or a chain's received elements, and a post-sublayer norm's output added to it (Gemma 2, Gemma 3).

A product writes the residual a beat at a time through the epilogue's residual stages; these states write it
without the engine, one element per cycle, as the reference's `saturate(x + out, 16)` does element by element.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, Value, signed

from .datapath import Dims
from .decoder_memories import Buffers, Vectors
from .decoder_side import NormLink
from .rescale import saturate

ToNorm = tuple[Signal, Signal, Signal]  # the norm unit's input while a residual write loads it: value, strobe, count


def to_norm(link: NormLink) -> ToNorm:
    """The link's first lane, its strobe and its count: an element per beat into the norm unit."""
    return link.values[0], link.valid, link.count


def residual_element(m: Module, vectors: Vectors, index: Value, value: Value, into_norm: ToNorm | None) -> None:
    """Element `index` of the residual written with `value`, and handed to the norm unit when it loads it (one per
    beat)."""
    resid = vectors.resid
    m.d.comb += [resid.wr_base.eq(index), resid.wr_values[0].eq(value), resid.wr_count.eq(1), resid.wr_en.eq(1)]
    if into_norm is not None:
        m.d.comb += [into_norm[0].eq(value), into_norm[1].eq(1), into_norm[2].eq(1)]


def post_add_states(m: Module, name: str, nxt: str, *, dims: Dims, vectors: Vectors, buffers: Buffers, link: NormLink,
                    index: Signal, start_norm: list, loads_norm: bool) -> None:
    """residual += a post-sublayer norm's output (numerics §5), which the norm unit left in the activation buffer.

    NAME addresses the buffer's first word and starts the norm site the sums load (`start_norm`, when `loads_norm`);
    NAME_RUN then adds element j (the buffer's synchronous read: its word was addressed the cycle before) to residual
    element j, saturates, writes it and hands it to the norm unit, an element per cycle while the unit takes it (it
    always does here), so the next norm is loaded when the last sum is written: d + 1 cycles in these states;
    plan.py's post_add phase counts d + 2 with the hand-over to the state after (equal to the simulated cycles)."""
    act, lanes, d = buffers.rd["act"], dims.lanes, dims.d
    with m.State(name):
        m.d.comb += [act.addr.eq(0), act.en.eq(1)]  # over the engine's address: it is idle
        m.d.sync += [index.eq(0), *start_norm]
        m.next = name + "_RUN"
    with m.State(name + "_RUN"):
        take = Signal(name=f"{name.lower()}_take")
        normed = Signal(signed(16), name=f"{name.lower()}_normed")  # the norm unit saturated it to int16
        total = Signal(signed(17), name=f"{name.lower()}_sum")
        m.d.comb += take.eq(link.ready if loads_norm else 1)
        with m.Switch(index % lanes):
            for lane in range(lanes):
                with m.Case(lane):
                    m.d.comb += normed.eq(act.data[lane])
        m.d.comb += [vectors.resid_rd.addr.eq(index), total.eq(vectors.resid_rd.data + normed),
                     act.en.eq(1), act.addr.eq(Mux(take, (index + 1) // lanes, index // lanes))]
        with m.If(take):
            residual_element(m, vectors, index, saturate(total, 16), to_norm(link) if loads_norm else None)
            m.d.sync += index.eq(index + 1)
            with m.If(index == d - 1):
                m.d.sync += index.eq(0)
                m.next = nxt

"""Row serializer: the row-parallel engine's `rows` sums of one group, handed on in row order.

The engine finishes `rows` output rows together every `chunks` cycles; the epilogue (bias,
rescale, LoRA term, destination) takes `lanes` rows per cycle (`wide` high) or one (`wide`
low: the destinations that take one element at a time). While `chunks` cycles are enough to
hand a group on, the engine never waits; otherwise it stalls until the serializer has handed
on all but the last beat of the group before.
"""

from __future__ import annotations

from amaranth.hdl import Elaboratable, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out


def group_layout(rows: int, width: int) -> data.StructLayout:
    return data.StructLayout({
        "values": data.ArrayLayout(signed(width), rows),  # row r of the group in values[r]
        "count": range(rows + 1),  # how many of them are real rows (the last group of a matrix may be short)
    })


class RowSerializer(wiring.Component):
    """Groups of up to `rows` values in; out, in order, beats of up to `lanes` of the first `count` (one when
    `wide` is low). A beat's `count` says how many of its values are rows; values[0] is the earliest row."""

    def __init__(self, rows: int, width: int, lanes: int = 1) -> None:
        if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= 64:
            self._MustUse__silence = True
            raise ValueError(f"rows must be an int from 1 to 64, got {rows!r}")
        if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1 or lanes & (lanes - 1) or rows % lanes:
            self._MustUse__silence = True
            raise ValueError(f"lanes must be a power of two that divides rows ({rows}), got {lanes!r}")
        self.rows, self.width, self.lanes = rows, width, lanes
        super().__init__({
            "i": In(stream.Signature(group_layout(rows, width))),
            "wide": In(1),  # hand on `lanes` rows per beat, else one; holds from a group's entry to its last beat
            "o": Out(stream.Signature(group_layout(lanes, width))),
        })

    def elaborate(self, platform: object) -> Elaboratable:
        m = Module()
        rows, lanes = self.rows, self.lanes
        held = Signal(data.ArrayLayout(signed(self.width), rows))  # a shift register: held[0] goes out next
        left = Signal(range(rows + 1))
        m.d.comb += self.o.valid.eq(left != 0)
        if lanes == 1:  # one row per beat (no compare that lint would find constant)
            m.d.comb += [self.o.payload.count.eq(left != 0), self.i.ready.eq((left == 0) | ((left == 1) & self.o.ready))]
        else:
            step = Signal(range(lanes + 1))  # rows per beat
            m.d.comb += [step.eq(Mux(self.wide, lanes, 1)), self.o.payload.count.eq(Mux(left < step, left, step)),
                         self.i.ready.eq((left == 0) | ((left <= step) & self.o.ready))]
        m.d.comb += [self.o.payload.values[e].eq(held[e]) for e in range(lanes)]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [held.eq(self.i.payload.values), left.eq(self.i.payload.count)]
        with m.Elif(self.o.valid & self.o.ready):
            m.d.sync += left.eq(left - self.o.payload.count)
            with m.If(self.wide):
                m.d.sync += [held[r].eq(held[r + lanes]) for r in range(rows - lanes)]
            with m.Else():
                m.d.sync += [held[r].eq(held[r + 1]) for r in range(rows - 1)]
        return m

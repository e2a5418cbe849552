"""Row serializer: the row-parallel engine's `rows` sums of one group, handed on one per cycle.

The engine finishes `rows` output rows together every `chunks` cycles; the epilogue (bias,
rescale, LoRA term, destination) takes one row per cycle, in row order. While `chunks >=
rows` the epilogue keeps up and the engine never waits; otherwise the engine stalls until
the serializer has handed on all but the last row of the group before.
"""

from __future__ import annotations

from amaranth.hdl import Elaboratable, Module, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out


def group_layout(rows: int, width: int) -> data.StructLayout:
    return data.StructLayout({
        "values": data.ArrayLayout(signed(width), rows),  # row r of the group in values[r]
        "count": range(rows + 1),  # how many of them are real rows (the last group of a matrix may be short)
    })


class RowSerializer(wiring.Component):
    """Groups of up to `rows` values in, the first `count` of each out one at a time, in order."""

    def __init__(self, rows: int, width: int) -> None:
        if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= 64:
            self._MustUse__silence = True
            raise ValueError(f"rows must be an int from 1 to 64, got {rows!r}")
        self.rows, self.width = rows, width
        super().__init__({
            "i": In(stream.Signature(group_layout(rows, width))),
            "o": Out(stream.Signature(signed(width))),
        })

    def elaborate(self, platform: object) -> Elaboratable:
        m = Module()
        held = Signal(data.ArrayLayout(signed(self.width), self.rows))  # a shift register: held[0] goes out next
        left = Signal(range(self.rows + 1))
        m.d.comb += [self.o.valid.eq(left != 0), self.o.payload.eq(held[0]),
                     self.i.ready.eq((left == 0) | ((left == 1) & self.o.ready))]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [held.eq(self.i.payload.values), left.eq(self.i.payload.count)]
        with m.Elif(self.o.valid & self.o.ready):
            m.d.sync += left.eq(left - 1)
            m.d.sync += [held[r].eq(held[r + 1]) for r in range(self.rows - 1)]
        return m

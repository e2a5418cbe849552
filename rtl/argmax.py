"""Argmax: the index of the largest value in a row, ties to the lowest index (docs/numerics.md §8).

The decoder's last step turns the logits into a token id (`quant.blocks.argmax`). Values arrive
one per cycle; a running maximum replaces the best only on a strictly greater value, so the
first of equal maxima (the lowest index) wins. The index is emitted one cycle after the row's
`last` value is accepted, so rows follow back to back at one value per cycle.

Input is held off (ready low) only while a result waits to be taken. A row longer than
max_count keeps its first max_count values: the extra ones are accepted and ignored (the row
still ends at `last`), and the sticky `overflow` output is set until reset.
"""

from __future__ import annotations

from amaranth.hdl import Elaboratable, Module, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out


def value_layout(value_bits: int) -> data.StructLayout:
    return data.StructLayout({"value": signed(value_bits), "last": 1})


class Argmax(wiring.Component):
    """Stream of values (`last` on a row's final one) in, one index per row out."""

    def __init__(self, value_bits: int, max_count: int) -> None:
        if not 1 <= value_bits <= 64:
            self._MustUse__silence = True  # a refused component is not an unused one
            raise ValueError(f"value_bits must be between 1 and 64, got {value_bits}")
        if max_count < 1:
            self._MustUse__silence = True
            raise ValueError(f"max_count must be at least 1, got {max_count}")
        self.value_bits = value_bits
        self.max_count = max_count
        self.index_bits = max(1, (max_count - 1).bit_length())
        super().__init__({
            "i": In(stream.Signature(value_layout(value_bits))),
            "o": Out(stream.Signature(unsigned(self.index_bits))),
            "overflow": Out(1),  # sticky: some row had more than max_count values
        })

    def elaborate(self, platform: object) -> Elaboratable:
        m = Module()
        count = Signal(range(self.max_count + 1))  # values seen in this row (up to max_count)
        best = Signal(signed(self.value_bits))
        best_index = Signal(self.index_bits)
        take = Signal()  # this value is in range and the new best of the row
        index = Signal(self.index_bits)  # the row's argmax including the value being accepted
        in_range = count < self.max_count
        m.d.comb += [
            self.i.ready.eq(~self.o.valid | self.o.ready),
            take.eq(in_range & ((count == 0) | (self.i.payload.value > best))),
            index.eq(best_index),
        ]
        with m.If(take):
            m.d.comb += index.eq(count)

        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(self.i.valid & self.i.ready):
            with m.If(take):
                m.d.sync += [best.eq(self.i.payload.value), best_index.eq(count)]
            with m.If(~in_range):
                m.d.sync += self.overflow.eq(1)
            with m.If(self.i.payload.last):
                m.d.sync += [count.eq(0), self.o.payload.eq(index), self.o.valid.eq(1)]
            with m.Elif(in_range):
                m.d.sync += count.eq(count + 1)
        return m

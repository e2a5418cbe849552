"""Argmax: the index of the largest value in a row, ties to the lowest index (docs/numerics.md §8).

The decoder's last step turns the logits into a token id (`quant.blocks.argmax`). Values arrive
in beats of up to `lanes` (the epilogue's width), `count` of them real, in row order. Within a
beat a chain of strict compares picks the first of the beat's maxima; a running maximum then
replaces the best only on a strictly greater value, so the first of equal maxima (the lowest
index) wins. Two stages: the beat's winner is registered, then compared with the running maximum (in one
cycle the chain was the ECP5 critical path). The index is emitted LATENCY cycles after the beat
carrying the row's `last` value is accepted, and rows follow back to back at one beat per cycle.

Input is held off (ready low) only while a result waits to be taken. A row longer than
max_count keeps its first max_count values: the extra ones are accepted and ignored (the row
still ends at `last`), and the sticky `overflow` output is set until reset.
"""

from __future__ import annotations

from amaranth.hdl import Elaboratable, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

LATENCY = 2  # cycles from accepting a row's last beat to its index at the output


def value_layout(value_bits: int, lanes: int = 1) -> data.StructLayout:
    return data.StructLayout({"values": data.ArrayLayout(signed(value_bits), lanes),
                              "count": range(1, lanes + 1),  # real values in this beat, values[0] first
                              "last": 1})  # the beat ends the row


class Argmax(wiring.Component):
    """Stream of beats of values (`last` on a row's final beat) in, one index per row out."""

    def __init__(self, value_bits: int, max_count: int, lanes: int = 1) -> None:
        if not 1 <= value_bits <= 64:
            self._MustUse__silence = True  # a refused component is not an unused one
            raise ValueError(f"value_bits must be between 1 and 64, got {value_bits}")
        if max_count < 1:
            self._MustUse__silence = True
            raise ValueError(f"max_count must be at least 1, got {max_count}")
        if isinstance(lanes, bool) or not isinstance(lanes, int) or not 1 <= lanes <= 64:
            self._MustUse__silence = True
            raise ValueError(f"lanes must be an int from 1 to 64, got {lanes!r}")
        self.value_bits, self.max_count, self.lanes = value_bits, max_count, lanes
        self.index_bits = max(1, (max_count - 1).bit_length())
        super().__init__({
            "i": In(stream.Signature(value_layout(value_bits, lanes))),
            "o": Out(stream.Signature(unsigned(self.index_bits))),
            "overflow": Out(1),  # sticky: some row had more than max_count values
        })

    def elaborate(self, platform: object) -> Elaboratable:
        m = Module()
        beat = self.i.payload
        count = Signal(range(self.max_count + self.lanes + 1))  # values seen in this row before this beat
        # stage 1: the beat's own winner (lane 0, replaced down the chain by a strictly greater real, in-range value)
        live = [Signal(name=f"live{e}") for e in range(self.lanes)]
        m.d.comb += [live[e].eq((e < beat.count) & (count + e < self.max_count)) for e in range(self.lanes)]
        win, win_lane = beat.values[0], 0
        for e in range(1, self.lanes):
            better = Signal(name=f"better{e}")
            m.d.comb += better.eq(live[e] & (beat.values[e] > win))
            win, win_lane = Mux(better, beat.values[e], win), Mux(better, e, win_lane)
        held = Signal()  # stage 1 holds a beat's winner for stage 2
        held_win, held_index = Signal(signed(self.value_bits)), Signal(range(self.max_count + self.lanes))
        held_first, held_live, held_last = Signal(), Signal(), Signal()
        # stage 2: the running best of the row, replaced only on a strictly greater value
        best = Signal(signed(self.value_bits))
        best_index = Signal(self.index_bits)
        free = Signal()  # stage 2 takes stage 1's beat: nothing waits at the output, or it is taken now
        take = Signal()  # stage 1's winner is the new best of the row
        index = Signal(self.index_bits)  # the row's argmax including stage 1's beat
        m.d.comb += [
            free.eq(~self.o.valid | self.o.ready),
            self.i.ready.eq(~held | free),
            take.eq(held_live & (held_first | (held_win > best))),
            index.eq(Mux(take, held_index, best_index)),
        ]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(held & free):
            m.d.sync += held.eq(0)
            with m.If(take):
                m.d.sync += [best.eq(held_win), best_index.eq(index)]
            with m.If(held_last):
                m.d.sync += [self.o.payload.eq(index), self.o.valid.eq(1)]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [held.eq(1), held_win.eq(win), held_index.eq(count + win_lane), held_first.eq(count == 0),
                         held_live.eq(live[0]), held_last.eq(beat.last)]
            with m.If(count + beat.count > self.max_count):
                m.d.sync += self.overflow.eq(1)
            with m.If(beat.last):
                m.d.sync += count.eq(0)
            with m.Elif(count < self.max_count):
                m.d.sync += count.eq(count + beat.count)
        return m

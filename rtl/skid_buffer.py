"""Skid buffer: a stream register whose `i.ready` and `o.valid` both come straight from flip-flops.

A pipeline stalled by its consumer's `ready` turns that `ready` into a combinational chain back
through every stage, and into the clock enable of all their registers: on the ECP5 that chain and
its fanout set the clock. A skid buffer cuts it: `i.ready` is "the spare register is empty", so a
payload offered while the output stalls lands in the spare, and nothing upstream waits on the
consumer in the same cycle. One cycle of latency, one payload per cycle, no bubbles.
"""

from __future__ import annotations

from amaranth.hdl import Elaboratable, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

LATENCY = 1  # cycles from a payload's transfer on `i` to its appearance on `o`


class SkidBuffer(wiring.Component):
    """Stream of `shape` in, the same stream out a cycle later; holds two payloads at most."""

    def __init__(self, shape: object) -> None:
        self.shape = shape
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform: object) -> Elaboratable:
        m = Module()
        spare_valid = Signal()
        spare = Signal.like(self.i.payload)
        m.d.comb += self.i.ready.eq(~spare_valid)
        with m.If(~self.o.valid | self.o.ready):  # the output register is free this cycle
            with m.If(spare_valid):
                m.d.sync += [self.o.payload.eq(spare), spare_valid.eq(0)]
            with m.Else():
                m.d.sync += [self.o.payload.eq(self.i.payload), self.o.valid.eq(self.i.valid)]
        with m.Elif(self.i.valid & ~spare_valid):  # the output stalls: the offered payload waits in the spare
            m.d.sync += [spare.eq(self.i.payload), spare_valid.eq(1)]
        return m

"""SoftCap: Gemma 2's attention soft-cap on a score's way into the softmax (docs/numerics.md §6).

The epilogue has already rescaled the score to t, in units of c / K (the layer's cap multiplier); the cap is
c tanh(s / c), which in those units is K tanh(t / K): odd, so one table of its values at |t| = 0 .. N serves both
signs, and past N it is K (the table's last entry). The read is combinational (a ROM of N + 1 words of
bits(K) + 1), so the scores reach the softmax's input register in the same cycle as without a cap.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from amaranth.hdl import Elaboratable, Module, Mux, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

SCORE_BITS = 32  # the epilogue's rescaled score, clamped to int32


class SoftCap(wiring.Component):
    """t (int32, units of c / K) in, sign(t) * TANH[min(|t|, N)] out, combinationally."""

    def __init__(self, table: Sequence[int]) -> None:
        values = [int(v) for v in table]
        if not values or values[0] != 0 or any(b < a for a, b in itertools.pairwise(values)):
            raise ValueError("a soft-cap table starts at 0 and never decreases (K tanh(i / K), i = 0 .. N)")
        self.table = values
        self.out_bits = values[-1].bit_length() + 1
        super().__init__({"t": In(signed(SCORE_BITS)), "capped": Out(signed(self.out_bits))})

    def elaborate(self, platform: object) -> Elaboratable:
        m = Module()
        last = len(self.table) - 1
        m.submodules.table = table = Memory(shape=unsigned(self.out_bits - 1), depth=last + 1, init=self.table)
        read = table.read_port(domain="comb")
        magnitude = Mux(self.t < 0, -self.t, self.t)  # up to 2**31: 33 bits signed, non-negative
        m.d.comb += read.addr.eq(Mux(magnitude > last, last, magnitude))
        m.d.comb += self.capped.eq(Mux(self.t < 0, -read.data, read.data))
        return m

"""Reciprocal: floor(2**numerator_bits / d), the one division of the decode path (docs/numerics.md §6).

The softmax needs recip = floor(2**30 / total) once per row, so a small iterative
restoring divider (one quotient bit per cycle) costs far less than a divider array and
is exact by construction. A caller that guarantees d >= 2**min_divisor_bits (the softmax:
total >= 2**15, because the maximum element contributes EXP[0] = 2**15) gets a shorter
quotient and fewer cycles: quotient_bits = numerator_bits - min_divisor_bits + 1, which is
also the number of cycles per division.

Timing: a divisor accepted at clock edge k gives o.valid after edge k + quotient_bits; the
result is held until taken, and a new divisor is accepted in the cycle the result is taken,
so back to back divisions take quotient_bits + 1 cycles each.
"""

from __future__ import annotations

from amaranth.hdl import Elaboratable, Module, Signal, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out


class Reciprocal(wiring.Component):
    """Stream of divisors d in, stream of floor(2**numerator_bits / d) out.

    d must be >= max(1, 2**min_divisor_bits); the result is undefined otherwise (d = 0 with
    min_divisor_bits = 0 gives all ones, as a restoring divider does).
    """

    def __init__(self, divisor_bits: int, numerator_bits: int = 30, min_divisor_bits: int = 0) -> None:
        if not 1 <= divisor_bits <= 64:
            self._MustUse__silence = True  # a refused component is not an unused one
            raise ValueError(f"divisor_bits must be between 1 and 64, got {divisor_bits}")
        if not 1 <= numerator_bits <= 64:
            self._MustUse__silence = True
            raise ValueError(f"numerator_bits must be between 1 and 64, got {numerator_bits}")
        if not 0 <= min_divisor_bits <= min(numerator_bits, divisor_bits - 1):
            self._MustUse__silence = True
            raise ValueError(f"min_divisor_bits must be between 0 and {min(numerator_bits, divisor_bits - 1)}, "
                             f"got {min_divisor_bits}")
        self.divisor_bits = divisor_bits
        self.numerator_bits = numerator_bits
        self.min_divisor_bits = min_divisor_bits
        self.quotient_bits = numerator_bits - min_divisor_bits + 1  # also the cycles per division
        super().__init__({
            "i": In(stream.Signature(unsigned(divisor_bits))),
            "o": Out(stream.Signature(unsigned(self.quotient_bits))),
        })

    def elaborate(self, platform: object) -> Elaboratable:
        m = Module()
        q_bits = self.quotient_bits
        # The numerator 2**N, split: the bits above the quotient positions form the starting remainder
        # (2**(k-1) for k = min_divisor_bits >= 1, which is < d by the precondition, so those quotient bits
        # are 0), the low q_bits bits are shifted in one per cycle (only 2**N itself when k = 0).
        numerator = 1 << self.numerator_bits
        start_rem = numerator >> q_bits
        start_low = numerator & ((1 << q_bits) - 1)

        divisor = Signal(self.divisor_bits)
        remainder = Signal(self.divisor_bits)  # always < divisor
        low = Signal(q_bits)  # numerator bits still to shift in, MSB first
        count = Signal(range(q_bits + 1))  # quotient bits still to compute
        busy = Signal()
        trial = Signal(self.divisor_bits + 1)  # 2 * remainder + next numerator bit < 2 * divisor
        m.d.comb += [
            trial.eq((remainder << 1) | low[-1]),
            self.i.ready.eq(~busy & (~self.o.valid | self.o.ready)),
        ]

        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [
                divisor.eq(self.i.payload),
                remainder.eq(start_rem),
                low.eq(start_low),
                count.eq(q_bits),
                busy.eq(1),
            ]
        with m.Elif(busy):
            # o.payload doubles as the quotient shift register: it is not valid while busy
            quotient_bit = trial >= divisor
            with m.If(quotient_bit):
                m.d.sync += remainder.eq(trial - divisor)
            with m.Else():
                m.d.sync += remainder.eq(trial)
            m.d.sync += [
                self.o.payload.eq((self.o.payload << 1) | quotient_bit),
                low.eq(low << 1),
                count.eq(count - 1),
            ]
            with m.If(count == 1):
                m.d.sync += [busy.eq(0), self.o.valid.eq(1)]
        return m

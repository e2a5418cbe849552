"""Rescale: the one way the datapath changes scale (docs/numerics.md §1).

out = saturate_bits(round_shift(value * mult, shift)): multiply by an unsigned 15-bit
multiplier, add half, shift right arithmetically, clamp. Three pipeline stages, one
result per cycle, stalled as a whole when the output is not taken.
"""

from __future__ import annotations

from amaranth.hdl import Const, Elaboratable, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

MULT_BITS = 15
SHIFT_BITS = 6


def saturate(value: Value, bits: int) -> Value:
    """value clamped to the signed `bits`-bit range (the saturation every block of the datapath applies)."""
    hi, lo = (1 << (bits - 1)) - 1, -(1 << (bits - 1))
    return Mux(value > hi, hi, Mux(value < lo, lo, value))


def rescale_layout(value_bits: int) -> data.StructLayout:
    return data.StructLayout({"value": signed(value_bits), "mult": unsigned(MULT_BITS), "shift": unsigned(SHIFT_BITS)})


class Rescale(wiring.Component):
    """Stream of (value, mult, shift) in, stream of saturated `out_bits` results out."""

    def __init__(self, value_bits: int, out_bits: int) -> None:
        if not 2 <= value_bits <= 64:
            self._MustUse__silence = True  # a refused component is not an unused one
            raise ValueError(f"value_bits must be between 2 and 64, got {value_bits}")
        if not 2 <= out_bits <= value_bits + MULT_BITS:
            self._MustUse__silence = True
            raise ValueError(f"out_bits must be between 2 and {value_bits + MULT_BITS}, got {out_bits}")
        self.value_bits = value_bits
        self.out_bits = out_bits
        super().__init__({
            "i": In(stream.Signature(rescale_layout(value_bits))),
            "o": Out(stream.Signature(signed(out_bits))),
        })

    def elaborate(self, platform: object) -> Elaboratable:
        m = Module()
        # wide enough for value * mult, for 2**(shift - 1) at the largest shift, and for their sum
        product_bits = max(self.value_bits + MULT_BITS, (1 << SHIFT_BITS) - 1) + 2
        advance = Signal()
        m.d.comb += [advance.eq(~self.o.valid | self.o.ready), self.i.ready.eq(advance)]

        # stage 1: product
        p_valid = Signal()
        product = Signal(signed(product_bits))
        half = Signal(signed(product_bits))  # 2**(shift - 1): shift >= 1 by construction
        shift = Signal(SHIFT_BITS)
        # stage 2: rounded shift
        r_valid = Signal()
        rounded = Signal(signed(product_bits))
        with m.If(advance):
            m.d.sync += [
                p_valid.eq(self.i.valid),
                product.eq(self.i.payload.value * self.i.payload.mult),
                half.eq(Const(1, 1) << (self.i.payload.shift - 1)[:SHIFT_BITS]),
                shift.eq(self.i.payload.shift),
                r_valid.eq(p_valid),
                rounded.eq((product + half) >> shift),
                self.o.valid.eq(r_valid),
            ]
            m.d.sync += self.o.payload.eq(saturate(rounded, self.out_bits))
        return m

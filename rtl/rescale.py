"""Rescale: the one way the datapath changes scale (docs/numerics.md §1).

out = saturate_bits(round_shift(value * mult, shift)): multiply by an unsigned 15-bit
multiplier, add half, shift right arithmetically, clamp. Five pipeline stages (inputs,
partial products, their sum, the shift, the clamp), so that no stage holds more than one
hard multiplier or one wide carry chain: one result per cycle, stalled as a whole when
the output is not taken.
"""

from __future__ import annotations

from amaranth.hdl import Const, Elaboratable, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .mac_array import balanced_sum

MULT_BITS = 15
SHIFT_BITS = 6
LATENCY = 5  # cycles from a value's transfer on `i` to its result on `o`
LIMB_BITS = 17  # the value is multiplied in limbs of 17 bits (18 for the signed top one): one MULT18X18D each


def value_limbs(value_bits: int) -> list[tuple[int, int]]:
    """(lowest bit, width) of each limb of a `value_bits` value, lowest first; the top limb takes up to 18 bits."""
    limbs, low = [], 0
    while value_bits - low > LIMB_BITS + 1:
        limbs.append((low, LIMB_BITS))
        low += LIMB_BITS
    return [*limbs, (low, value_bits - low)]


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
        limbs = value_limbs(self.value_bits)

        # stage 1: the inputs, registered (what feeds them selects among every tensor's constants)
        v1, value, mult, shift1 = Signal(), Signal(signed(self.value_bits)), Signal(MULT_BITS), Signal(SHIFT_BITS)
        # stage 2: a partial product per limb of the value (one hard multiplier each) and 2**(shift - 1)
        v2, shift2 = Signal(), Signal(SHIFT_BITS)
        partials = [Signal(signed(width + MULT_BITS + 1), name=f"partial{k}") for k, (_, width) in enumerate(limbs)]
        half = Signal(signed(product_bits))  # shift >= 1 by construction
        # stage 3: value * mult + half, the partials summed as a balanced tree
        v3, shift3 = Signal(), Signal(SHIFT_BITS)
        product = Signal(signed(product_bits))
        # stage 4: the rounding shift; the clamp goes on the way out
        v4 = Signal()
        rounded = Signal(signed(product_bits))
        top = len(limbs) - 1  # the top limb carries the sign, the others are unsigned
        limb_values = [value[low:low + width].as_signed() if k == top else value[low:low + width]
                       for k, (low, width) in enumerate(limbs)]
        with m.If(advance):
            m.d.sync += [
                v1.eq(self.i.valid), value.eq(self.i.payload.value), mult.eq(self.i.payload.mult),
                shift1.eq(self.i.payload.shift),
                v2.eq(v1), shift2.eq(shift1), half.eq(Const(1, 1) << (shift1 - 1)[:SHIFT_BITS]),
                *(partial.eq(limb * mult) for partial, limb in zip(partials, limb_values, strict=True)),
                v3.eq(v2), shift3.eq(shift2),
                product.eq(balanced_sum([half] + [partials[k] << low for k, (low, _) in enumerate(limbs)])),
                v4.eq(v3), rounded.eq(product >> shift3),
                self.o.valid.eq(v4), self.o.payload.eq(saturate(rounded, self.out_bits)),
            ]
        return m

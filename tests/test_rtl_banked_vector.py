"""rtl.BankedVector: runs of consecutive elements written and read in one cycle, from any start."""

from __future__ import annotations

import random

import pytest
from amaranth.hdl import Elaboratable, Module, signed
from rtl_sim import run

from hardwire.rtl.banked_vector import BankedVector


class _Harness(Elaboratable):
    def __init__(self, size: int, banks: int) -> None:
        self.module = Module()  # built once, so that the testbench drives the signals the simulator runs
        self.vector = BankedVector(self.module, "v", signed(8), size, banks, readers=2)

    def elaborate(self, platform):
        return self.module


@pytest.mark.parametrize(("size", "banks"), [(10, 1), (13, 4), (16, 8), (7, 2)])
def test_runs_from_any_start_read_back_what_was_written(size, banks):
    rng = random.Random(size * banks)
    dut = _Harness(size, banks)
    model = [0] * size
    checked = []

    async def bench(ctx):
        vec = dut.vector
        for _ in range(200):
            base = rng.randrange(size)
            count = rng.randint(1, min(banks, size - base))
            values = [rng.randint(-128, 127) for _ in range(banks)]
            ctx.set(vec.wr_base, base)
            ctx.set(vec.wr_count, count)
            for e in range(banks):
                ctx.set(vec.wr_values[e], values[e])
            ctx.set(vec.wr_en, rng.random() < 0.8)
            enabled = ctx.get(vec.wr_en)
            await ctx.tick()
            ctx.set(vec.wr_en, 0)
            if enabled:
                model[base:base + count] = values[:count]
            for r in range(2):
                start = rng.randrange(size)
                ctx.set(vec.rd_base[r], start)
                got = [ctx.get(vec.rd_values[r][e]) for e in range(min(banks, size - start))]
                assert got == model[start:start + len(got)], (start, got)
                checked.append(len(got))

    run(dut, bench)
    assert len(checked) == 400

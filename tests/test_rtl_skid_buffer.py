"""rtl.SkidBuffer: every payload once, in order, under random idle input and backpressure; registered ready."""

from __future__ import annotations

import random

import pytest
from amaranth.hdl import signed
from rtl_sim import run, stream_through, stream_through_timed

from hardwire.rtl.skid_buffer import LATENCY, SkidBuffer


@pytest.mark.parametrize("idle,stall", [(0.0, 0.0), (0.3, 0.0), (0.0, 0.5), (0.4, 0.4), (0.1, 0.8)])
def test_skid_buffer_passes_every_payload_in_order(idle, stall):
    rng = random.Random(int(idle * 10 + stall * 100))
    values = [rng.randint(-(1 << 15), (1 << 15) - 1) for _ in range(400)] + [-(1 << 15), (1 << 15) - 1, 0]
    assert stream_through(SkidBuffer(signed(16)), values, rng, idle=idle, stall=stall) == values


def test_skid_buffer_has_one_cycle_of_latency_and_no_bubbles():
    accepted, taken = stream_through_timed(SkidBuffer(signed(8)), list(range(20)))
    assert LATENCY == 1 and accepted == list(range(1, 21))  # one payload per cycle
    assert [cycle for cycle, _ in taken] == list(range(2, 22)) and [v for _, v in taken] == list(range(20))


def test_skid_buffer_ready_does_not_follow_the_consumer_in_the_same_cycle():
    """i.ready is a register: dropping o.ready lowers it no earlier than the next cycle, and only once the spare
    holds a payload."""
    dut = SkidBuffer(signed(8))
    seen: list[tuple[int, int]] = []

    async def bench(ctx):
        ctx.set(dut.i.valid, 1)
        ctx.set(dut.i.payload, 7)
        ctx.set(dut.o.ready, 1)
        await ctx.tick()
        ctx.set(dut.o.ready, 0)  # the consumer stalls: ready must not drop combinationally
        seen.append((ctx.get(dut.i.ready), ctx.get(dut.o.valid)))
        await ctx.tick()
        seen.append((ctx.get(dut.i.ready), ctx.get(dut.o.valid)))
        await ctx.tick()
        seen.append((ctx.get(dut.i.ready), ctx.get(dut.o.valid)))

    run(dut, bench)
    assert seen == [(1, 1), (0, 1), (0, 1)]

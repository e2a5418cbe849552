"""Helpers for testing rtl/ blocks in Amaranth's simulator against quant/ reference functions."""

from __future__ import annotations

import random
from collections.abc import Iterable

from amaranth.sim import Simulator


async def send(ctx, port, payloads: Iterable[object], rng: random.Random | None = None, idle: float = 0.0) -> None:
    """Drive a stream: each payload once, with random idle cycles (valid low) when rng is given."""
    for payload in payloads:
        while rng is not None and rng.random() < idle:
            ctx.set(port.valid, 0)
            await ctx.tick()
        ctx.set(port.payload, payload)
        ctx.set(port.valid, 1)
        await ctx.tick().until(port.ready)
    ctx.set(port.valid, 0)


async def receive(ctx, port, count: int, rng: random.Random | None = None, stall: float = 0.0) -> list[object]:
    """Collect `count` payloads from a stream, holding ready low at random (backpressure) when rng is given."""
    out: list[object] = []
    while len(out) < count:
        ready = not (rng is not None and rng.random() < stall)
        ctx.set(port.ready, ready)
        _, _, valid, payload = await ctx.tick().sample(port.valid, port.payload)
        if ready and valid:
            out.append(payload)
    ctx.set(port.ready, 0)
    return out


async def send_timed(ctx, port, payloads: Iterable[object], accepted: list[int]) -> None:
    """Drive a stream with no idle cycles; append the cycle (from 1) at which each payload was accepted."""
    cycle = 0
    ctx.set(port.valid, 1)
    for payload in payloads:
        ctx.set(port.payload, payload)
        while True:
            _, _, ready = await ctx.tick().sample(port.ready)
            cycle += 1
            if ready:
                accepted.append(cycle)
                break
    ctx.set(port.valid, 0)


async def receive_timed(ctx, port, count: int, taken: list[tuple[int, object]]) -> None:
    """Hold ready high until `count` payloads are taken; append (cycle from 1, payload) for each."""
    ctx.set(port.ready, 1)
    cycle = 0
    while len(taken) < count:
        _, _, valid, payload = await ctx.tick().sample(port.valid, port.payload)
        cycle += 1
        if valid:
            taken.append((cycle, payload))


def stream_through(dut, payloads: list[object], rng: random.Random | None = None, idle: float = 0.0,
                   stall: float = 0.0) -> list[object]:
    """Send every payload into dut.i (random idle cycles) and collect as many from dut.o (random backpressure)."""
    got: list[object] = []

    async def producer(ctx):
        await send(ctx, dut.i, payloads, rng, idle=idle)

    async def consumer(ctx):
        got.extend(await receive(ctx, dut.o, len(payloads), rng, stall=stall))

    run(dut, producer, consumer)
    return got


def stream_through_timed(dut, payloads: list[object]) -> tuple[list[int], list[tuple[int, object]]]:
    """dut.i offered a payload every cycle, dut.o always ready: -> the cycle each payload was accepted, and
    (cycle, payload) of each one out (cycles from 1)."""
    accepted: list[int] = []
    taken: list[tuple[int, object]] = []

    async def producer(ctx):
        await send_timed(ctx, dut.i, payloads, accepted)

    async def consumer(ctx):
        await receive_timed(ctx, dut.o, len(payloads), taken)

    run(dut, producer, consumer)
    return accepted, taken


def decode(dut, feed: list[tuple[int, bool]], generate: int, rng: random.Random,
           lora_writes: Iterable[tuple[int, int]] = (), deadline_cycles: int = 200_000) -> tuple[list[int], list]:
    """Drive a Decoder: LoRA words through its write port (random gaps), then feed tokens (token, new_seq)
    and generate by feeding each output back, with random output backpressure. -> outputs, [(tokens, cycles)]."""
    outputs: list[int] = []
    status: list = []

    async def testbench(ctx):
        for addr, value in lora_writes:
            ctx.set(dut.lora.payload, {"addr": addr, "data": value})
            ctx.set(dut.lora.valid, 1)
            await ctx.tick().until(dut.lora.ready)
            if rng.random() < 0.3:
                ctx.set(dut.lora.valid, 0)
                await ctx.tick()
        ctx.set(dut.lora.valid, 0)

        async def one(token: int, new_seq: bool) -> int:
            ctx.set(dut.tokens.payload, {"token": token, "new_seq": new_seq})
            ctx.set(dut.tokens.valid, 1)
            await ctx.tick().until(dut.tokens.ready)
            ctx.set(dut.tokens.valid, 0)
            while True:
                ready = rng.random() < 0.7  # output backpressure
                ctx.set(dut.out.ready, ready)
                _, _, valid, payload = await ctx.tick().sample(dut.out.valid, dut.out.payload)
                if ready and valid:
                    ctx.set(dut.out.ready, 0)
                    return int(payload)

        for token, new_seq in feed:
            outputs.append(await one(token, new_seq))
        for _ in range(generate):
            outputs.append(await one(outputs[-1], False))
        status.append((ctx.get(dut.status.tokens), ctx.get(dut.status.cycles)))

    run(dut, testbench, deadline_cycles=deadline_cycles)
    return outputs, status


def run(dut, *testbenches, deadline_cycles: int = 1_000_000, vcd: str | None = None) -> None:
    """Simulate until every testbench returns; fail (instead of hanging) after deadline_cycles clocks."""
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    finished: list[bool] = []

    def wrap(tb):
        async def wrapped(ctx):
            await tb(ctx)
            finished.append(True)
        return wrapped

    async def watchdog(ctx):
        step = 256
        for _ in range(0, deadline_cycles, step):
            if len(finished) == len(testbenches):
                return
            await ctx.tick().repeat(step)
        raise AssertionError(f"simulation did not finish within {deadline_cycles} cycles")

    for tb in testbenches:
        sim.add_testbench(wrap(tb))
    sim.add_testbench(watchdog)
    if vcd:
        with sim.write_vcd(vcd):
            sim.run()
    else:
        sim.run()

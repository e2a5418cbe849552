"""rtl.Reciprocal against floor(2**N / d): the softmax configuration and a general one, idle input, backpressure."""

from __future__ import annotations

import random

import pytest
from amaranth.back import verilog
from rtl_sim import run, send, stream_through

from hardwire.rtl.reciprocal import Reciprocal


def _check(dut: Reciprocal, divisors: list[int], rng: random.Random, idle: float, stall: float) -> None:
    got = stream_through(dut, divisors, rng, idle=idle, stall=stall)
    assert got == [(1 << dut.numerator_bits) // d for d in divisors]


def test_reciprocal_softmax_configuration():
    """total in [2**15, 2**15 * max_len] (max_len = 100 here): the quotient is 16 bits, 16 cycles each."""
    rng = random.Random(1)
    max_total = (1 << 15) * 100
    dut = Reciprocal(max_total.bit_length(), 30, 15)
    assert dut.quotient_bits == 16
    edges = [1 << 15, (1 << 15) + 1, (1 << 16) - 1, max_total, max_total - 1, (1 << max_total.bit_length()) - 1]
    edges += [1 << k for k in range(15, max_total.bit_length())]
    divisors = edges + [rng.randint(1 << 15, max_total) for _ in range(40)]
    _check(dut, divisors, rng, idle=0.3, stall=0.3)


@pytest.mark.parametrize("divisor_bits,numerator_bits,min_divisor_bits", [(12, 30, 0), (8, 5, 2), (20, 10, 10)])
def test_reciprocal_general(divisor_bits, numerator_bits, min_divisor_bits):
    rng = random.Random(divisor_bits * 100 + numerator_bits)
    lo, hi = max(1, 1 << min_divisor_bits), (1 << divisor_bits) - 1
    divisors = [lo, lo + 1, hi, hi - 1] + [1 << k for k in range(min_divisor_bits, divisor_bits)]
    divisors += [rng.randint(lo, hi) for _ in range(20)]
    _check(Reciprocal(divisor_bits, numerator_bits, min_divisor_bits), divisors, rng, idle=0.2, stall=0.2)


def test_reciprocal_back_to_back_throughput():
    """No idle input, output always ready: one division every quotient_bits + 1 cycles; first result after quotient_bits."""
    dut = Reciprocal(24, 30, 15)
    divisors = [1 << 15, 3 << 15, (1 << 24) - 1]
    cycles: list[int] = []

    async def producer(ctx):
        await send(ctx, dut.i, divisors)

    async def consumer(ctx):
        ctx.set(dut.o.ready, 1)
        cycle = 0
        while len(cycles) < len(divisors):
            _, _, valid = await ctx.tick().sample(dut.o.valid)
            cycle += 1
            if valid:
                cycles.append(cycle)

    run(dut, producer, consumer)
    # the first divisor is accepted at edge 1; its result is valid after edge 1 + 16 and taken at edge 18
    assert cycles == [18, 35, 52]


def test_reciprocal_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"^divisor_bits must be between 1 and 64, got 0$"):
        Reciprocal(0)
    with pytest.raises(ValueError, match=r"^numerator_bits must be between 1 and 64, got 65$"):
        Reciprocal(16, 65)
    with pytest.raises(ValueError, match=r"^min_divisor_bits must be between 0 and 15, got 16$"):
        Reciprocal(16, 30, 16)
    with pytest.raises(ValueError, match=r"^min_divisor_bits must be between 0 and 4, got -1$"):
        Reciprocal(16, 4, -1)


def test_reciprocal_converts_to_verilog():
    dut = Reciprocal(22, 30, 15)
    assert "module" in verilog.convert(dut, name="reciprocal")

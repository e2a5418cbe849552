"""rtl.Rope against quant.blocks.rope: every (position, pair), random and extreme x, idle input, backpressure."""

from __future__ import annotations

import random

import pytest
import torch
from amaranth.back import verilog
from amaranth.sim import Simulator
from rtl_sim import receive, run, send

from hardwire.quant.blocks import rope
from hardwire.quant.fixedpoint import round_shift
from hardwire.quant.tables import ROPE_BITS, rope_tables
from hardwire.rtl.rope import LATENCY, Rope

EXTREMES = [(127, 127), (-128, -128), (127, -128), (-128, 127), (0, 0), (1, -1), (-128, 0), (0, -128), (127, 0)]


def _reference(cos: torch.Tensor, sin: torch.Tensor, cases: list[tuple[int, int, int, int]],
               frac: int = 0) -> list[tuple[int, int]]:
    """blocks.rope on one head per case: x is zero except the pair (x[pair], x[pair + half])."""
    half = cos.shape[1]
    x = torch.zeros(len(cases), 1, 2 * half, dtype=torch.int64)
    for n, (x1, x2, _, pair) in enumerate(cases):
        x[n, 0, pair], x[n, 0, pair + half] = x1, x2
    positions = torch.tensor([pos for _, _, pos, _ in cases], dtype=torch.int64)
    y = rope(x, cos[positions], sin[positions], frac)
    return [(int(y[n, 0, pair]), int(y[n, 0, pair + half])) for n, (_, _, _, pair) in enumerate(cases)]


def _unsaturated(cos: torch.Tensor, sin: torch.Tensor, cases: list[tuple[int, int, int, int]]) -> list[int]:
    """Rotations before the final int8 saturation, to check that the cases do clip."""
    out = []
    for x1, x2, pos, pair in cases:
        c, s = int(cos[pos, pair]), int(sin[pos, pair])
        out += round_shift(torch.tensor([x1 * c - x2 * s, x2 * c + x1 * s]), ROPE_BITS).tolist()
    return out


def _simulate(dut: Rope, cases: list[tuple[int, int, int, int]], rng: random.Random) -> list[tuple[int, int]]:
    got: list[tuple[int, int]] = []

    async def producer(ctx):
        await send(ctx, dut.i, [{"x1": x1, "x2": x2, "pos": p, "pair": i} for x1, x2, p, i in cases], rng, idle=0.2)

    async def consumer(ctx):
        got.extend((y.y1, y.y2) for y in await receive(ctx, dut.o, len(cases), rng, stall=0.3))

    run(dut, producer, consumer)
    return got


@pytest.mark.parametrize("head_dim", [8, 32])
def test_rope_matches_reference(head_dim):
    rng = random.Random(head_dim)
    cos, sin = rope_tables(head_dim, 10000.0, 16)
    pairs = [(p, i) for p in range(cos.shape[0]) for i in range(cos.shape[1])]
    cases = [(x1, x2, p, i) for p, i in pairs for x1, x2 in EXTREMES]
    cases += [(rng.randint(-128, 127), rng.randint(-128, 127), p, i) for p, i in pairs for _ in range(2)]
    rng.shuffle(cases)
    unsaturated = _unsaturated(cos, sin, cases)
    assert max(unsaturated) > 127 and min(unsaturated) < -128  # saturating rotations are covered
    assert _simulate(Rope(cos, sin), cases, rng) == _reference(cos, sin, cases)


def test_rope_of_int12_inputs_rounds_once():
    """q and k reach RoPE as int12 with 4 more fraction bits: the shift is 18, extremes -2048 and 2047
    (|x1*cos - x2*sin| up to 2**26), against blocks.rope(frac=4), which rounds only after the rotation."""
    rng = random.Random(12)
    cos, sin = rope_tables(16, 10000.0, 8)
    extremes = [(2047, 2047), (-2048, -2048), (2047, -2048), (-2048, 2047), (0, 0), (8, -8), (7, 9), (-2048, 0)]
    pairs = [(p, i) for p in range(cos.shape[0]) for i in range(cos.shape[1])]
    cases = [(x1, x2, p, i) for p, i in pairs for x1, x2 in extremes]
    cases += [(rng.randint(-2048, 2047), rng.randint(-2048, 2047), p, i) for p, i in pairs for _ in range(3)]
    cases += [(rng.randint(-40, 40), rng.randint(-40, 40), p, i) for p, i in pairs for _ in range(3)]  # halves
    rng.shuffle(cases)
    got = _simulate(Rope(cos, sin, in_bits=12), cases, rng)
    assert got == _reference(cos, sin, cases, frac=4)
    assert got != _reference(cos, sin, [(round(x1 / 16), round(x2 / 16), p, i) for x1, x2, p, i in cases])
    assert {127, -128} <= {y for pair in got for y in pair}  # saturation reached


def test_rope_refuses_bad_input_width():
    cos, sin = rope_tables(8, 10000.0, 2)
    with pytest.raises(ValueError, match=r"^in_bits must be between 8 and 16, got 20$"):
        Rope(cos, sin, in_bits=20)


def test_rope_exact_angles():
    """0, 45, 90 and 180 degrees: +-2**14 entries, -128 * -2**14 = 2**21, 127 * sqrt(2) clipping, the int24 sum bound."""
    cos = [[16384, 11585, 0, -16384], [-11585, 16384, 0, 1], [-16384, 16384, 16384, -16384]]
    sin = [[0, 11585, 16384, 0], [11585, 0, -16384, -1], [16384, -16384, 16384, -16384]]
    cases = [(x1, x2, p, i) for p in range(3) for i in range(4) for x1, x2 in EXTREMES]
    cases += [(x1, x2, p, i) for p in range(3) for i in range(4) for x1, x2 in ((3, 5), (-7, 2), (64, -64), (100, 90))]
    rng = random.Random(7)
    got = _simulate(Rope(cos, sin), cases, rng)
    assert got == _reference(torch.tensor(cos), torch.tensor(sin), cases)
    assert got[cases.index((-128, -128, 0, 3))] == (127, 127)  # 180 degrees: -(-128) clips to 127
    assert got[cases.index((127, 127, 0, 1))] == (0, 127)  # 45 degrees: y2 = 127 * sqrt(2) clips
    # |cos| = |sin| = 2**14 together (accepted, though no real table has it): x1*cos - x2*sin = 2**22 needs int24
    assert got[cases.index((-128, -128, 2, 0))] == (127, 0)


def test_rope_single_entry_table():
    cos, sin = [[16384]], [[0]]
    dut = Rope(cos, sin)
    assert (dut.pos_bits, dut.pair_bits) == (1, 1)
    cases = [(x1, x2, 0, 0) for x1, x2 in EXTREMES]
    assert _simulate(dut, cases, random.Random(1)) == _reference(torch.tensor(cos), torch.tensor(sin), cases)


def test_rope_throughput_and_latency():
    """No idle input and no backpressure: one pair per cycle; a pair taken at clock edge n is on the output
    (valid) from edge n + LATENCY. sample() reads the values just before each edge, hence range(LATENCY, ...)."""
    cos, sin = rope_tables(8, 10000.0, 4)
    dut = Rope(cos, sin)
    count = 40
    seen: list[int] = []

    async def producer(ctx):
        for n in range(count):
            ctx.set(dut.i.payload, {"x1": n, "x2": -n, "pos": n % 4, "pair": n % 4})
            ctx.set(dut.i.valid, 1)
            await ctx.tick()
        ctx.set(dut.i.valid, 0)

    async def consumer(ctx):
        ctx.set(dut.o.ready, 1)
        cycle = 0
        while len(seen) < count:
            _, _, valid = await ctx.tick().sample(dut.o.valid)
            if valid:
                seen.append(cycle)
            cycle += 1

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(producer)
    sim.add_testbench(consumer)
    sim.run()
    assert seen == list(range(LATENCY, LATENCY + count))


def test_rope_converts_to_verilog():
    cos, sin = rope_tables(8, 10000.0, 16)
    text = verilog.convert(Rope(cos, sin), name="rope")
    assert "module rope" in text


def test_rope_rejects_bad_tables():
    cos, sin = rope_tables(8, 10000.0, 4)
    with pytest.raises(ValueError, match=r"^cos and sin must have the same shape, got \(4, 4\) and \(3, 4\)$"):
        Rope(cos, sin[:3])
    with pytest.raises(ValueError, match=r"^rope tables need at least 1 position and 1 pair, got shape \(0, 4\)$"):
        Rope(cos[:0], sin[:0])
    with pytest.raises(ValueError, match=r"^rope tables need at least 1 position and 1 pair, got shape \(4, 0\)$"):
        Rope(cos[:, :0], sin[:, :0])
    bad = sin.clone()
    bad[2, 1] = 16385
    with pytest.raises(ValueError, match=r"^sin\[2\]\[1\] = 16385 is outside \[-16384, 16384\]$"):
        Rope(cos, bad)
    with pytest.raises(ValueError, match=r"^cos\[0\]\[0\] = -16385 is outside \[-16384, 16384\]$"):
        Rope([[-16385]], [[0]])
    with pytest.raises(ValueError, match=r"^cos must hold integers, got dtype torch.float32$"):
        Rope(cos.float(), sin)
    with pytest.raises(ValueError, match=r"^sin must have 2 dimensions \(positions, half\), got shape \(16,\)$"):
        Rope(cos, sin.flatten())
    with pytest.raises(ValueError, match=r"^cos must hold integers, got 0.5$"):
        Rope([[0.5]], [[0]])
    with pytest.raises(ValueError, match=r"^sin rows must all have the same length$"):
        Rope([[0, 0], [0, 0]], [[0, 0], [0]])

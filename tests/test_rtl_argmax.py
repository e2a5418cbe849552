"""rtl.Argmax against quant.blocks.argmax: ties, extremes, random rows back to back, backpressure, overflow."""

from __future__ import annotations

import random

import pytest
import torch
from amaranth.back import verilog
from rtl_sim import receive, receive_timed, run, send, send_timed

from hardwire.quant import blocks
from hardwire.rtl.argmax import Argmax


def reference(values: list[int]) -> int:
    return int(blocks.argmax(torch.tensor(values, dtype=torch.int64)[None, :])[0])


def beats(rows: list[list[int]], lanes: int, rng: random.Random | None = None, junk: int = 0) -> list[dict]:
    """Each row in beats of 1..lanes values (random sizes when rng is given, else full); the unused lanes hold
    `junk` (the largest value: it would win if counted)."""
    out = []
    for row in rows:
        start = 0
        while start < len(row):
            size = min(len(row) - start, rng.randint(1, lanes) if rng is not None else lanes)
            values = row[start:start + size] + [junk] * (lanes - size)
            out.append({"values": values, "count": size, "last": int(start + size == len(row))})
            start += size
    return out


def simulate(dut: Argmax, rows: list[list[int]], rng: random.Random | None = None, idle: float = 0.0,
             stall: float = 0.0) -> tuple[list[int], int]:
    """Send the rows back to back; -> (one index per row, overflow flag at the end)."""
    got: list[int] = []
    overflow: list[int] = []

    async def producer(ctx):
        await send(ctx, dut.i, beats(rows, dut.lanes, rng, (1 << (dut.value_bits - 1)) - 1), rng, idle=idle)

    async def consumer(ctx):
        got.extend(await receive(ctx, dut.o, len(rows), rng, stall=stall))
        for _ in range(3):  # nothing more comes out
            _, _, valid = await ctx.tick().sample(dut.o.valid)
            assert not valid
        overflow.append(ctx.get(dut.overflow))

    run(dut, producer, consumer)
    return got, overflow[0]


@pytest.mark.parametrize("lanes", [1, 4])
def test_argmax_edge_rows(lanes):
    """Ties at several positions go to the lowest; all equal; negatives; a single value; max last; int32 ends."""
    rng = random.Random(0)
    lo, hi = -(1 << 31), (1 << 31) - 1
    rows = [
        [3, 7, 1, 7, 7, 0], [7, 3, 7], [1, 2, 9, 9], [5] * 8, [-5, -3, -9, -3, -4], [-1], [0], [hi],
        [1, 2, 3, 4, 5, 6, 7, 8], [lo, lo, lo + 1], [lo] * 4, [hi, lo, hi], [lo, hi - 1, hi], [-1, lo, 0, -1],
    ]
    got, overflow = simulate(Argmax(32, 8, lanes), rows, rng, idle=0.3, stall=0.4)
    assert got == [reference(r) for r in rows]
    assert got == [1, 0, 2, 0, 1, 0, 0, 0, 7, 2, 0, 0, 2, 2]
    assert overflow == 0


@pytest.mark.parametrize("value_bits,max_count,lanes", [(32, 100, 1), (8, 13, 1), (2, 5, 1), (32, 100, 8), (8, 13, 2)])
def test_argmax_random_rows(value_bits, max_count, lanes):
    """Random rows of 1..max_count values from a small range (many ties) and the full range."""
    rng = random.Random(value_bits * max_count)
    lo, hi = -(1 << (value_bits - 1)), (1 << (value_bits - 1)) - 1
    rows = []
    for k in range(30):
        a, b = (lo, hi) if k % 2 else (max(lo, -3), min(hi, 3))
        rows.append([rng.randint(a, b) for _ in range(rng.randint(1, max_count))])
    got, _ = simulate(Argmax(value_bits, max_count, lanes), rows, rng, idle=0.2, stall=0.3)
    assert got == [reference(r) for r in rows]


@pytest.mark.parametrize("lanes", [1, 4])
def test_argmax_overflow(lanes):
    """A row longer than max_count: its first max_count values decide, the rest are ignored, `overflow` is set;
    the rows after it are unaffected."""
    rng = random.Random(7)
    rows = [[1, 2], [4, 3, 2, 1, 99, 100], [0, 0, 0, 5], [7]]
    got, overflow = simulate(Argmax(8, 4, lanes), rows, rng, idle=0.2, stall=0.3)
    assert got == [1, 0, 3, 0]
    assert overflow == 1
    got, overflow = simulate(Argmax(8, 4, lanes), [[1, 2, 3, 4]])
    assert (got, overflow) == ([3], 0)  # exactly max_count values is not an overflow


def test_argmax_single_slot():
    """max_count = 1: every index is 0 (a 1-bit output)."""
    got, overflow = simulate(Argmax(8, 1), [[5], [-3], [1, 9]])
    assert (got, overflow) == ([0, 0, 0], 1)


def test_argmax_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"^value_bits must be between 1 and 64, got 0$"):
        Argmax(0, 8)
    with pytest.raises(ValueError, match=r"^max_count must be at least 1, got 0$"):
        Argmax(32, 0)
    with pytest.raises(ValueError, match=r"^lanes must be an int from 1 to 64, got 0$"):
        Argmax(32, 8, 0)


def test_argmax_converts_to_verilog():
    assert "module argmax" in verilog.convert(Argmax(32, 50257), name="argmax")


@pytest.mark.parametrize(("lanes", "rows", "beats_in", "emitted_at"), [
    (1, [[1, 5, 2], [9], [4, 4, 8, 0, 8]], 9, [(5, 1), (6, 0), (11, 2)]),
    (4, [[1, 5, 2, 5, 0, 9, 9, 3], [9, 1, 1, 1], [4, 4, 8, 0, 8, 8, 8, 8]], 5, [(4, 5), (5, 0), (7, 2)]),
])
def test_argmax_one_beat_per_cycle(lanes, rows, beats_in, emitted_at):
    """No idle input, output always ready: rows of full beats back to back at one beat per cycle (one value at one
    lane); the index is taken LATENCY cycles after the row's last beat."""
    dut = Argmax(16, 16, lanes)
    accepted: list[int] = []
    emitted: list[tuple[int, int]] = []

    async def producer(ctx):
        await send_timed(ctx, dut.i, beats(rows, lanes), accepted)

    async def consumer(ctx):
        await receive_timed(ctx, dut.o, len(rows), emitted)

    run(dut, producer, consumer)
    assert accepted == list(range(1, beats_in + 1))
    assert emitted == emitted_at

"""rtl.Softmax against quant.blocks.softmax, row by row: edge rows, random rows, idle input, backpressure, overflow."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch
from amaranth.back import verilog
from rtl_sim import receive, receive_timed, run, send, send_timed

from hardwire.quant import blocks
from hardwire.quant.fixedpoint import multiplier
from hardwire.quant.tables import exp_table
from hardwire.rtl.softmax import Softmax

EXP = exp_table()
S32_MIN, S32_MAX = -(1 << 31), (1 << 31) - 1


def reference(scores: list[int], sm_mult: int, sm_shift: int) -> list[int]:
    n = len(scores)
    row = torch.tensor(scores, dtype=torch.int64)[None, :]
    return blocks.softmax(row, torch.ones(1, n, dtype=torch.bool), sm_mult, sm_shift, EXP, "t")[0].tolist()


def beats(row: list[int], in_lanes: int, wide: bool = True, junk: int = S32_MAX) -> list[dict]:
    """A row as the unit's input beats: full beats of in_lanes scores from the row's start (the last may be
    short), or one score each; unused lanes hold `junk` (the largest score: it would show if it were counted)."""
    step = in_lanes if wide else 1
    out = []
    for start in range(0, len(row), step):
        part = row[start:start + step]
        out.append({"scores": part + [junk] * (in_lanes - len(part)), "count": len(part),
                    "last": int(start + len(part) == len(row))})
    return out


def simulate(dut: Softmax, rows: list[list[int]], rng: random.Random | None = None, idle: float = 0.0,
             stall: float = 0.0) -> tuple[list[list[int]], int]:
    """Send the rows back to back; -> (probabilities grouped by `last`, overflow flag at the end).

    Each row comes out as words of dut.lanes probabilities; the lanes past the row's end must be 0.
    """
    lengths = [min(len(r), dut.max_len) for r in rows]
    count = sum(-(-n // dut.lanes) for n in lengths)
    got: list[tuple[list[int], int]] = []
    overflow: list[int] = []

    async def producer(ctx):
        junk = (1 << (dut.score_bits - 1)) - 1
        payloads = [b for k, r in enumerate(rows) for b in beats(r, dut.in_lanes, k % 2 == 0, junk)]
        await send(ctx, dut.i, payloads, rng, idle=idle)

    async def consumer(ctx):
        got.extend(([int(q) for q in p.probs], p.last) for p in await receive(ctx, dut.o, count, rng, stall=stall))
        for _ in range(5):  # nothing more comes out
            _, _, valid = await ctx.tick().sample(dut.o.valid)
            assert not valid
        overflow.append(ctx.get(dut.overflow))

    run(dut, producer, consumer)
    grouped: list[list[int]] = [[]]
    for probs, last in got:
        grouped[-1].extend(probs)
        if last:
            grouped.append([])
    assert grouped[-1] == [], "the last probability of the last row must carry `last`"
    grouped = grouped[:-1]
    assert len(grouped) == len(rows)
    for row, n in zip(grouped, lengths, strict=True):
        assert len(row) == -(-n // dut.lanes) * dut.lanes and row[n:] == [0] * (len(row) - n)
    return [row[:n] for row, n in zip(grouped, lengths, strict=True)], overflow[0]


def check(dut: Softmax, rows: list[list[int]], rng: random.Random | None = None, idle: float = 0.0,
          stall: float = 0.0) -> list[list[int]]:
    got, overflow = simulate(dut, rows, rng, idle, stall)
    assert overflow == 0
    assert got == [reference(r, dut.sm_mult, dut.sm_shift) for r in rows]
    return got


def test_softmax_edge_rows():
    """Dominant score, all equal, a single score; several lengths; back to back with idle input and backpressure."""
    rng = random.Random(0)
    mult, shift = multiplier(0.01)
    dut = Softmax(16, mult, shift)
    dominant = [-1_000_000] * 5 + [1_000_000] + [-1_000_000] * 2
    equal = [[1234] * n for n in (2, 3, 7, 16)]
    rows = [dominant, [42], *equal, [-7], [S32_MIN]]
    got = check(dut, rows, rng, idle=0.3, stall=0.3)
    assert got[0] == [0] * 5 + [32768] + [0] * 2
    assert got[1] == [32768] == got[-1] == got[-2]
    for row, n in zip(got[2:6], (2, 3, 7, 16), strict=True):
        recip = (1 << 30) // (n << 15)
        assert row == [((1 << 15) * recip + (1 << 14)) >> 15] * n


@pytest.mark.parametrize("max_len,seed,lanes,in_lanes", [(16, 1, 1, 1), (12, 2, 1, 1), (1, 3, 1, 1), (16, 7, 4, 1),
                                                        (13, 8, 8, 1), (5, 9, 8, 1), (16, 10, 4, 4), (13, 11, 8, 2),
                                                        (12, 12, 8, 8)])
def test_softmax_random_rows(max_len, seed, lanes, in_lanes):
    """Random rows of 1..max_len scores at realistic multipliers: scores spread so that z covers 0..255; with
    in_lanes > 1 every other row comes in full beats, the others a score at a time."""
    rng = random.Random(seed)
    for scale in (1e-3, 1.7e-2, 1e-1):
        mult, shift = multiplier(scale)
        dut = Softmax(max_len, mult, shift, lanes=lanes, in_lanes=in_lanes)
        spread = round(160 / scale)  # z = delta * scale reaches 255 and beyond
        rows = [[rng.randint(-spread, spread) for _ in range(rng.randint(1, max_len))] for _ in range(6)]
        rows.append([rng.randint(-spread // 20, spread // 20) for _ in range(max_len)])  # close scores: many e > 0
        check(dut, rows, rng, idle=0.25, stall=0.4)


@pytest.mark.parametrize("lanes", [1, 4])
def test_softmax_sites_use_their_own_constants(lanes):
    """One unit for several sites (a decoder's layers): each row is exact with the constants its `site` selects,
    whose shifts differ; rows of the three sites follow each other in random order."""
    rng = random.Random(lanes)
    scales = (1e-3, 1.7e-2, 1e-1)
    sites = [multiplier(scale) for scale in scales]
    assert len({shift for _, shift in sites}) == 3
    dut = Softmax(12, [m for m, _ in sites], [s for _, s in sites], lanes=lanes)
    order = [rng.randrange(3) for _ in range(9)]
    rows = []
    for site in order:
        spread = round(160 / scales[site])
        rows.append([rng.randint(-spread, spread) for _ in range(rng.randint(1, 12))])
    got: list[list[int]] = []

    async def tb(ctx):
        ctx.set(dut.o.ready, 1)
        for site, row in zip(order, rows, strict=True):
            ctx.set(dut.site, site)  # held until the row's probabilities are out
            await send(ctx, dut.i, beats(row, 1), rng)
            words = await receive(ctx, dut.o, -(-len(row) // lanes), rng, stall=0.3)
            got.append([int(p) for word in words for p in word.probs][:len(row)])

    run(dut, tb)
    assert got == [reference(row, *sites[site]) for site, row in zip(order, rows, strict=True)]


def test_softmax_extreme_scores():
    """The ends of int32: the largest delta (2**32 - 1) at the largest multiplier saturates z; a vanishing
    multiplier makes every z = 0."""
    rng = random.Random(4)
    rows = [[S32_MIN, S32_MAX, S32_MIN, S32_MAX - 1], [S32_MAX] * 3, [S32_MIN, S32_MIN + 1, 0, -1, 1],
            [S32_MAX, S32_MIN]]
    for mult, shift in (((1 << 15) - 1, 1), (1, 62), ((1 << 15) - 1, 62), multiplier(2.0 ** -20), (1 << 14, 40)):
        check(Softmax(8, mult, shift), rows, rng, idle=0.2, stall=0.2)
        check(Softmax(8, mult, shift, lanes=4), rows, rng, idle=0.2, stall=0.2)


def test_softmax_narrow_scores():
    """score_bits below the 16-bit e width: the buffer word is 16 bits, the scores are sign-extended from it."""
    rng = random.Random(5)
    rows = [[-128, 127, 0], [5, 5], [-128], [rng.randint(-128, 127) for _ in range(10)]]
    check(Softmax(10, (1 << 15) - 1, 11, score_bits=8), rows, rng, idle=0.2, stall=0.2)


def test_softmax_overflow():
    """A row longer than max_len: its first max_len scores are used, the rest are dropped, `overflow` is set;
    the rows after it are unaffected."""
    rng = random.Random(6)
    mult, shift = multiplier(0.05)
    dut = Softmax(4, mult, shift)
    long = [10, 20, 30, 40, 9999, -9999]  # the dropped scores would change the maximum and the total
    rows = [[1, 2], long, [5, 6, 7, 8], [300, -300, 0, 12, 13, 14, 15]]
    got, overflow = simulate(dut, rows, rng, idle=0.2, stall=0.3)
    assert overflow == 1
    assert got == [reference(r[:4], mult, shift) for r in rows]
    _, overflow = simulate(Softmax(4, mult, shift), [[1, 2, 3, 4]])
    assert overflow == 0  # exactly max_len scores is not an overflow
    wide = Softmax(6, mult, shift, lanes=4, in_lanes=4)  # a beat that is partly kept: scores 5 and 6 of 8
    got, overflow = simulate(wide, [[*long, 77, -77], [3]], rng, idle=0.2, stall=0.3)
    assert (got, overflow) == ([reference(long, mult, shift), reference([3], mult, shift)], 1)


@pytest.mark.parametrize("n,lanes,in_lanes", [(1, 1, 1), (5, 1, 1), (16, 1, 1), (5, 4, 1), (16, 4, 1), (13, 8, 1),
                                              (16, 4, 4), (13, 8, 4)])
def test_softmax_cycles_per_row(n, lanes, in_lanes):
    """No idle input, output always ready: a row of b = ceil(n / in_lanes) beats and w = ceil(n / lanes) words
    takes b + 2 * w + 21 cycles; the first word of probabilities is taken w + 24 cycles after the row's last beat
    was accepted, then one per cycle."""
    dut = Softmax(16, *multiplier(0.01), lanes=lanes, in_lanes=in_lanes)
    w = -(-n // lanes)
    rows = 3
    accepted: list[int] = []
    taken: list[tuple[int, object]] = []

    async def producer(ctx):
        payloads = [b for r in range(rows) for b in beats(list(range(r * n, (r + 1) * n)), in_lanes)]
        await send_timed(ctx, dut.i, payloads, accepted)

    async def consumer(ctx):
        await receive_timed(ctx, dut.o, rows * w, taken)

    run(dut, producer, consumer)
    b = -(-n // in_lanes)
    emitted = [cycle for cycle, _ in taken]
    firsts = accepted[::b]
    assert [y - x for x, y in itertools.pairwise(firsts)] == [b + 2 * w + 21] * (rows - 1)
    assert accepted[:b] == list(range(1, b + 1))  # one beat per cycle
    assert emitted[:w] == list(range(b + w + 24, b + 2 * w + 24))  # one word of probabilities per cycle
    assert emitted[0] - accepted[b - 1] == w + 24
    assert emitted[w - 1] > accepted[b]  # the next row is accepted while the last probabilities drain


def test_softmax_rejects_bad_arguments():
    for args, message in [
        ((0, 1 << 14, 20), "max_len must be at least 1, got 0"),
        ((8, 0, 20), "sm_mult must be between 1 and 32767, got 0"),
        ((8, 1 << 15, 20), "sm_mult must be between 1 and 32767, got 32768"),
        ((8, 1 << 14, 0), "sm_shift must be between 1 and 62, got 0"),
        ((8, 1 << 14, 63), "sm_shift must be between 1 and 62, got 63"),
        ((8, [1 << 14, 1 << 13], [20]), "sm_mult and sm_shift must give one value per site, got 2 and 1"),
        ((8, [1 << 14, 0], [20, 21]), "sm_mult must be between 1 and 32767, got 0"),
    ]:
        with pytest.raises(ValueError, match=f"^{message}$"):
            Softmax(*args)
    with pytest.raises(ValueError, match=r"^in_lanes must be an int that divides lanes \(4\), got 3$"):
        Softmax(8, 1 << 14, 20, lanes=4, in_lanes=3)
    with pytest.raises(ValueError, match=r"^score_bits must be between 1 and 64, got 0$"):
        Softmax(8, 1 << 14, 20, score_bits=0)


def test_softmax_converts_to_verilog():
    text = verilog.convert(Softmax(24, *multiplier(math.sqrt(1 / 64) / 16)), name="softmax")
    assert "module softmax" in text

"""rtl.WeightBanks and rtl.RowSerializer against what they must hold and hand on, exactly."""

from __future__ import annotations

import random

import numpy as np
import pytest
from rtl_sim import receive, run, send
from test_rtl_weight_store import _int_codes, mxfp4_weights

from hardwire.rtl.row_serializer import RowSerializer
from hardwire.rtl.weight_banks import WeightBanks, bank_rows


def _expected(tensors, rows: int, lanes: int) -> dict[int, list[tuple[list[int], int]]]:
    """Per bank address: (lane codes, shift) of every bank, from the numpy tensors."""
    words: dict[int, list[tuple[list[int], int]]] = {}
    address = 0
    for codes, shift in tensors:
        out, cols = codes.shape
        chunks = -(-cols // lanes)
        for group in range(-(-out // rows)):
            for chunk in range(chunks):
                per_bank = []
                for bank in range(rows):
                    row = group * rows + bank
                    cells = range(chunk * lanes, (chunk + 1) * lanes)
                    lane_codes = [int(codes[row, c]) if row < out and c < cols else 0 for c in cells]
                    s = int(shift[row, chunk * lanes]) if shift is not None and row < out else 0
                    per_bank.append((lane_codes, s))
                words[address] = per_bank
                address += 1
    return words


@pytest.mark.parametrize("rows,lanes,scheme,storage", [(1, 4, "int", "rom"), (4, 4, "int", "logic"),
                                                       (3, 8, "int", "rom"), (8, 8, "mxfp4", "rom"),
                                                       (2, 4, "mxfp4", "logic")])
def test_weight_banks_hold_every_row_of_every_tensor(rows, lanes, scheme, storage):
    if scheme == "int":
        tensors = [(_int_codes(7, 19, 6, 1), None), (_int_codes(5, 33, 6, 2), None), (_int_codes(2, 8, 6, 3), None)]
        bits = 6
    else:
        tensors = [mxfp4_weights(6, 70, 5), mxfp4_weights(3, 40, 6)]
        bits = 4
    banks = WeightBanks(tensors, rows=rows, lanes=lanes, code_bits=bits, scheme=scheme, storage=storage)
    want = _expected(tensors, rows, lanes)
    assert banks.words == len(want)
    sizes = [-(-codes.shape[0] // rows) * -(-codes.shape[1] // lanes) for codes, _ in tensors]
    assert banks.bases == [sum(sizes[:k]) for k in range(len(tensors))]
    seen = {}

    async def reader(ctx):
        order = list(range(banks.words))
        random.Random(rows).shuffle(order)
        for address in order:
            ctx.set(banks.addr, [address] * rows)
            ctx.set(banks.en, 1)
            await ctx.tick()
            ctx.set(banks.en, 0)
            seen[address] = [([int(c) for c in ctx.get(banks.codes[b])], int(ctx.get(banks.shift[b])))
                             for b in range(rows)]

    run(banks, reader)
    assert seen == want


def test_bank_rows_pads_a_short_bank_with_zero_rows():
    codes = np.arange(10).reshape(5, 2)
    assert bank_rows(codes, 4, 0).tolist() == [[0, 1], [8, 9]]
    assert bank_rows(codes, 4, 3).tolist() == [[6, 7], [0, 0]]


@pytest.mark.parametrize(("rows", "lanes", "wide"), [(1, 1, 0), (3, 1, 0), (8, 1, 1), (8, 4, 0), (8, 4, 1), (4, 4, 1)])
def test_row_serializer_hands_on_the_first_count_values_in_order(rows, lanes, wide):
    """Beats of min(left, lanes) rows when wide, else of one: together the first `count` values of each group."""
    rng = random.Random(rows * 10 + lanes + wide)
    groups = []
    for _ in range(20):
        count = rng.randint(1, rows)
        values = [rng.randint(-(1 << 39), (1 << 39) - 1) for _ in range(rows)]
        groups.append((values, count))
    step = lanes if wide else 1
    want = []  # (values, count) of each beat
    for values, count in groups:
        for start in range(0, count, step):
            want.append((values[start:start + min(step, count - start)], min(step, count - start)))
    dut = RowSerializer(rows, 40, lanes)
    got = []

    async def producer(ctx):
        ctx.set(dut.wide, wide)
        await send(ctx, dut.i, [{"values": values, "count": count} for values, count in groups], rng, idle=0.3)

    async def consumer(ctx):
        got.extend(await receive(ctx, dut.o, len(want), rng, stall=0.3))

    run(dut, producer, consumer)
    assert [([int(v) for v in beat.values][:beat.count], int(beat.count)) for beat in got] == want


@pytest.mark.parametrize(("lanes", "wide"), [(1, 0), (4, 0), (2, 1)])
def test_row_serializer_keeps_up_one_beat_per_cycle(lanes, wide):
    """A full group arriving as the last beat of the previous one leaves: no bubble between groups."""
    dut = RowSerializer(4, 16, lanes)
    step = lanes if wide else 1
    beats = 12 // step
    taken = []

    async def producer(ctx):
        ctx.set(dut.wide, wide)
        await send(ctx, dut.i, [{"values": [g * 4 + k for k in range(4)], "count": 4} for g in range(3)])

    async def consumer(ctx):
        ctx.set(dut.o.ready, 1)
        cycle = 0
        while len(taken) < beats:
            _, _, valid, payload = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            cycle += 1
            if valid:
                taken.append((cycle, [int(v) for v in payload.values][:step]))

    run(dut, producer, consumer)
    assert [v for _, beat in taken for v in beat] == list(range(12))
    assert [c for c, _ in taken] == list(range(taken[0][0], taken[0][0] + beats))


def test_row_serializer_refuses_lanes_that_do_not_divide_rows():
    with pytest.raises(ValueError, match=r"lanes must be a power of two that divides rows \(4\), got 3"):
        RowSerializer(4, 16, 3)

"""rtl.TableLookup and rtl.Glu against quant.blocks.lookup and glu: every code, idle input, backpressure."""

from __future__ import annotations

import random

import pytest
import torch
from amaranth.back import verilog
from amaranth.sim import Simulator
from rtl_sim import receive, run, send

from hardwire.quant.blocks import glu, lookup
from hardwire.quant.tables import gelu_table, silu_table
from hardwire.rtl.activation import Glu, TableLookup

CODES = list(range(-128, 128))
UPS = [-128, 127, 0, 1, -1, 64, -77]


def _stream(dut, payloads: list[object], rng: random.Random) -> list[object]:
    got: list[object] = []

    async def producer(ctx):
        await send(ctx, dut.i, payloads, rng, idle=0.2)

    async def consumer(ctx):
        got.extend(await receive(ctx, dut.o, len(payloads), rng, stall=0.3))

    run(dut, producer, consumer)
    return got


def _first_output_cycles(dut, payloads: list[object]) -> list[int]:
    """Cycles at which results come out with no idle input and no backpressure (sample() reads before each edge)."""
    seen: list[int] = []

    async def producer(ctx):
        for payload in payloads:
            ctx.set(dut.i.payload, payload)
            ctx.set(dut.i.valid, 1)
            await ctx.tick()
        ctx.set(dut.i.valid, 0)

    async def consumer(ctx):
        ctx.set(dut.o.ready, 1)
        cycle = 0
        while len(seen) < len(payloads):
            _, _, valid = await ctx.tick().sample(dut.o.valid)
            if valid:
                seen.append(cycle)
            cycle += 1

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(producer)
    sim.add_testbench(consumer)
    sim.run()
    return seen


@pytest.mark.parametrize("approximate", [False, True])
def test_table_lookup_matches_reference(approximate):
    table = gelu_table(0.05, 0.04, approximate)  # gelu(6.35) / 0.04 > 127: the table itself saturates
    assert int(table.max()) == 127 and int(table.min()) < 0
    rng = random.Random(int(approximate))
    codes = CODES + rng.sample(CODES, len(CODES)) + [-128, 127, -128, 127]
    got = _stream(TableLookup(table), codes, rng)
    assert got == lookup(torch.tensor(codes), table).tolist()


def test_glu_matches_reference():
    table = silu_table(0.05)
    rng = random.Random(3)
    cases = [(g, u) for g in CODES for u in UPS] + [(rng.randint(-128, 127), rng.randint(-128, 127)) for _ in range(300)]
    rng.shuffle(cases)
    got = _stream(Glu(table), [{"gate": g, "up": u} for g, u in cases], rng)
    gates, ups = (torch.tensor(c, dtype=torch.int64) for c in zip(*cases, strict=True))
    assert got == glu(gates, ups, table).tolist()


def test_glu_extreme_products():
    """A table reaching -255 and 255 (the 9-bit SILU's range): -255 * -128 = 32640 is the int16 extreme."""
    table = torch.tensor(CODES[::-1])  # table[c + 128] = -1 - c, with the 9-bit extremes at both ends
    table[0], table[255] = 255, -255
    assert int(table.min()) == -255 and int(table.max()) == 255
    cases = [(g, u) for g in (-128, 127, 0, -1) for u in (-128, 127, 0)]
    got = _stream(Glu(table), [{"gate": g, "up": u} for g, u in cases], random.Random(4))
    gates, ups = (torch.tensor(c, dtype=torch.int64) for c in zip(*cases, strict=True))
    expected = glu(gates, ups, table).tolist()
    assert got == expected and max(expected) == 255 * 128 and min(expected) == -255 * 128


def test_latencies_and_throughput():
    """One result per cycle; TableLookup takes 1 register stage, Glu 2 (a result taken at edge n is valid from n + latency)."""
    count = 20
    lookup_dut = TableLookup(gelu_table(0.05, 0.04, False))
    assert _first_output_cycles(lookup_dut, CODES[:count]) == list(range(1, 1 + count))
    glu_dut = Glu(silu_table(0.05))
    assert _first_output_cycles(glu_dut, [{"gate": g, "up": 3} for g in CODES[:count]]) == list(range(2, 2 + count))


def test_activations_convert_to_verilog():
    assert "module gelu" in verilog.convert(TableLookup(gelu_table(0.05, 0.04, False)), name="gelu")
    assert "module glu" in verilog.convert(Glu(silu_table(0.05)), name="glu")


@pytest.mark.parametrize("component,name", [(TableLookup, "table"), (Glu, "silu_table")])
def test_activations_reject_bad_tables(component, name):
    table = silu_table(0.05) if component is Glu else gelu_table(0.05, 0.04, False)
    with pytest.raises(ValueError, match=rf"^{name} must have 256 entries, got 255$"):
        component(table[:255])
    with pytest.raises(ValueError, match=rf"^{name} must have 256 entries, got 257$"):
        component(list(range(-128, 129)))
    low, high = (-255, 255) if component is Glu else (-128, 127)  # SILU entries are 9 bits
    bad = table.clone()
    bad[200] = high + 1
    with pytest.raises(ValueError, match=rf"^{name}\[200\] = {high + 1} is outside \[{low}, {high}\]$"):
        component(bad)
    bad[200] = low - 1
    with pytest.raises(ValueError, match=rf"^{name}\[200\] = {low - 1} is outside \[{low}, {high}\]$"):
        component(bad.tolist())
    with pytest.raises(ValueError, match=rf"^{name} must hold integers, got dtype torch.float32$"):
        component(table.float())
    with pytest.raises(ValueError, match=rf"^{name} must have 1 dimension, got shape \(2, 128\)$"):
        component(table.reshape(2, 128))
    with pytest.raises(ValueError, match=rf"^{name} must hold integers, got 0.5$"):
        component([0.5] * 256)


def test_one_unit_serves_every_layer_table():
    """Three tables in one unit: `site` picks each value's table (every code, sites in turn)."""
    tables = [silu_table(0.05), silu_table(0.11), torch.tensor(CODES[::-1])]
    gelus = [gelu_table(0.05, 0.04, False), gelu_table(0.09, 0.03, True), torch.tensor(CODES)]
    rng = random.Random(9)
    for site in range(3):
        glu_dut, lookup_dut = Glu(*tables), TableLookup(*gelus)
        ups = [rng.choice(UPS) for _ in CODES]

        def at_site(dut, payloads, site=site):
            got: list[object] = []

            async def producer(ctx):
                ctx.set(dut.site, site)
                await send(ctx, dut.i, payloads, rng, idle=0.2)

            async def consumer(ctx):
                got.extend(await receive(ctx, dut.o, len(payloads), rng, stall=0.3))

            run(dut, producer, consumer)
            return got

        got = at_site(glu_dut, [{"gate": g, "up": u} for g, u in zip(CODES, ups, strict=True)])
        assert got == glu(torch.tensor(CODES), torch.tensor(ups), tables[site]).tolist()
        assert at_site(lookup_dut, CODES) == lookup(torch.tensor(CODES), gelus[site]).tolist()


def test_activations_refuse_no_table():
    with pytest.raises(ValueError, match=r"^silu_table: at least one table is needed$"):
        Glu()

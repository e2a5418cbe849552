"""The attention soft-cap's table read (rtl/soft_cap.py) against blocks.soft_cap, in Amaranth's simulator."""

from __future__ import annotations

import random

import pytest
import torch
from amaranth.sim import Simulator

from hardwire.quant.blocks import soft_cap
from hardwire.quant.tables import cap_units, tanh_cap_table
from hardwire.rtl.soft_cap import SoftCap


@pytest.mark.parametrize("cap", [4.0, 50.0])
def test_soft_cap_matches_the_reference(cap):
    """Gemma 2's cap of 50 (K = 1,024 units of c / K, a table of 4,260) and the test model's 4 (K = 256: a quarter of
    the softmax's step, 889 entries): edges
    (0, +-1, the table's last index and one past it, int32's ends) and random scores of every magnitude, each read
    as it is given (a combinational read), equal to the reference's sign(t) * TANH[min(|t|, N)]."""
    table = tanh_cap_table(cap_units(cap))
    n = table.numel() - 1
    rng = random.Random(1)
    ts = [0, 1, -1, n, -n, n + 1, -n - 1, 2**31 - 1, -2**31] + [rng.randint(-2 * n, 2 * n) for _ in range(200)] + \
         [rng.randint(-2**31, 2**31 - 1) for _ in range(20)]
    want = soft_cap(torch.tensor(ts), 1 << 14, 14, table).tolist()  # mult / 2**shift = 1: t is the score itself
    dut = SoftCap(table.tolist())
    got = []

    async def testbench(ctx):
        for t in ts:
            ctx.set(dut.t, t)
            await ctx.delay(1e-9)  # combinational: settled, no clock
            got.append(ctx.get(dut.capped))

    sim = Simulator(dut)
    sim.add_testbench(testbench)
    sim.run()
    assert got == want
    assert table[-1] == cap_units(cap) and max(abs(v) for v in want) == table[-1]


def test_soft_cap_refuses_a_table_that_is_not_a_cap():
    with pytest.raises(ValueError, match=r"^a soft-cap table starts at 0 and never decreases \(K tanh\(i / K\), "
                                         r"i = 0 \.\. N\)$"):
        SoftCap([0, 3, 2])

"""rtl.Rescale against quant.fixedpoint.rescale: random and edge values, idle input, backpressure."""

from __future__ import annotations

import random

import pytest
import torch
from rtl_sim import stream_through, stream_through_timed

from hardwire.quant.fixedpoint import rescale
from hardwire.rtl.rescale import LATENCY, Rescale


def _cases(value_bits: int, rng: random.Random) -> list[tuple[int, int, int]]:
    lo, hi = -(1 << (value_bits - 1)), (1 << (value_bits - 1)) - 1
    edges = [(v, m, s) for v in (lo, hi, 0, -1, 1, 3, -3, 5, -5) for m in (1 << 14, (1 << 15) - 1, 1) for s in (1, 2, 14, 30)]
    edges += [(2, 1, 2), (-2, 1, 2), (6, 1, 2), (-6, 1, 2)]  # exact halves: +0.5 rounds up, -0.5 rounds up to 0
    edges += [(hi, (1 << 15) - 1, 62), (lo, (1 << 15) - 1, 62), (hi, (1 << 15) - 1, 61)]  # the largest shifts
    randoms = [(rng.randint(lo, hi), rng.randint(1 << 14, (1 << 15) - 1), rng.randint(1, 40)) for _ in range(300)]
    # the reference computes in int64: value * mult + half must fit it (the hardware's sum is exact at any width)
    return [(v, m, s) for v, m, s in edges + randoms if abs(v * m) + (1 << (s - 1)) < 1 << 63]


@pytest.mark.parametrize("value_bits,out_bits", [(32, 8), (24, 16), (20, 32), (17, 8), (49, 32), (64, 16)])
def test_rescale_matches_reference(value_bits, out_bits):
    rng = random.Random(value_bits)
    cases = _cases(value_bits, rng)
    got = stream_through(Rescale(value_bits, out_bits), [{"value": v, "mult": m, "shift": s} for v, m, s in cases],
                         rng, idle=0.2, stall=0.3)
    values, mults, shifts = (torch.tensor(c, dtype=torch.int64) for c in zip(*cases, strict=True))
    assert got == rescale(values, mults, shifts, out_bits).tolist()


def test_rescale_rejects_bad_widths():
    with pytest.raises(ValueError, match=r"^value_bits must be between 2 and 64, got 70$"):
        Rescale(70, 8)
    with pytest.raises(ValueError, match=r"^out_bits must be between 2 and 31, got 40$"):
        Rescale(16, 40)


def test_rescale_latency_and_throughput():
    """One result per cycle, each LATENCY cycles after its input was taken (the schedule counts on it)."""
    accepted, taken = stream_through_timed(Rescale(49, 32), [{"value": v, "mult": 1 << 14, "shift": 14}
                                                             for v in range(-10, 10)])
    assert [cycle for cycle, _ in taken] == [a + LATENCY for a in accepted] and accepted == list(range(1, 21))
    assert [value for _, value in taken] == list(range(-10, 10))

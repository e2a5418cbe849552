"""rtl.NormUnit against quant.blocks.norm: both kinds, edge vectors, extreme multipliers, idle input, backpressure."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from amaranth.back import verilog
from rtl_sim import receive, run, send, send_timed

from hardwire.quant.blocks import bit_length, norm
from hardwire.quant.tables import rsqrt_table
from hardwire.rtl.norm import NormSite, NormUnit
from hardwire.rtl.rescale import LATENCY as RESCALE_LATENCY

RSQRT = rsqrt_table()
LO, HI = -(1 << 15), (1 << 15) - 1


def _eps_q(d: int, kind: str) -> int:
    """A realistic eps_q (§4): eps = 1e-5 with s_x = 2 * 8 / 2**15, times d * k^2."""
    k = d if kind == "layer" else 1
    return max(1, int(1e-5 * d * k * k / (16 / (1 << 15)) ** 2 + 0.5))


def _coefs(d: int, extreme: bool, rng: random.Random) -> tuple[list[int], list[int]]:
    """Per-channel (mult, shift): realistic, or a mix of saturating, vanishing and boundary multipliers."""
    if not extreme:
        return [rng.randint(1 << 14, (1 << 15) - 1) for _ in range(d)], [rng.randint(10, 30) for _ in range(d)]
    pairs = [((1 << 15) - 1, 1), (1, 62), (1 << 14, 15), ((1 << 15) - 1, 22), (1, 1), (12345, 32), (20000, 31),
             ((1 << 15) - 1, 23)]
    mult, shift = zip(*(pairs[j % len(pairs)] for j in range(d)), strict=True)
    return list(mult), list(shift)


def _vectors(d: int, rng: random.Random) -> list[list[int]]:
    alternating = [LO if j % 2 == 0 else HI for j in range(d)]
    edges = [
        [0] * d,  # ss = eps_q
        [HI] * d,
        [LO] * d,
        [HI] + [0] * (d - 1),
        [0] * (d - 1) + [LO],
        alternating,
        alternating[::-1],
        [rng.choice((-1, 0, 1)) for _ in range(d)],  # tiny: e = 0
        [1] + [0] * (d - 1),
        [-2, 1] + [0] * (d - 2),
    ]
    sweep = [[rng.randint(-(1 << b), (1 << b) - 1) for _ in range(d)] for b in range(1, 16)]  # every bit_length parity
    randoms = [[rng.randint(LO, HI) for _ in range(d)] for _ in range(8)]
    return edges + sweep + randoms


def _sum_of_squares(x: torch.Tensor, kind: str, eps_q: int) -> torch.Tensor:
    u = x if kind == "rms" else x.shape[-1] * x - x.sum(-1, keepdim=True)
    return (u * u).sum(-1) + eps_q


async def _receive_elements(ctx, dut: NormUnit, count: int, rng, stall: float) -> list[int]:
    """`count` vectors' elements from the unit's output words; the lanes past d must be 0."""
    words = -(-dut.d // dut.lanes)
    got = []
    for index, word in enumerate(await receive(ctx, dut.o, count * words, rng, stall=stall)):
        values = [int(v) for v in word]
        keep = min(dut.lanes, dut.d - (index % words) * dut.lanes)
        assert values[keep:] == [0] * (dut.lanes - keep), f"padding lanes of word {index}"
        got.extend(values[:keep])
    return got


def _beats(vector: list[int], in_lanes: int, wide: bool = True) -> list[dict]:
    """A vector as the unit's input beats: full beats of in_lanes elements (the last may be short), or single
    elements; the unused lanes hold a value that would show if it were counted."""
    step = in_lanes if wide else 1
    out = []
    for start in range(0, len(vector), step):
        values = vector[start:start + step]
        out.append({"values": values + [HI] * (in_lanes - len(values)), "count": len(values)})
    return out


def _check(kind: str, d: int, extreme: bool, idle: float, stall: float, lanes: int = 1, in_lanes: int = 1) -> None:
    """Stream every test vector back to back through one NormUnit and compare with blocks.norm."""
    rng = random.Random(f"{kind}-{d}-{extreme}")
    eps_q = 1 if extreme else _eps_q(d, kind)
    mult, shift = _coefs(d, extreme, rng)
    vectors = _vectors(d, rng)
    x = torch.tensor(vectors, dtype=torch.int64)
    want = norm(x, kind, eps_q, torch.tensor(mult), torch.tensor(shift), RSQRT, "t").flatten().tolist()

    # the edge vectors reach what they are meant to reach
    ss = _sum_of_squares(x, kind, eps_q)
    lengths = set(bit_length(ss).tolist())
    assert {n for n in lengths if n > 10 and n % 2} and {n for n in lengths if n > 10 and n % 2 == 0}
    assert int(ss.min()) == eps_q
    if extreme and (kind == "rms" or d == 8):  # non-zero u, ss < 256 (e = 0); LayerNorm: ss >= d(d-1) + eps_q
        assert any(int(s) < 256 and v != [0] * d for s, v in zip(ss, vectors, strict=True))
    if extreme:
        assert -128 in want and 127 in want

    dut = NormUnit(d, kind, [NormSite(eps_q, mult, shift)], lanes=lanes, in_lanes=in_lanes)
    got: list[int] = []

    async def producer(ctx):  # vectors alternate between full beats and single elements
        await send(ctx, dut.i, [b for n, row in enumerate(vectors) for b in _beats(row, in_lanes, n % 2 == 0)], rng,
                   idle=idle)

    async def consumer(ctx):
        got.extend(await _receive_elements(ctx, dut, len(vectors), rng, stall))

    run(dut, producer, consumer)
    assert got == want


@pytest.mark.parametrize("extreme", [False, True], ids=["realistic", "extreme"])
@pytest.mark.parametrize("d,lanes,in_lanes", [(8, 1, 1), (32, 1, 1), (48, 1, 1), (32, 4, 1), (20, 8, 1), (32, 8, 4),
                                               (20, 8, 8), (12, 4, 2)])
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_norm_matches_reference(kind, d, lanes, in_lanes, extreme):
    _check(kind, d, extreme, idle=0.2, stall=0.3, lanes=lanes, in_lanes=in_lanes)


def _alternating_sites(kind: str, d: int, lanes: int, sites: list[NormSite], vectors: list[list[int]],
                       rng: random.Random) -> tuple[list[int], list[int]]:
    """(simulated, reference) outputs of one unit for vectors taking the sites in turn."""
    want = []
    for n, vector in enumerate(vectors):
        site = sites[n % len(sites)]
        want += norm(torch.tensor([vector]), kind, site.eps_q, torch.tensor(site.mult), torch.tensor(site.shift), RSQRT,
                     "t", site.out_bits).flatten().tolist()
    dut = NormUnit(d, kind, sites, lanes=lanes)
    got: list[int] = []

    async def bench(ctx):
        for n, vector in enumerate(vectors):
            ctx.set(dut.site, n % len(sites))
            await send(ctx, dut.i, _beats(vector, 1), rng, idle=0.2)
            got.extend(await _receive_elements(ctx, dut, 1, rng, 0.3))

    run(dut, bench)
    return got, want


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_one_unit_serves_several_norm_sites(kind):
    """The `site` input picks each vector's eps_q and per-channel constants: vectors alternate between three sites."""
    d, lanes = 12, 4
    rng = random.Random(f"sites-{kind}")
    sites = [NormSite(eps, *_coefs(d, extreme, rng)) for eps, extreme in ((1, True), (_eps_q(d, kind), False), (7, False))]
    got, want = _alternating_sites(kind, d, lanes, sites, _vectors(d, rng)[:12], rng)
    assert got == want


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_a_wide_site_keeps_12_bits_and_the_others_saturate_at_8(kind):
    """Sites saying out_bits = 12 (every norm of a compiled model) keep 12 bits; an int8 site beside them (a
    qmodel.json from before out_bits existed) still saturates at int8."""
    d, lanes = 12, 4
    rng = random.Random(f"wide-{kind}")
    mult, shift = _coefs(d, True, rng)
    sites = [NormSite(1, mult, shift), NormSite(1, mult, shift, 12), NormSite(_eps_q(d, kind), *_coefs(d, False, rng), 12)]
    vectors = _vectors(d, rng)[:12]
    got, want = _alternating_sites(kind, d, lanes, sites, vectors, rng)
    assert got == want
    wide = [v for n in range(1, len(vectors), 3) for v in want[n * d : (n + 1) * d]]
    assert max(map(abs, wide)) > 128 and max(map(abs, want[:d])) <= 128  # the same constants: 12 bits, then 8


def test_each_narrower_site_saturates_at_its_own_width():
    """Three widths in one unit (8, 10, 12): a site narrower than the widest saturates at its own out_bits."""
    d, lanes, kind = 12, 4, "rms"
    rng = random.Random("widths")
    mult, shift = _coefs(d, True, rng)
    sites = [NormSite(1, mult, shift, bits) for bits in (8, 10, 12)]
    got, want = _alternating_sites(kind, d, lanes, sites, _vectors(d, rng)[:12], rng)
    assert got == want
    peaks = [max(abs(v) for n in range(s, 12, 3) for v in want[n * d : (n + 1) * d]) for s in range(3)]
    assert peaks[0] <= 128 and 128 < peaks[1] <= 512 < peaks[2]  # each width reached: int8, int10, int12


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_norm_heavy_backpressure(kind):
    """Mostly idle input and mostly stalled output: nothing lost, nothing duplicated."""
    _check(kind, 8, True, idle=0.7, stall=0.8)
    _check(kind, 8, True, idle=0.7, stall=0.8, lanes=4)


@pytest.mark.parametrize("lanes", [1, 4, 3])
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_norm_cycles_per_vector(kind, lanes):
    """Without idle input or backpressure: the docstring's cycles per vector and latency, and no extra output."""
    d, vectors = 16, 3
    w = -(-d // lanes)
    rng = random.Random(kind)
    mult, shift = _coefs(d, False, rng)
    dut = NormUnit(d, kind, [NormSite(5, mult, shift)], lanes=lanes)
    xs = [[rng.randint(LO, HI) for _ in range(d)] for _ in range(vectors)]
    accepted: list[int] = []  # cycle of each accepted input
    produced: list[int] = []  # cycle of each taken output

    async def producer(ctx):
        await send_timed(ctx, dut.i, [b for row in xs for b in _beats(row, 1)], accepted)

    async def consumer(ctx):
        ctx.set(dut.o.ready, 1)
        for cycle in range(1, 20 * d * vectors):
            _, _, valid = await ctx.tick().sample(dut.o.valid)
            if valid:
                produced.append(cycle)

    run(dut, producer, consumer)
    per_vector = d + w + 10 + RESCALE_LATENCY if kind == "rms" else d + 2 * w + 11 + RESCALE_LATENCY
    latency = 11 + RESCALE_LATENCY if kind == "rms" else w + 12 + RESCALE_LATENCY
    assert len(produced) == w * vectors
    starts, lasts, firsts = accepted[::d], accepted[d - 1::d], produced[::w]
    assert [b - a for a, b in itertools.pairwise(starts)] == [per_vector] * (vectors - 1)
    assert [f - last for f, last in zip(firsts, lasts, strict=True)] == [latency] * vectors
    assert produced == [f + k for f in firsts for k in range(w)]  # one output word per cycle within a vector


def test_norm_converts_to_verilog():
    rng = random.Random(16)
    mult, shift = _coefs(16, False, rng)
    text = verilog.convert(NormUnit(16, "layer", [NormSite(7, mult, shift)], lanes=4), name="norm_unit")
    assert "module norm_unit" in text


def test_norm_accepts_every_compiled_layernorm():
    """§4's compiler accepts LayerNorm up to d = 1289; the exact worst sum of squares fits int63 up to d = 1625."""
    for d in (1289, 1625):
        NormUnit(d, "layer", [NormSite(1, [1 << 14] * d, [20] * d)])._MustUse__silence = True  # never elaborated


@pytest.mark.parametrize("args,message", [
    ((8, "batch", 1, [1] * 8, [1] * 8), "kind must be 'rms' or 'layer', got 'batch'"),
    ((1, "rms", 1, [1], [1]), "d must be at least 2, got 1"),
    ((8, "rms", 0, [1] * 8, [1] * 8), "eps_q must be at least 1, got 0"),
    ((8, "rms", 1, [1] * 7, [1] * 8), "mult and shift must have d = 8 entries each, got 7 and 8"),
    ((8, "rms", 1, [1] * 8, [1] * 9), "mult and shift must have d = 8 entries each, got 8 and 9"),
    ((3, "rms", 1, [1, 0, 1], [1] * 3), "mult[1] must be in [1, 2**15), got 0"),
    ((3, "rms", 1, [1, 1, 1 << 15], [1] * 3), "mult[2] must be in [1, 2**15), got 32768"),
    ((3, "rms", 1, [1] * 3, [0, 1, 1]), "shift[0] must be in [1, 62], got 0"),
    ((3, "rms", 1, [1] * 3, [1, 63, 1]), "shift[1] must be in [1, 62], got 63"),
    ((2, "rms", (1 << 62) - (2 << 30), [1] * 2, [1] * 2),
     f"rms norm with d = 2 and eps_q = {(1 << 62) - (2 << 30)}: the sum of squares can reach {1 << 62}, "
     "which does not fit int63"),
])
def test_norm_rejects_bad_arguments(args, message):
    with pytest.raises(ValueError) as info:
        NormUnit(args[0], args[1], [NormSite(*args[2:])])
    assert str(info.value) == message


def test_norm_names_the_site_that_is_wrong():
    good = NormSite(1, [1 << 14] * 4, [20] * 4)
    with pytest.raises(ValueError, match=r"^site 1: eps_q must be at least 1, got 0$"):
        NormUnit(4, "rms", [good, NormSite(0, [1 << 14] * 4, [20] * 4)])
    with pytest.raises(ValueError, match=r"^a norm unit needs at least one site$"):
        NormUnit(4, "rms", [])
    with pytest.raises(ValueError, match=r"^lanes must be an int from 1 to 64, got 0$"):
        NormUnit(4, "rms", [good], lanes=0)


def test_norm_rejects_too_wide_layernorm():
    d = 1626
    with pytest.raises(ValueError, match=r"^layer norm with d = 1626 and eps_q = 1: the sum of squares can reach \d+, "
                                         r"which does not fit int63$"):
        NormUnit(d, "layer", [NormSite(1, [1] * d, [1] * d)])


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_norm_smallest_vectors(kind, d):
    """The counters and RAMs at their smallest sizes (not a power of two for d = 3)."""
    _check(kind, d, True, idle=0.3, stall=0.3)
    _check(kind, d, True, idle=0.3, stall=0.3, lanes=2)

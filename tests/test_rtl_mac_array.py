"""rtl.MacArray against exact integer sums, and WeightStore + MacArray against quant.blocks.matvec (§2)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from amaranth.hdl import Elaboratable, Module, Signal, signed
from amaranth.lib import data
from rtl_sim import receive, run, send

from hardwire.quant.blocks import matvec
from hardwire.quant.weights import quantize_int, quantize_mxfp4
from hardwire.rtl.mac_array import LATENCY, MULTIPLIERS, MacArray
from hardwire.rtl.weight_store import WeightStore


def _max_shift(lanes: int, act_bits: int, acc_bits: int, words: int = 5, code_bits: int = 8) -> int:
    """Largest shift (<= 24) at which a row of `words` worst-case words still fits the accumulator."""
    worst_word = lanes << (act_bits + code_bits - 2)  # lanes * |-2**(code_bits-1)| * |-2**(act_bits-1)|
    s = 24
    while words * (worst_word << s) > (1 << (acc_bits - 1)) - 1:
        s -= 1
    return s


def _rows(lanes: int, act_bits: int, acc_bits: int, n_rows: int, rng: random.Random, code_bits: int = 8) -> list[list[dict]]:
    """Rows of 1..5 words: random, or extreme codes and activations (about one word in three), shifts 0..max."""
    lo, hi = -(1 << (act_bits - 1)), (1 << (act_bits - 1)) - 1
    c_lo, c_hi = -(1 << (code_bits - 1)), (1 << (code_bits - 1)) - 1
    top = _max_shift(lanes, act_bits, acc_bits, code_bits=code_bits)
    rows = []
    for _ in range(n_rows):
        n = rng.randint(1, 5)
        row = []
        for k in range(n):
            if rng.random() < 0.35:
                codes = [rng.choice((c_lo, c_hi)) for _ in range(lanes)]
                acts = [rng.choice((lo, hi)) for _ in range(lanes)]
                shift = rng.choice((0, top))
            else:
                codes = [rng.randint(c_lo, c_hi) for _ in range(lanes)]
                acts = [rng.randint(lo, hi) for _ in range(lanes)]
                shift = rng.randint(0, top)
            row.append({"codes": codes, "shift": shift, "acts": acts, "first": k == 0, "last": k == n - 1})
        rows.append(row)
    return rows


def _row_sum(row: list[dict]) -> int:
    return sum(sum(c * a for c, a in zip(w["codes"], w["acts"], strict=True)) << w["shift"] for w in row)


@pytest.mark.parametrize("lanes,act_bits,acc_bits,code_bits,multiplier", [
    (1, 16, 48, 8, "dsp"), (2, 8, 48, 8, "dsp"), (4, 16, 64, 8, "dsp"), (8, 16, 48, 8, "dsp"), (16, 12, 40, 8, "dsp"),
    (4, 8, 48, 6, "dsp"), (2, 16, 48, 8, "shift_add"), (8, 8, 40, 6, "shift_add"), (16, 8, 48, 3, "shift_add"),
    (4, 16, 48, 5, "shift_add"),
])
def test_mac_array_matches_exact_sums(lanes, act_bits, acc_bits, code_bits, multiplier):
    rng = random.Random(f"{lanes}{act_bits}{code_bits}{multiplier}")
    rows = _rows(lanes, act_bits, acc_bits, 60, rng, code_bits)
    top = _max_shift(lanes, act_bits, acc_bits, code_bits=code_bits)
    rows.append([{"codes": [-(1 << (code_bits - 1))] * lanes, "shift": top, "acts": [-(1 << (act_bits - 1))] * lanes,
                  "first": k == 0, "last": k == 4} for k in range(5)])  # the worst case: the largest positive sum
    want = [_row_sum(row) for row in rows]
    assert top == 24 or max(want) >= 1 << (acc_bits - 5)  # either every shift is covered or the sums near the top
    dut = MacArray(lanes, act_bits, acc_bits, code_bits=code_bits, multiplier=multiplier)
    got: list[int] = []

    async def producer(ctx):
        await send(ctx, dut.i, [w for row in rows for w in row], rng, idle=0.2)

    async def consumer(ctx):
        got.extend(await receive(ctx, dut.o, len(rows), rng, stall=0.3))

    run(dut, producer, consumer)
    assert got == want


@pytest.mark.parametrize("multiplier", MULTIPLIERS)
@pytest.mark.parametrize("code_bits", [3, 6, 8])
def test_mac_array_products_of_every_code(code_bits, multiplier):
    """Every code of the width against the activation's edges and a few random values, one product per row."""
    rng = random.Random(code_bits)
    acts = [-128, -127, -1, 0, 1, 127, *(rng.randint(-128, 127) for _ in range(3))]
    words = [{"codes": [c, -c - 1], "shift": 0, "acts": [a, a], "first": 1, "last": 1}
             for c in range(-(1 << (code_bits - 1)), 1 << (code_bits - 1)) for a in acts]
    dut = MacArray(2, 8, 24, code_bits=code_bits, multiplier=multiplier)
    got: list[int] = []

    async def producer(ctx):
        await send(ctx, dut.i, words)

    async def consumer(ctx):
        got.extend(await receive(ctx, dut.o, len(words), rng))

    run(dut, producer, consumer)
    assert got == [w["codes"][0] * w["acts"][0] + w["codes"][1] * w["acts"][1] for w in words]


def test_mac_array_shifts_reach_24_with_default_widths():
    assert _max_shift(2, 8, 48) == 24  # so the (2, 8, 48) case above covers shifts 0..24 at acc_bits = 48
    assert _max_shift(4, 16, 64) == 24


def test_mac_array_takes_one_word_per_cycle():
    lanes = 4
    rng = random.Random(7)
    rows = _rows(lanes, 16, 48, 80, rng)
    words = [w for row in rows for w in row]
    dut = MacArray(lanes)
    got: list[int] = []
    cycles = 0

    async def producer(ctx):
        await send(ctx, dut.i, words)  # no idle cycles

    async def consumer(ctx):
        nonlocal cycles
        ctx.set(dut.o.ready, 1)  # never stalled
        while len(got) < len(rows):
            _, _, valid, payload = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            cycles += 1
            if valid:
                got.append(payload)

    run(dut, producer, consumer)
    assert got == [_row_sum(row) for row in rows]
    assert len(words) >= 200
    assert cycles <= len(words) + LATENCY + 1, f"{cycles} cycles for {len(words)} words"


def test_mac_array_latency():
    dut = MacArray(2)
    seen: list[tuple[int, int]] = []

    async def tb(ctx):
        ctx.set(dut.o.ready, 1)
        ctx.set(dut.i.payload, {"codes": [1, -2], "shift": 3, "acts": [5, 7], "first": 1, "last": 1})
        ctx.set(dut.i.valid, 1)
        await ctx.tick()  # the word is taken at this edge
        ctx.set(dut.i.valid, 0)
        for _ in range(LATENCY + 2):
            seen.append((ctx.get(dut.o.valid), ctx.get(dut.o.payload)))
            await ctx.tick()

    run(dut, tb)
    valid = [v for v, _ in seen]
    assert valid.index(1) == LATENCY - 1 and sum(valid) == 1  # on `o` in the LATENCY-th cycle after the one it was sent in
    assert seen[LATENCY - 1][1] == (5 - 14) << 3


@pytest.mark.parametrize("args,message", [
    ((3,), r"lanes must be a power of two between 1 and 64, got 3"),
    ((128,), r"lanes must be a power of two between 1 and 64, got 128"),
    ((4, 1), r"act_bits must be between 2 and 32, got 1"),
    ((4, 16, 80), r"acc_bits must be between 16 and 64, got 80"),
    ((4, 8, 48, 1), r"code_bits must be between 2 and 8, got 1"),
    ((4, 8, 48, 9), r"code_bits must be between 2 and 8, got 9"),
    ((4, 8, 48, 8, "booth"), r"multiplier must be one of dsp, shift_add, got 'booth'"),
])
def test_mac_array_rejects_bad_widths(args, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        MacArray(*args[:3], **dict(zip(("code_bits", "multiplier"), args[3:], strict=False)))


class _Engine(Elaboratable):
    """WeightStore feeding MacArray: the store's word goes straight to the MAC input, a testbench drives the rest."""

    def __init__(self, store: WeightStore, mac: MacArray) -> None:
        self.store, self.mac = store, mac
        self.acts = Signal(data.ArrayLayout(signed(mac.act_bits), mac.lanes))
        self.first, self.last, self.valid = Signal(), Signal(), Signal()

    def elaborate(self, platform: object) -> Elaboratable:
        m = Module()
        m.submodules.store, m.submodules.mac = self.store, self.mac
        word = self.mac.i.payload
        m.d.comb += [
            word.codes.eq(self.store.codes),
            word.shift.eq(self.store.shift),
            word.acts.eq(self.acts),
            word.first.eq(self.first),
            word.last.eq(self.last),
            self.mac.i.valid.eq(self.valid),
        ]
        return m


def _qlinear_like(scheme: str, rows: int, cols: int, seed: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(codes, block_shift per element, code_bits, activation bits) of a quantised random projection."""
    rng = np.random.default_rng(seed)
    if scheme == "mxfp4":
        n_blocks = -(-cols // 32)
        scale = np.ldexp(1.0, rng.integers(-8, 9, size=(rows, n_blocks)))  # blocks over 16 binades
        qw = quantize_mxfp4(rng.standard_normal((rows, cols)) * np.repeat(scale, 32, axis=1)[:, :cols])
        shift = np.repeat(qw.block_shift.astype(np.int64), 32, axis=1)[:, :cols]
        assert shift.max() > 0
        return qw.codes.astype(np.int64), shift, 4, 8
    bits = int(scheme[3:])
    qw = quantize_int(rng.standard_normal((rows, cols)), bits)
    in_bits = 16 if bits == 8 else 8  # int16 inputs as in a gated MLP's down projection
    return qw.codes.astype(np.int64), np.zeros((rows, cols), dtype=np.int64), bits, in_bits


@pytest.mark.parametrize("storage", ["rom", "logic"])
@pytest.mark.parametrize("lanes", [4, 8])
@pytest.mark.parametrize("scheme", ["int8", "int3", "mxfp4"])
def test_weight_store_and_mac_array_compute_matvec(scheme, lanes, storage):
    rows, cols = 6, 72 if scheme == "mxfp4" else 45  # both leave a padded last word; MXFP4 has a short last block
    codes, shift, code_bits, in_bits = _qlinear_like(scheme, rows, cols, lanes)
    rng = random.Random(f"{scheme}{lanes}{storage}")
    lo, hi = -(1 << (in_bits - 1)), (1 << (in_bits - 1)) - 1
    a = [rng.choice((lo, hi)) if rng.random() < 0.2 else rng.randint(lo, hi) for _ in range(cols)]
    weight = torch.tensor(codes) << torch.tensor(shift)  # QLinear.weight
    want = matvec(torch.tensor([a]), weight, None, 48, "t")[0].tolist()

    store = WeightStore(codes, shift, lanes=lanes, code_bits=code_bits, scheme="mxfp4" if scheme == "mxfp4" else "int",
                        storage=storage)
    mac = MacArray(lanes)
    top = _Engine(store, mac)
    padded = a + [0] * (store.chunks * lanes - cols)
    got: list[int] = []

    async def producer(ctx):
        for r in range(rows):
            for k in range(store.chunks):
                while rng.random() < 0.2:
                    await ctx.tick()
                ctx.set(store.addr, r * store.chunks + k)
                ctx.set(store.en, 1)
                await ctx.tick()  # the word is on the store's outputs from here on, held while en is low
                ctx.set(store.en, 0)
                ctx.set(top.acts, padded[k * lanes:(k + 1) * lanes])
                ctx.set(top.first, k == 0)
                ctx.set(top.last, k == store.chunks - 1)
                ctx.set(top.valid, 1)
                await ctx.tick().until(mac.i.ready)
                ctx.set(top.valid, 0)

    async def consumer(ctx):
        got.extend(await receive(ctx, mac.o, rows, rng, stall=0.3))

    run(top, producer, consumer)
    assert got == want

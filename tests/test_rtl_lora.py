"""LoRA adapters in the Decoder: loaded through the write port, token for token against the reference."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from break_check import assert_varied
from random_ir import random_adapters, random_ir
from rtl_sim import decode, run

from hardwire.quant.qmodel import LoraSpec
from hardwire.quant.quantize import quantize
from hardwire.quant.reference import LoraAdapter, ReferenceDecoder
from hardwire.rtl.decoder import Decoder
from hardwire.rtl.lora_map import lora_address_map, lora_writes

_QM = {}
FEED = [(3, True), (7, False), (1, False)]
GENERATE = 3
SEEDS = {"llama": 7, "gpt2": 2}  # base models whose outputs on FEED vary (tests/test_rtl_decoder.py)


def _qmodel(family: str):
    if family not in _QM:
        ir = random_ir(family=family, d=16, heads=2, kv_heads=1 if family == "llama" else 2, ffn=24, vocab=20,
                       context=8, layers=1, seed=SEEDS[family])
        _QM[family] = quantize(ir, "int8", context=8)
    return _QM[family]


def _decode(dut: Decoder, writes: list[tuple[int, int]], rng: random.Random) -> list[int]:
    return decode(dut, FEED, GENERATE, rng, lora_writes=writes)[0]


def _reference(qm, lora=None) -> list[int]:
    """The output after every token fed: FEED's prompt, then GENERATE tokens each fed back."""
    return ReferenceDecoder(qm, lora=lora).outputs([token for token, _ in FEED], GENERATE + 1)


@pytest.mark.parametrize("family,lanes", [("llama", 4), ("gpt2", 2)])
def test_no_writes_is_the_base_model(family, lanes):
    qm = _qmodel(family)
    assert qm.lora.rank > 0 and qm.lora.sites  # the default build has adapter slots
    assert_varied(_reference(qm))
    assert _decode(Decoder(qm, lanes=lanes), [], random.Random(1)) == _reference(qm)


@pytest.mark.parametrize("family,lanes", [("llama", 4), ("gpt2", 2)])
def test_zero_adapter_is_the_base_model(family, lanes):
    qm = _qmodel(family)
    adapters = random_adapters(qm, 0, zero=True)
    assert _decode(Decoder(qm, lanes=lanes), lora_writes(qm, lanes, adapters), random.Random(2)) == _reference(qm)


@pytest.mark.parametrize("family,lanes,storage,shape", [("llama", 4, "rom", {}), ("gpt2", 2, "logic", {}),
                                                        ("llama", 8, "logic", {"rows": 4, "epilogue_lanes": 4})])
def test_random_adapters_match_the_reference(family, lanes, storage, shape):
    """The last: 4 rows per cycle through the epilogue, each lane adding its own row's B t term (V too: 4
    attention rows). Every adapter changes the outputs: a chip that ignored one site's adapter fails here."""
    qm = _qmodel(family)
    adapters = random_adapters(qm, 5)
    expected = _reference(qm, adapters)
    assert expected != _reference(qm)  # the adapters change the tokens, and each one does (removed, the tokens change)
    assert all(_reference(qm, {k: a for k, a in adapters.items() if k != slot}) != expected for slot in adapters)
    got = _decode(Decoder(qm, lanes=lanes, storage=storage, **shape), lora_writes(qm, lanes, adapters), random.Random(3))
    assert got == expected


def test_adapter_then_zero_adapter_restores_the_base_model():
    qm = _qmodel("llama")
    writes = lora_writes(qm, 4, random_adapters(qm, 5)) + lora_writes(qm, 4, random_adapters(qm, 0, zero=True))
    assert _decode(Decoder(qm, lanes=4), writes, random.Random(4)) == _reference(qm)


def test_address_map_is_dense_per_slot():
    qm = _qmodel("llama")
    slots = lora_address_map(qm)
    assert [(s.layer, s.site) for s in slots] == [(0, "q"), (0, "v")]
    q = slots[0]
    assert (q.a_base, q.a_stride, q.b_base, q.b_stride, q.reg_base) == (0, 16, 64, 4, 128)
    assert slots[1].a_base == q.end == 132
    writes = lora_writes(qm, 4, random_adapters(qm, 5))
    assert len({addr for addr, _ in writes}) == len(writes) == (4 * 16 + 16 * 4 + 4) + (4 * 16 + 8 * 4 + 4)


def test_lora_writes_rejects_bad_adapters():
    qm = _qmodel("llama")
    good = random_adapters(qm, 5)[0, "q"]
    bad = LoraAdapter(a=good.a[:, :-1], b=good.b, a_mult=good.a_mult, a_shift=good.a_shift, b_mult=good.b_mult,
                      b_shift=good.b_shift)
    with pytest.raises(ValueError, match=r"^LoRA for layers\.0\.q must be A \(4, 16\) and B \(16, 4\); "
                                         r"got A \(4, 15\) and B \(16, 4\)$"):
        lora_writes(qm, 4, {(0, "q"): bad})
    with pytest.raises(ValueError, match=r"^no LoRA slot at layer 0, projection 'k'"):
        lora_writes(qm, 4, {(0, "k"): good})
    wide = LoraAdapter(a=good.a * 0 + 200, b=good.b, a_mult=1, a_shift=1, b_mult=1, b_shift=1)
    with pytest.raises(ValueError, match=r"must hold int8 codes"):
        lora_writes(qm, 4, {(0, "q"): wide})



@pytest.mark.parametrize("field,value", [("a_shift", 0), ("b_shift", 0), ("a_shift", 64), ("b_shift", -1)])
def test_an_adapter_with_a_shift_the_chip_cannot_take_is_refused(field, value):
    """A shift of 0 made the chip's rescale add 2**63 (and the reference fail deep in round_shift): refused where
    any adapter is made, so neither lora_writes, the emulator nor the reference ever sees one."""
    qm = _qmodel("llama")
    good = random_adapters(qm, 5)[0, "q"]
    with pytest.raises(ValueError, match=rf"^LoRA {field} must be between 1 and 63, got {value} \(the rescale adds "
                                         r"2\*\*\(shift - 1\): a shift of 0 would add 2\*\*63 on the chip\)$"):
        dataclasses.replace(good, **{field: value})


def test_decoder_rejects_a_rank_it_cannot_multiply():
    ir = random_ir(family="llama", d=16, heads=2, kv_heads=1, ffn=24, vocab=20, context=8, layers=1)
    qm = quantize(ir, "int8", context=8, lora=LoraSpec(65, ("q",)))
    with pytest.raises(ValueError, match=r"^LoRA rank 65 is more than the 64 products the epilogue forms per output "
                                         r"row \(B t\); quantize with a rank of at most 64$"):
        Decoder(qm, lanes=4)


def test_writes_are_refused_while_busy():
    """ready is low from the accepted token until the decoder is idle again."""
    qm = _qmodel("llama")
    dut = Decoder(qm, lanes=4)
    seen = {}

    async def testbench(ctx):
        seen["idle"] = ctx.get(dut.lora.ready)
        ctx.set(dut.tokens.payload, {"token": 3, "new_seq": 1})
        ctx.set(dut.tokens.valid, 1)
        await ctx.tick().until(dut.tokens.ready)
        ctx.set(dut.tokens.valid, 0)
        seen["busy"] = ctx.get(dut.lora.ready)
        ctx.set(dut.out.ready, 1)
        await ctx.tick().until(dut.out.valid)
        await ctx.tick()
        seen["after"] = ctx.get(dut.lora.ready)

    run(dut, testbench, deadline_cycles=50_000)
    assert seen == {"idle": 1, "busy": 0, "after": 1}


def test_lora_map_matches_torch_int_codes():
    qm = _qmodel("gpt2")
    adapter = random_adapters(qm, 5)[0, "v"]
    assert adapter.a.dtype == torch.int64
    writes = dict(lora_writes(qm, 2, {(0, "v"): adapter}))
    slot = lora_address_map(qm)[1]
    assert writes[slot.a_base + slot.a_stride + 3] == int(adapter.a[1, 3]) & 0xFFFF
    assert writes[slot.b_base + 5 * slot.b_stride + 2] == int(adapter.b[5, 2]) & 0xFFFF
    assert writes[slot.reg_base + 3] == adapter.b_shift


def test_two_layers_each_slot_its_own_adapter():
    ir = random_ir(family="llama", d=16, heads=2, kv_heads=1, ffn=24, vocab=20, context=8, layers=2, seed=1)
    qm = quantize(ir, "int8", context=8, lora=LoraSpec(3, ("q", "o", "down")))
    adapters = random_adapters(qm, 7)
    del adapters[0, "o"]  # one slot left at reset: the zero adapter
    expected = _reference(qm, adapters)
    assert expected != _reference(qm)
    assert _decode(Decoder(qm, lanes=4), lora_writes(qm, 4, adapters), random.Random(5)) == expected


def test_rank_zero_build_has_no_adapters():
    ir = random_ir(family="gpt2", d=16, heads=2, kv_heads=2, ffn=24, vocab=20, context=8, layers=1)
    qm = quantize(ir, "int8", context=8, lora=LoraSpec(0, ()))
    assert lora_address_map(qm) == [] and lora_writes(qm, 4, {}) == []
    assert _decode(Decoder(qm, lanes=4), [], random.Random(6)) == _reference(qm)

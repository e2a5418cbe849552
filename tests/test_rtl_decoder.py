"""The whole Decoder in Amaranth's simulator against the integer reference, token for token."""

from __future__ import annotations

import random

import pytest
from random_ir import random_ir
from rtl_sim import run

from hardwire.quant import blocks
from hardwire.quant.quantize import quantize
from hardwire.quant.reference import ReferenceDecoder
from hardwire.rtl.decoder import Decoder

_QM = {}


def _qmodel(family: str, scheme: str):
    if (family, scheme) not in _QM:
        ir = random_ir(family=family, d=16, heads=2, kv_heads=1 if family == "llama" else 2, ffn=24, vocab=20,
                       context=8, layers=1)
        _QM[family, scheme] = quantize(ir, scheme, context=8)
    return _QM[family, scheme]


def decode(dut: Decoder, feed: list[tuple[int, bool]], generate: int, rng: random.Random) -> tuple[list[int], list]:
    """Feed tokens (token, new_seq); then generate by feeding each output back. -> outputs, status."""
    outputs: list[int] = []
    status: list = []

    async def testbench(ctx):
        async def one(token: int, new_seq: bool) -> int:
            ctx.set(dut.tokens.payload, {"token": token, "new_seq": new_seq})
            ctx.set(dut.tokens.valid, 1)
            await ctx.tick().until(dut.tokens.ready)
            ctx.set(dut.tokens.valid, 0)
            while True:
                ready = rng.random() < 0.7  # output backpressure
                ctx.set(dut.out.ready, ready)
                _, _, valid, payload = await ctx.tick().sample(dut.out.valid, dut.out.payload)
                if ready and valid:
                    ctx.set(dut.out.ready, 0)
                    return int(payload)

        for token, new_seq in feed:
            outputs.append(await one(token, new_seq))
        for _ in range(generate):
            outputs.append(await one(outputs[-1], False))
        status.append((ctx.get(dut.status.tokens), ctx.get(dut.status.cycles)))

    run(dut, testbench, deadline_cycles=100_000)
    return outputs, status


def reference_outputs(qm, feed: list[tuple[int, bool]], generate: int) -> list[int]:
    decoder = ReferenceDecoder(qm)
    out = []
    for token, new_seq in feed:
        if new_seq:
            decoder.reset()
        out.append(int(blocks.argmax(decoder.step(token))))
    for _ in range(generate):
        out.append(int(blocks.argmax(decoder.step(out[-1]))))
    return out


@pytest.mark.parametrize("family,scheme,lanes,storage", [("llama", "int8", 4, "rom"), ("gpt2", "int8", 2, "logic"),
                                                         ("llama", "mxfp4", 4, "logic"), ("llama", "mixed36", 8, "rom")])
def test_decoder_matches_reference(family, scheme, lanes, storage):
    qm = _qmodel(family, scheme)
    dut = Decoder(qm, lanes=lanes, storage=storage)
    feed = [(3, True), (7, False), (1, False)]
    got, status = decode(dut, feed, 3, random.Random(0))
    assert got == reference_outputs(qm, feed, 3)
    assert status[0][0] == 6


def test_decoder_rejects_lanes_it_cannot_use():
    qm = _qmodel("llama", "int8")
    with pytest.raises(ValueError, match=r"^lanes 16 must divide the head width 8: the attention products read whole "
                                         r"heads; accepted lanes for this model: 1, 2, 4, 8$"):
        Decoder(qm, lanes=16)

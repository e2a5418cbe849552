"""The whole Decoder in Amaranth's simulator against the integer reference, token for token."""

from __future__ import annotations

import random

import pytest
from break_check import assert_case_catches
from random_ir import random_ir, scheme_options
from rtl_sim import decode, run

from hardwire.quant.mutations import breaks
from hardwire.quant.quantize import quantize
from hardwire.quant.reference import ReferenceDecoder
from hardwire.rtl.decoder import Decoder

_QM = {}
SEEDS = {"llama": 7, "gpt2": 2}  # random models whose outputs on PROMPT vary and change under every break
PROMPT = [3, 7, 1]


def _qmodel(family: str, scheme: str):
    if (family, scheme) not in _QM:
        ir = random_ir(family=family, d=16, heads=2, kv_heads=1 if family == "llama" else 2, ffn=24, vocab=20,
                       context=8, layers=1, seed=SEEDS[family])
        # mixed36 at 5.5 bits: these one-layer models then hold int3 and int6 projections (at 5.0 GPT-2's are all int3)
        options = {"avg_bits": 5.5} if scheme == "mixed36" else scheme_options(scheme)
        _QM[family, scheme] = quantize(ir, scheme, context=8, **options)
    return _QM[family, scheme]


@pytest.mark.parametrize("family,scheme,rows,lanes,storage,options", [
    ("llama", "int8", 1, 4, "rom", {}),
    ("gpt2", "int8", 4, 2, "logic", {"softmax_lanes": 2}),
    ("llama", "mixed36", 2, 8, "rom", {"softmax_lanes": 4, "attention_rows": 1, "dsp_rows": 1}),
    ("llama", "int8", 8, 2, "rom", {"attention_rows": 2, "dsp_rows": 0}),
    ("llama", "mixed36", 8, 8, "rom", {"epilogue_lanes": 8, "attention_rows": 2, "softmax_lanes": 4}),
    ("gpt2", "mixed36", 4, 2, "logic", {"epilogue_lanes": 2, "softmax_lanes": 2}),
])
def test_decoder_matches_reference(family, scheme, rows, lanes, storage, options):
    """rows 4 divides the head width 8 (attention on all rows); the others run attention on 1 of 2 and 2 of 8 rows;
    the softmax's passes run on several lanes; two shapes multiply by shift-add on some rows: 6-bit mixed36 codes on
    row 1 of 2, and every row of 8 (8-bit codes, K and V included); the last two hand 8 and 2 rows per cycle
    through the epilogue (at 8 the head's last group of the 20 logits is a short beat of 4; the scores of 2
    attention rows reach the 4-lane softmax in beats of two; the GLU and GELU tables in beats; the LoRA terms of
    the adapted q and v per lane; V in beats of two over 4 attention rows at 2 lanes, one at a time over 2 at 8).
    Logic storage twice: int8 words, and mixed36's int_group-3 and -6 words. (MXFP4: the cocotb cycle test.)
    Every output is compared, the prompt's too, and every break of quant/mutations.py that applies (attention,
    values, queries, the MLP, the layer, the score scale, RoPE or the learned positions) changes one of them."""
    qm = _qmodel(family, scheme)
    if scheme == "mixed36":  # both word formats in the decoder's banks
        assert {lin.bits for _, lin in qm.linears()} == {3, 6}
    want = assert_case_catches(qm, PROMPT, 4)
    dut = Decoder(qm, rows=rows, lanes=lanes, storage=storage, **options)
    feed = [(token, i == 0) for i, token in enumerate(PROMPT)]
    got, status = decode(dut, feed, 3, random.Random(0))
    assert got == want  # the output after each of the 3 prompt tokens, then after each of 3 generated tokens
    assert status[0][0] == 6


def test_decoder_rejects_rows_it_cannot_use():
    qm = _qmodel("llama", "int8")
    for rows in (0, 3, 128, True):
        with pytest.raises(ValueError, match=rf"^rows must be a power of two from 1 to 64, got {rows!r}$"):
            Decoder(qm, rows=rows, lanes=4)


def test_decoder_rejects_attention_rows_it_cannot_use():
    qm = _qmodel("llama", "int8")  # head width 8
    with pytest.raises(ValueError, match=r"^attention rows must be a power of two that divides the head width 8 and is "
                                         r"at most rows \(4\), got 8; accepted: 1, 2, 4$"):
        Decoder(qm, rows=4, lanes=4, attention_rows=8)


def test_decoder_rejects_softmax_lanes_it_cannot_use():
    qm = _qmodel("llama", "int8")
    for softmax_lanes in (3, 8):  # not a power of two; not a divisor of lanes 4
        with pytest.raises(ValueError, match=rf"^softmax lanes must be a power of two that divides lanes \(4\), got "
                                             rf"{softmax_lanes}$"):
            Decoder(qm, lanes=4, softmax_lanes=softmax_lanes)


def test_decoder_rejects_dsp_rows_it_cannot_use():
    qm = _qmodel("llama", "int8")
    for dsp_rows in (-1, 5, True):
        with pytest.raises(ValueError, match=rf"^DSP rows must be None \(all\) or a count from 0 to rows \(4\), got "
                                             rf"{dsp_rows!r}$"):
            Decoder(qm, rows=4, lanes=4, dsp_rows=dsp_rows)


def test_decoder_rejects_lanes_it_cannot_use():
    qm = _qmodel("llama", "int8")
    with pytest.raises(ValueError, match=r"^lanes 16 must divide the head width 8: the attention products read whole "
                                         r"heads; accepted lanes for this model: 1, 2, 4, 8$"):
        Decoder(qm, lanes=16)


def test_new_sequence_full_context_and_bad_token():
    """new_seq empties the cache; a full context or an out-of-range id sets its flag and yields no token."""
    qm = _qmodel("llama", "int8")
    dut = Decoder(qm, lanes=4, storage="rom")
    seen: dict[str, object] = {}

    async def testbench(ctx):
        async def offer(token: int, new_seq: bool) -> int | None:
            ctx.set(dut.tokens.payload, {"token": token, "new_seq": new_seq})
            ctx.set(dut.tokens.valid, 1)
            await ctx.tick().until(dut.tokens.ready)
            ctx.set(dut.tokens.valid, 0)
            ctx.set(dut.out.ready, 1)
            for _ in range(20_000):
                _, _, valid, payload, busy = await ctx.tick().sample(dut.out.valid, dut.out.payload, dut.status.busy)
                if valid:
                    ctx.set(dut.out.ready, 0)
                    return int(payload)
                if not busy:
                    ctx.set(dut.out.ready, 0)
                    return None
            raise AssertionError("decoder hung")

        first = [await offer(t, i == 0) for i, t in enumerate([4, 9, 2])]
        again = [await offer(t, i == 0) for i, t in enumerate([4, 9, 2])]  # a new sequence: same tokens
        seen["sequences"] = (first, again)
        seen["bad"] = await offer(qm.config.vocab_size, False)
        seen["bad_flag"] = ctx.get(dut.status.bad_token)
        for _ in range(qm.context - 3):
            await offer(1, False)
        seen["full"] = await offer(1, False)
        seen["full_flag"] = ctx.get(dut.status.context_full)
        seen["position"] = ctx.get(dut.status.position)
        seen["after_reset"] = await offer(4, True)
        seen["flags_after_reset"] = (ctx.get(dut.status.context_full), ctx.get(dut.status.bad_token))

    run(dut, testbench, deadline_cycles=400_000)
    first, again = seen["sequences"]
    assert first == again == ReferenceDecoder(qm).outputs([4, 9, 2], 1)
    assert seen["bad"] is None and seen["bad_flag"] == 1
    assert seen["full"] is None and seen["full_flag"] == 1 and seen["position"] == qm.context
    assert seen["after_reset"] == first[0] and seen["flags_after_reset"] == (0, 0)


def test_decoder_rejects_epilogue_lanes_it_cannot_use():
    qm = _qmodel("llama", "int8")
    for epilogue_lanes in (0, 3, 8, True):  # not a power of two; 8 does not divide rows 4 (nor lanes 4)
        with pytest.raises(ValueError, match=rf"^epilogue lanes must be a power of two that divides rows \(4\) and "
                                             rf"lanes \(4\), got {epilogue_lanes!r}$"):
            Decoder(qm, rows=4, lanes=4, epilogue_lanes=epilogue_lanes)


def test_post_sublayer_norms_on_a_wide_engine():
    """Post-sublayer norms (Gemma 2, 3) with signed gains, MXFP4, on 2 rows with 2 epilogue lanes: o's and down's
    rows reach their norm in beats of two, its output is added to the residual an element a cycle and loads the next
    norm. Every output equals the reference's (each break that applies changes one, the post norms skipped among
    them), and every token's cycles (output always taken) are the plan's. The cocotb case runs Gemma 2 on 1 x 8."""
    from hardwire.rtl.plan import cycles_per_token_estimate

    ir = random_ir(family="llama", d=16, heads=2, kv_heads=1, ffn=24, vocab=20, context=8, layers=1, seed=0,
                   post_norms=True)
    qm = quantize(ir, "mxfp4", context=8)
    want = assert_case_catches(qm, PROMPT, 4)
    assert "post_norm_skipped" in breaks(qm)
    dut = Decoder(qm, rows=2, lanes=8, epilogue_lanes=2)
    got, cycles = [], []

    async def testbench(ctx):
        ctx.set(dut.out.ready, 1)
        for k in range(len(PROMPT) + 3):
            start = ctx.get(dut.status.cycles)
            ctx.set(dut.tokens.payload, {"token": PROMPT[k] if k < len(PROMPT) else got[-1], "new_seq": k == 0})
            ctx.set(dut.tokens.valid, 1)
            await ctx.tick().until(dut.tokens.ready)
            ctx.set(dut.tokens.valid, 0)
            while True:
                _, _, valid, payload = await ctx.tick().sample(dut.out.valid, dut.out.payload)
                if valid:
                    got.append(int(payload))
                    break
            await ctx.tick()
            cycles.append(ctx.get(dut.status.cycles) - start - 1)  # the cycle after the token left

    run(dut, testbench, deadline_cycles=100_000)
    assert got == want
    assert cycles == [cycles_per_token_estimate(qm, dut.plan, p) for p in range(len(cycles))]

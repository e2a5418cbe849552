"""HostLink with the real Decoder of a tiny model in Amaranth's simulator, spoken to in
protocol.py's bytes and answered in frames parsed by protocol.FrameParser."""

from __future__ import annotations

import dataclasses

import pytest
from amaranth.hdl import Fragment, Module
from random_ir import random_adapters, random_ir

from hardwire.boards.core import BoardCore
from hardwire.boards.host_link import HostLink
from hardwire.host import protocol
from hardwire.host.protocol import Reply
from hardwire.quant.quantize import quantize
from hardwire.quant.reference import ReferenceDecoder
from hardwire.rtl.decoder import Decoder
from hardwire.rtl.lora_map import lora_addr_bits, lora_address_map, lora_writes, shift_addresses

LANES = 8
TIMEOUT = 300  # cycles of quiet line that end a frame or a garbage burst
VOCAB, CONTEXT = 20, 16
_QM: list = []


def _qm():
    if not _QM:
        ir = random_ir(d=16, heads=2, kv_heads=1, ffn=24, vocab=VOCAB, context=CONTEXT, layers=1, seed=3)
        _QM.append(quantize(ir, "int8", context=CONTEXT))
    return _QM[0]


def _dut(qm, core: BoardCore | None = None):
    """A Decoder and a HostLink wired together: new ones, or the pair inside a BoardCore (without its UART)."""
    m = Module()
    if core is not None:
        m.submodules.decoder = dec = core.decoder
        m.submodules.link = link = core.link
    else:
        m.submodules.decoder = dec = Decoder(qm, lanes=LANES, storage="rom")
        m.submodules.link = link = HostLink(vocab=qm.config.vocab_size, context=qm.context, lanes=LANES,
                                            lora_addr_bits=lora_addr_bits(qm), timeout=TIMEOUT,
                                            lora_shifts=shift_addresses(qm))
    m.d.comb += [dec.tokens.valid.eq(link.tokens.valid), dec.tokens.payload.eq(link.tokens.payload),
                 link.tokens.ready.eq(dec.tokens.ready),
                 link.out.valid.eq(dec.out.valid), link.out.payload.eq(dec.out.payload), dec.out.ready.eq(link.out.ready),
                 dec.lora.valid.eq(link.lora.valid), dec.lora.payload.eq(link.lora.payload),
                 link.lora.ready.eq(dec.lora.ready), link.status.eq(dec.status)]
    return m, link


def _session(qm, script, deadline: int = 400_000, core: BoardCore | None = None) -> list[list[protocol.Response]]:
    """Run `script`: a list of (bytes to send, replies to wait for, extra quiet cycles after them).
    Bytes go out one per few cycles (faster than a UART, which HostLink does not care about).
    Returns the replies collected for each step; fails on a deadline instead of hanging."""
    m, link = _dut(qm, core)
    parser = protocol.FrameParser()
    replies: list[protocol.Response] = []
    per_step: list[list[protocol.Response]] = []

    async def host(ctx):
        for data, wait_for, quiet in script:
            before = len(replies)
            for byte in data:
                ctx.set(link.rx.payload, byte)
                ctx.set(link.rx.valid, 1)
                await ctx.tick().until(link.rx.ready)
                ctx.set(link.rx.valid, 0)
                await ctx.tick().repeat(2)
            while len(replies) < before + wait_for:
                await ctx.tick()
            if quiet:
                await ctx.tick().repeat(quiet)
            per_step.append(replies[before:])

    async def device(ctx):
        ctx.set(link.tx.ready, 1)
        while True:
            _, _, valid, payload = await ctx.tick().sample(link.tx.valid, link.tx.payload)
            if valid:
                replies.extend(parser.push(bytes([int(payload)])))

    assert run_until(m, host, device, deadline)
    assert parser.dropped == 0
    return per_step


def run_until(m, main, background, deadline: int) -> bool:
    """rtl_sim.run with a background process that never returns (the byte collector)."""
    from amaranth.sim import Simulator

    sim = Simulator(m)
    sim.add_clock(1e-8)
    done: list[bool] = []

    async def wrapped(ctx):
        await main(ctx)
        done.append(True)

    async def watchdog(ctx):
        for _ in range(0, deadline, 512):
            if done:
                return
            await ctx.tick().repeat(512)
        raise AssertionError(f"simulation did not finish within {deadline} cycles")

    sim.add_testbench(wrapped)
    sim.add_process(background)
    sim.add_testbench(watchdog)
    sim.run()
    return bool(done)


def _ops(replies) -> list[str]:
    return [str(r) if r.op == Reply.ERROR else Reply(r.op).name for r in replies]


def _feed(tokens):
    return b"".join(protocol.feed(tokens))


PROMPT, N = [3, 7, 1], 4


def test_feed_generate_matches_reference():
    qm = _qm()
    ref = ReferenceDecoder(qm).generate(PROMPT, N)
    # the second FEED and the STATUS arrive while the first FEED runs: parsed into the other buffer
    # bank, they wait for it, and the replies leave in order
    steps = _session(qm, [(protocol.reset(), 1, 0),
                          (_feed(PROMPT[:1]) + _feed(PROMPT[1:]) + protocol.status(), 3, 0),
                          (protocol.generate(N), N + 1, 0), (protocol.status(), 1, 0), (protocol.hello(), 1, 0)])
    assert _ops(steps[0]) == ["ACK"] and _ops(steps[1]) == ["ACK", "ACK", "STATUS"]
    assert steps[1][2].status.tokens == len(PROMPT)
    assert [r.token for r in steps[2][:N]] == ref
    assert _ops(steps[2]) == ["TOKEN"] * N + ["ACK"]
    status = steps[3][0].status
    fed = len(PROMPT) + N  # the device feeds the last generated token too
    assert (status.tokens, status.position, status.flags) == (fed, fed, protocol.Flag(0))
    assert status.cycles > 0
    assert steps[4][0].op == Reply.HELLO
    assert steps[4][0].payload == protocol.hello_payload(protocol.Hello(protocol.PROTOCOL_VERSION, VOCAB, CONTEXT, LANES))


def test_frame_errors():
    qm = _qm()
    good = protocol.status()
    bad_crc = good[:-1] + bytes([good[-1] ^ 0x40])
    steps = _session(qm, [
        (bad_crc, 1, 0),
        (protocol.frame(0x07), 1, 0),  # unknown op
        (protocol.frame(protocol.Op.FEED, b"\x01\x00\x02"), 1, 0),  # odd FEED
        (protocol.frame(protocol.Op.GENERATE, b"\x00\x00"), 1, 0),  # N = 0
        (protocol.frame(protocol.Op.RESET, b"\x00"), 1, 0),
        (protocol.frame(protocol.Op.LORA, b"\x00\x00\x00\x01"), 1, 0),  # no whole word
        (good[:3], 1, 0),  # a frame that stops part-way
        (b"\x00\x13\x37\xff", 1, TIMEOUT + 50),  # garbage: one error for the burst
        (b"\x13\x37" + good[:2], 1, TIMEOUT + 50),  # garbage, then a frame that stops: still one error
        (protocol.generate(2), 1, 0),  # nothing fed since power-up
        (protocol.status(), 1, 0),  # still answers after all that
    ])
    assert [_ops(s) for s in steps] == [
        ["ERROR BAD_CRC"], ["ERROR UNKNOWN_OP"], ["ERROR BAD_LENGTH"], ["ERROR BAD_LENGTH"], ["ERROR BAD_LENGTH"],
        ["ERROR BAD_LENGTH"], ["ERROR TIMEOUT"], ["ERROR GARBAGE"], ["ERROR TIMEOUT"], ["ERROR NO_PREDICTION"],
        ["STATUS"]]
    assert steps[10][0].status.tokens == 0  # no rejected frame fed anything


def test_token_errors_and_context_full():
    qm = _qm()
    ref = ReferenceDecoder(qm).generate([5], 3)
    steps = _session(qm, [
        (_feed([5, 1 << 5]), 1, 0),  # 32 does not fit 5 token bits: never fed
        (protocol.generate(1), 1, 0),  # the prediction was forgotten
        (protocol.reset() + _feed([VOCAB]), 2, 0),  # fits the port but not the vocabulary: the decoder flags it
        (protocol.status(), 1, 0),
        (protocol.reset() + _feed([5]) + protocol.generate(3), 6, 0),
        (protocol.reset() + _feed(list(range(CONTEXT))), 2, 0),  # fills the context exactly
        (protocol.generate(1), 2, 0),  # the token is sent, then feeding it finds the context full
        (protocol.status(), 1, 0),
    ])
    assert _ops(steps[0]) == ["ERROR BAD_TOKEN"]
    assert _ops(steps[1]) == ["ERROR NO_PREDICTION"]
    assert _ops(steps[2]) == ["ACK", "ERROR BAD_TOKEN"]
    assert steps[3][0].status.flags == protocol.Flag.BAD_TOKEN
    assert _ops(steps[4]) == ["ACK", "ACK", "TOKEN", "TOKEN", "TOKEN", "ACK"]
    assert [r.token for r in steps[4][2:5]] == ref
    assert _ops(steps[5]) == ["ACK", "ACK"]
    assert _ops(steps[6]) == ["TOKEN", "ERROR CONTEXT_FULL"]
    assert steps[7][0].status.flags == protocol.Flag.CONTEXT_FULL
    assert steps[7][0].status.position == CONTEXT


def test_busy_and_reset_during_generate():
    qm = _qm()
    ref = ReferenceDecoder(qm).generate(PROMPT, 3)
    steps = _session(qm, [
        (protocol.reset() + _feed(PROMPT), 2, 0),
        (protocol.generate(12), 1, 0),  # wait for the first TOKEN: GENERATE is running
        (protocol.status(), 1, 0),  # BUSY (maybe after more TOKENs)
        (protocol.reset(), 1, 0),
        (b"", 0, 3000),  # nothing more after the RESET's ACK
        (_feed(PROMPT) + protocol.generate(3), 5, 0),  # a new sequence from position 0
    ])
    assert _ops(steps[1]) == ["TOKEN"]
    busy = [r for r in steps[2] if r.op == Reply.ERROR]
    assert _ops(busy) == ["ERROR BUSY"] and all(r.op == Reply.TOKEN for r in steps[2] if r.op != Reply.ERROR)
    after = [*steps[2], *steps[3], *steps[4]]
    assert _ops(after)[-1] == "ACK" and _ops(after).count("ACK") == 1  # the RESET's ACK, none for the GENERATE
    generated = [r.token for r in [*steps[1], *after] if r.op == Reply.TOKEN]
    assert 1 <= len(generated) < 12
    assert generated == ReferenceDecoder(qm).generate(PROMPT, len(generated))
    assert _ops(steps[5]) == ["ACK", "TOKEN", "TOKEN", "TOKEN", "ACK"]
    assert [r.token for r in steps[5][1:4]] == ref


def test_lora_write_then_generate():
    qm = _qm()
    adapters = random_adapters(qm, 4)
    assert adapters, "the test model has no LoRA slots"
    plain = ReferenceDecoder(qm).generate(PROMPT, 3)
    adapted = ReferenceDecoder(qm, lora=adapters).generate(PROMPT, 3)
    assert plain != adapted  # the adapter changes the continuation, so the check below means something
    frames = protocol.lora(lora_writes(qm, LANES, adapters))
    steps = _session(qm, [(f, 1, 0) for f in frames] + [(protocol.reset() + _feed(PROMPT) + protocol.generate(3), 6, 0)],
                     deadline=2_000_000)
    assert all(_ops(s) == ["ACK"] for s in steps[:-1])
    assert _ops(steps[-1]) == ["ACK", "ACK", "TOKEN", "TOKEN", "TOKEN", "ACK"]
    assert [r.token for r in steps[-1][2:5]] == adapted


def test_lora_frame_with_a_zero_shift_is_refused_whole():
    """HostLink's receiver follows each LORA word's port address as the bytes arrive: a frame with a word whose low 6
    bits are 0 bound for an a_shift or b_shift register (the last word; through the address wrap) is ERROR
    BAD_LORA_SHIFT and writes nothing (the decode stays the plain model's, though the frames hold the adapter's A and
    B); its valid version is ACKed and loads the adapter."""
    qm = _qm()
    adapters = random_adapters(qm, 4)
    key = next(iter(adapters))
    slot = next(s for s in lora_address_map(qm) if (s.layer, s.site) == key)
    bits = lora_addr_bits(qm)
    good = dict(lora_writes(qm, LANES, {key: adapters[key]}))
    assert max(good) == slot.reg_base + 3 and slot.reg_base + 3 in shift_addresses(qm)

    def frame(start: int, first: int, **regs: int) -> bytes:  # words first .. b_shift, at 24-bit address start
        words = {**good, slot.reg_base + 1: regs.get("a_shift", good[slot.reg_base + 1]),
                 slot.reg_base + 3: regs.get("b_shift", good[slot.reg_base + 3])}
        return b"".join(protocol.lora([(start + a - first, words[a]) for a in range(first, slot.reg_base + 4)]))

    plain = ReferenceDecoder(qm).generate(PROMPT, 3)
    adapted = ReferenceDecoder(qm, lora={key: adapters[key]}).generate(PROMPT, 3)
    assert plain != adapted
    go = protocol.reset() + _feed(PROMPT) + protocol.generate(3)
    first = slot.reg_base - 60
    refused = [frame(first, first, b_shift=0), frame((1 << 24) - (1 << bits) + first, first, a_shift=0x40)]
    assert all(len(f) == 7 + 2 * 64 for f in refused)  # one frame each
    steps = _session(qm, [(f, 1, 0) for f in refused] + [(go, 6, 0)]
                     + [(f, 1, 0) for f in protocol.lora(sorted(good.items()))] + [(go, 6, 0)], deadline=3_000_000)
    assert [_ops(s) for s in steps[:2]] == [["ERROR BAD_LORA_SHIFT"]] * 2
    assert _ops(steps[2]) == ["ACK", "ACK", "TOKEN", "TOKEN", "TOKEN", "ACK"]
    assert [r.token for r in steps[2][2:5]] == plain  # nothing of the refused frames was written
    assert all(_ops(s) == ["ACK"] for s in steps[3:-1])
    assert [r.token for r in steps[-1][2:5]] == adapted


def test_lora_shifts_must_fit_the_port():
    with pytest.raises(ValueError, match=r"^lora_shifts must be addresses below 2\*\*lora_addr_bits = 256, got 256$"):
        HostLink(vocab=20, context=16, lanes=8, lora_addr_bits=8, timeout=100, lora_shifts=[256])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"vocab": 0}, "vocab must be an integer from 1 to 65535, got 0"),
    ({"timeout": 0}, "timeout must be an integer from 1 to 4294967296, got 0"),
    ({"lanes": 256}, "lanes must be an integer from 1 to 255, got 256"),
])
def test_bad_arguments(kwargs, message):
    args = {"vocab": 20, "context": 16, "lanes": 8, "lora_addr_bits": 8, "timeout": 100, **kwargs}
    with pytest.raises(ValueError, match=f"^{message}$"):
        HostLink(**args)


@pytest.mark.parametrize("declared,built", [(None, 12), (CONTEXT, 8)])
def test_board_reports_the_context_it_is_built_with(declared, built):
    """The board's host link takes qm.context, the context the build has (`hardwire compile --context`), not
    qm.config.context, what the graph declares: None for a RoPE graph without metadata (a Hugging Face Llama),
    which BoardCore refused, or a longer context than the KV cache holds, which HELLO reported."""
    from hardwire.boards.top import BoardTop

    ir = random_ir(d=16, heads=2, kv_heads=1, ffn=24, vocab=VOCAB, context=CONTEXT, layers=1, seed=3)
    ir = dataclasses.replace(ir, config=dataclasses.replace(ir.config, context=declared))
    qm = quantize(ir, "int8", context=built)
    assert (qm.config.context, qm.context) == (declared, built)
    top = BoardTop(qm, lanes=LANES, storage="rom", board="ulx3s")  # what `hardwire build --board ulx3s` elaborates
    Fragment.get(top, top.platform)
    assert top.core.link.context == built
    core = BoardCore(qm, lanes=LANES, storage="rom", clk_hz=8 * 115_200, baud=115_200)
    Fragment.get(core, None)  # its UART too; the session below drives its decoder and host link directly
    assert core.link.lora_shifts == tuple(shift_addresses(qm)) and core.link.lora_shifts  # BAD_LORA_SHIFT's registers
    ref = ReferenceDecoder(qm).generate([5], 3)
    steps = _session(qm, [(protocol.hello(), 1, 0), (protocol.reset() + _feed([5]) + protocol.generate(3), 6, 0),
                          (protocol.reset() + _feed(list(range(built))), 2, 0),  # fills the built context exactly
                          (protocol.generate(1), 2, 0)], core=core)
    assert steps[0][0].op == Reply.HELLO
    assert steps[0][0].hello == protocol.Hello(protocol.PROTOCOL_VERSION, VOCAB, built, LANES)
    assert [r.token for r in steps[1][2:5]] == ref
    assert _ops(steps[2]) == ["ACK", "ACK"]
    assert _ops(steps[3]) == ["TOKEN", "ERROR CONTEXT_FULL"]  # the decoder's context is the one HELLO reported

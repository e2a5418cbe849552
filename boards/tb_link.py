"""cocotb testcases for the host link of BoardCore, through its UART pins only (boards/sim_board.py BoardSim runs them).

Every reply is compared exactly: with a literal list where the protocol fixes it, and otherwise with the emulator
(boards/emulator.py), which is fed the same bytes at the same line times, so the two statements of the protocol
(the RTL and the Python model) are checked against each other on whatever the scripts throw at them:
  rx_buffer    a second frame (and a hundred more) sent while a FEED decodes: all answered, in order;
  rx_overflow  more than the receive FIFO holds sent while a FEED decodes: the frames it held, then ERROR OVERFLOW;
  soak         thousands of random bytes with random valid frames, cut frames, bad CRCs and a byte arriving
               while a reply leaves; then RESET and a prompt whose tokens equal the integer reference;
  client       the real DeviceClient (boards/client.py) over a transport served by the simulation;
  differential hand-made scripts (valid, garbage, LoRA writes at unmapped and wrapping addresses).
The spec (HARDWIRE_LINK_SPEC) gives the saved QModel, divisor, frame timeout, clock, lanes and each testcase's inputs;
each testcase writes its figures to results/<name>.json. The bench they share (LinkTB, the emulator as the oracle,
SimTransport) is boards/tb_link_bench.py.
"""

from __future__ import annotations

import random
import struct

import cocotb

from hardwire.boards import protocol
from hardwire.boards.protocol import Op
from hardwire.boards.tb_link_bench import (
    Oracle,
    SimTransport,
    describe,
    exchange_during,
    feed_frames,
    hello_reply,
    normalised,
    setup,
    write_result,
)
from hardwire.quant.qmodel import QModel
from hardwire.quant.reference import LoraAdapter, ReferenceDecoder
from hardwire.rtl.lora_map import lora_addr_bits, lora_address_map


@cocotb.test()
async def rx_buffer(dut: object) -> None:
    """Frames sent while a FEED decodes wait in the receive FIFO and are all answered, in order."""
    spec, qm, tb = await setup(dut)
    prompt = spec["long_prompt"]
    ref = ReferenceDecoder(qm).generate(prompt, 3)
    oracle = Oracle(qm, spec, spec["token_cycles"])
    hello = hello_reply(spec, qm)
    steps = [protocol.reset(),
             feed_frames(prompt) + protocol.hello() + protocol.generate(3),  # the second frame while the first decodes
             protocol.reset() + feed_frames(prompt) + protocol.hello() * 100 + protocol.status()]  # 404 bytes behind it
    expected = [["ACK"], ["ACK", hello, *(f"TOKEN {t}" for t in ref), "ACK"],
                ["ACK", "ACK", *[hello] * 100, f"STATUS tokens={2 * len(prompt) + 3} position={len(prompt)} flags=0"]]
    waits = []
    for step, want, feed_ack in zip(steps, expected, [0, 0, 4], strict=True):  # the byte where the FEED's ACK starts
        start_rx = len(tb.received)
        got = [describe(r) for r in await tb.exchange(step, len(want), "rx_buffer")]
        assert got == want, f"RTL: {got}\nexpected: {want}"
        assert [describe(r) for r in oracle.chunk(step)] == want, "the emulator disagrees"
        waits.append(tb.rx_cycles[start_rx + feed_ack] - tb.send_end)
    # every byte of steps 1 and 2 was on the wire before their first reply (the FEED's ACK): the frames behind the
    # FEED really arrived while it decoded
    assert waits[1] > 0 and waits[2] > 0, waits
    # a frame cut short in the FIFO behind a FEED and a waiting HELLO: the line has long been quiet when the FEED
    # ends, so the TIMEOUT follows the HELLO's reply at once (the quiet count stops at the timeout while the FIFO
    # holds bytes; it once wrapped and counted again, delaying the TIMEOUT by up to 2,048 cycles)
    step = protocol.reset() + feed_frames(prompt[:30]) + protocol.hello() + protocol.hello()[:2]
    start_rx = len(tb.received)
    want = ["ACK", "ACK", hello, "ERROR TIMEOUT"]
    got = [describe(r) for r in await tb.exchange(step, len(want), "rx_buffer: cut frame behind a FEED")]
    assert got == want and [describe(r) for r in oracle.chunk(step)] == want, got
    gap = tb.rx_cycles[start_rx + 20] - tb.rx_cycles[start_rx + 19]  # ACK, ACK: 8 bytes; HELLO: 12
    assert gap <= 2 * tb.byte_cycles, f"the TIMEOUT came {gap} cycles after the HELLO's reply"
    write_result(spec, "rx_buffer", {"replies": [len(w) for w in expected], "bytes": [len(s) for s in steps],
                               "first_reply_after_last_byte_cycles": waits, "timeout_after_ack_cycles": gap})


@cocotb.test()
async def rx_overflow(dut: object) -> None:
    """More than the FIFO holds behind a FEED: the frames it held are answered, then one ERROR OVERFLOW; the link
    then works (HELLO, and a prompt whose tokens equal the reference)."""
    spec, qm, tb = await setup(dut)
    prompt, depth = spec["long_prompt"], spec["rx_depth"]
    oracle = Oracle(qm, spec, spec["token_cycles"])
    hello = hello_reply(spec, qm)
    await tb.exchange(protocol.reset(), 1, "reset")
    oracle.chunk(protocol.reset())
    # held: one HELLO (the receiver's waiting frame); FIFO: 2 garbage bytes, 127 HELLOs, the first 2 bytes of a
    # HELLO = 512 bytes; every later byte is dropped; the frame cut there and the garbage make one ERROR OVERFLOW
    assert depth == 2 + 4 * 127 + 2
    flood = feed_frames(prompt) + protocol.hello() + b"\x00\x00" + protocol.hello() * 130
    want = ["ACK", *[hello] * 128, "ERROR OVERFLOW"]
    first_reply = len(tb.received)
    got = [describe(r) for r in await tb.exchange(flood, len(want), "rx_overflow")]
    wait = tb.rx_cycles[first_reply] - tb.send_end
    assert wait > 0, f"the FEED's ACK came {-wait} cycles before the flood ended: the FIFO was never full"
    assert got == want, f"RTL: {got[:3]} ... {got[-3:]} ({len(got)} replies)\nexpected {len(want)}"
    emulated = [describe(r) for r in oracle.chunk(flood)]
    assert emulated == want, f"the emulator: {emulated[:3]} ... {emulated[-3:]} ({len(emulated)} replies)"
    dropped = oracle.device.dropped
    assert dropped == len(flood) - len(feed_frames(prompt)) - 4 - depth
    after = [protocol.hello(), protocol.reset() + feed_frames(prompt[:5]) + protocol.generate(4)]
    ref = ReferenceDecoder(qm).generate(prompt[:5], 4)
    for step, expect in zip(after, [[hello], ["ACK", "ACK", *(f"TOKEN {t}" for t in ref), "ACK"]], strict=True):
        got = [describe(r) for r in await tb.exchange(step, len(expect), "after the overflow")]
        assert got == expect, f"{got} != {expect}"
    write_result(spec, "rx_overflow", {"sent": len(flood), "answered": len(want), "dropped": dropped,
                                 "first_reply_after_last_byte_cycles": wait})


def _random_frame(rng: random.Random, qm: QModel, unmapped: list[int]) -> bytes:
    """One valid command: mostly ordinary, sometimes with ids outside the vocabulary or LoRA words at unmapped addresses
    (none that could change the model: the soak ends with a prompt checked against the plain reference)."""
    vocab = qm.config.vocab_size
    token_bits = max(1, (vocab - 1).bit_length())
    kind = rng.choices(["hello", "status", "reset", "feed", "generate", "lora", "badfeed"], [2, 2, 3, 4, 4, 1, 1])[0]
    if kind == "hello":
        return protocol.hello()
    if kind == "status":
        return protocol.status()
    if kind == "reset":
        return protocol.reset()
    if kind == "feed":
        return feed_frames([rng.randrange(vocab) for _ in range(rng.randrange(1, 6))])
    if kind == "badfeed":
        bad = rng.choice([rng.randrange(vocab, 1 << token_bits), rng.randrange(1 << token_bits, 1 << 16)])
        return feed_frames([rng.randrange(vocab), bad])
    if kind == "generate":
        return protocol.generate(rng.randrange(1, 5))
    start = rng.choice(unmapped)
    n = rng.randrange(1, 1 + min(6, len(unmapped) - unmapped.index(start)))
    bits = lora_addr_bits(qm)
    high = rng.randrange(1 << (24 - bits)) << bits  # any upper address bits: the port keeps the low ones
    return b"".join(protocol.lora([(high + start + i, rng.randrange(1 << 16)) for i in range(n)]))


@cocotb.test()
async def soak(dut: object) -> None:
    """Random bytes, valid frames, cut frames, bad CRCs and bytes during replies through the UART pins; every reply
    equal to the emulator's; then RESET and a prompt whose tokens equal the integer reference."""
    spec, qm, tb = await setup(dut)
    rng = random.Random(spec["soak"]["seed"])
    oracle = Oracle(qm, spec)
    slots = lora_address_map(qm)
    unmapped = list(range(slots[-1].end, 1 << lora_addr_bits(qm)))
    assert unmapped, "the test model's LoRA map fills its address space: no unmapped address to write"
    counts: dict[str, int] = {}
    replies: dict[str, int] = {}
    random_bytes = frames = tokens = 0

    def count(key: str, n: int = 1) -> None:
        counts[key] = counts.get(key, 0) + n

    while random_bytes < spec["soak"]["random_bytes"] or frames < spec["soak"]["frames"]:
        kind = rng.choices(["garbage", "frame", "frames", "cut", "cut_then_frame", "bad_crc", "during"],
                           [6, 6, 2, 2, 2, 2, 2])[0]
        count(kind)
        if kind == "garbage":
            chunk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 80)))
            random_bytes += len(chunk)
        elif kind == "frame":
            chunk = _random_frame(rng, qm, unmapped)
            frames += 1
        elif kind == "frames":  # back to back: each waits for the one before it
            parts = [_random_frame(rng, qm, unmapped) for _ in range(rng.randrange(2, 5))]
            parts = [p for p in parts if p[1] != Op.GENERATE] + [p for p in parts if p[1] == Op.GENERATE][:1]
            chunk, frames = b"".join(parts), frames + len(parts)
            count("frames_in_groups", len(parts))
        elif kind == "cut":
            whole = _random_frame(rng, qm, unmapped)
            chunk = whole[:rng.randrange(1, len(whole))]
        elif kind == "cut_then_frame":
            whole = _random_frame(rng, qm, unmapped)
            chunk = whole[:rng.randrange(1, len(whole))] + _random_frame(rng, qm, unmapped)  # swallowed by the cut one
        elif kind == "bad_crc":
            whole = _random_frame(rng, qm, unmapped)
            chunk = whole[:-1] + bytes([whole[-1] ^ rng.randrange(1, 256)])
        if kind != "during":
            want = [describe(r) for r in oracle.chunk(chunk)]
            got = [describe(r) for r in await tb.exchange(chunk, len(want), f"soak chunk {sum(counts.values())}")]
            assert got == want, f"soak, {kind} {chunk.hex()}: RTL {got}, emulator {want}"
        else:  # a byte (or a frame) while a reply leaves: after a STATUS, or among a GENERATE's TOKENs
            after = 1  # the first byte of the STATUS reply
            if rng.random() < 0.5:
                frame, extra = protocol.status(), bytes([rng.randrange(256)])
            else:
                after = 4 + 4 + 1  # RESET's and FEED's ACKs, then the first byte of the first TOKEN
                frame = protocol.reset() + feed_frames([rng.randrange(qm.config.vocab_size)]) + protocol.generate(6)
                extra = bytes([rng.randrange(256)])  # a whole frame would get BUSY, which the emulator (no decode
                # time here) cannot say: the differential testcase checks BUSY
            want = [describe(r) for r in oracle.chunk(frame + extra)]
            got = [describe(r) for r in await exchange_during(tb, frame, extra, len(want), "soak: byte during a reply", after)]
            assert normalised(got) == normalised(want), f"soak, during {frame.hex()} + {extra.hex()}: RTL {got}, " \
                                                          f"emulator {want}"
            chunk, frames, random_bytes = frame + extra, frames + 1, random_bytes + 1
        for r in got:
            key = r.split()[0] if not r.startswith("ERROR") else r
            replies[key] = replies.get(key, 0) + 1
            tokens += r.startswith("TOKEN")
        count("bytes", len(chunk))
    # the end: a prompt through the same link, tokens equal to the integer reference
    prompt, n = spec["soak"]["prompt"], spec["soak"]["n"]
    ref = ReferenceDecoder(qm).generate(prompt, n)
    got = [describe(r) for r in await tb.exchange(protocol.reset() + feed_frames(prompt) + protocol.generate(n), n + 3,
                                                  "soak: the final prompt")]
    assert got == ["ACK", "ACK", *(f"TOKEN {t}" for t in ref), "ACK"], f"after the soak: {got}, reference {ref}"
    assert tb.parser.dropped == 0, "the board sent bytes that are not frames"
    write_result(spec, "soak", {"chunks": counts, "random_bytes": random_bytes, "valid_frames": frames, "bytes_sent": tb.sent,
                          "bytes_received": len(tb.received), "replies": replies, "tokens_checked": tokens + n,
                          "cycles": tb.cycle, "final_tokens": ref})


@cocotb.test()
async def client(dut: object) -> None:
    """The host client (boards/client.py, as `hardwire chat` uses it) against the RTL: HELLO, RESET, FEED, GENERATE,
    an ERROR raised as DeviceError, LoRA adapters loaded with load_lora: tokens equal the integer reference."""
    from cocotb.task import bridge

    from hardwire.boards.client import DeviceClient, DeviceError

    spec, qm, tb = await setup(dut)
    transport = SimTransport(tb, spec["clk_hz"])
    adapters = {(a["layer"], a["site"]): LoraAdapter(a=_tensor(a["a"]), b=_tensor(a["b"]), a_mult=a["a_mult"],
                                                     a_shift=a["a_shift"], b_mult=a["b_mult"], b_shift=a["b_shift"])
                for a in spec["client"]["adapters"]}
    prompt = spec["client"]["prompt"]

    def host() -> dict:
        c = DeviceClient(transport, timeout=5.0, token_timeout=1.0, quiet=0.01)  # 0.01 s: 3.6 frame timeouts
        hello = c.reset()
        out: dict = {"hello": [hello.version, hello.vocab, hello.context, hello.lanes]}
        c.feed(prompt)
        out["tokens"] = list(c.generate(8)) + list(c.generate(4))  # the second GENERATE continues the sequence
        st = c.status()
        out["status"] = [st.tokens, st.position, int(st.flags)]
        c.reset()
        try:
            next(iter(c.generate(1)))
            out["no_prediction"] = "no error"
        except DeviceError as err:
            out["no_prediction"] = err.code.name
        c.load_lora(qm, adapters)
        c.reset()
        c.feed(prompt)
        out["lora_tokens"] = list(c.generate(8))
        return out

    out = await bridge(host)()
    plain = ReferenceDecoder(qm).generate(prompt, 12)
    adapted = ReferenceDecoder(qm, lora=adapters).generate(prompt, 8)
    assert out["hello"] == [1, qm.config.vocab_size, qm.context, spec["lanes"]], out["hello"]
    assert out["tokens"] == plain, f"client tokens {out['tokens']}, reference {plain}"
    assert out["status"] == [len(prompt) + 12, len(prompt) + 12, 0], out["status"]
    assert out["no_prediction"] == "NO_PREDICTION", out["no_prediction"]
    assert adapted != plain[:8], "the adapters do not change the continuation: the LoRA check would mean nothing"
    assert out["lora_tokens"] == adapted, f"with LoRA: client {out['lora_tokens']}, reference {adapted}"
    write_result(spec, "client", {**out, "bytes_sent": tb.sent, "bytes_received": len(tb.received)})


def _tensor(rows: list) -> object:
    import torch

    return torch.tensor(rows, dtype=torch.int64)


@cocotb.test()
async def differential(dut: object) -> None:
    """Hand-made byte scripts to the RTL and to the emulator, every reply compared: valid frames, every receiver
    error, ids outside the vocabulary, LoRA writes at unmapped and at wrapping addresses (which must change the
    model exactly as the emulator's address decode says), BUSY during a GENERATE."""
    spec, qm, tb = await setup(dut)
    oracle = Oracle(qm, spec)
    rng = random.Random(7)
    vocab, bits = qm.config.vocab_size, lora_addr_bits(qm)
    slots = lora_address_map(qm)
    prompt = spec["client"]["prompt"]
    status = protocol.status()
    q = slots[0]

    def lora_run(start: int, words: list[int]) -> bytes:  # one frame per run, the address counting in 24 bits
        chunks = [words[i:i + protocol.MAX_LORA_WORDS] for i in range(0, len(words), protocol.MAX_LORA_WORDS)]
        return b"".join(protocol.frame(Op.LORA, ((start + i * protocol.MAX_LORA_WORDS) & 0xFFFFFF).to_bytes(3, "little")
                                       + struct.pack(f"<{len(c)}H", *c)) for i, c in enumerate(chunks))

    def int8_words(n: int) -> list[int]:
        return [(rng.randrange(-128, 128) & 0xFF) | rng.randrange(256) << 8 for _ in range(n)]  # junk high bytes

    go = protocol.reset() + feed_frames(prompt) + protocol.generate(6)
    script: list[tuple[str, bytes]] = [
        ("hello", protocol.hello()), ("status", status), ("reset", protocol.reset()),
        ("feed+generate", feed_frames(prompt) + protocol.generate(3)), ("status after", status),
        ("garbage", b"\x00\x13\x37\xff"), ("bad crc", status[:-1] + bytes([status[-1] ^ 0x40])),
        ("unknown op", protocol.frame(0x07)), ("odd feed", protocol.frame(Op.FEED, b"\x01\x00\x02")),
        ("generate 0", protocol.frame(Op.GENERATE, b"\x00\x00")), ("reset with payload", protocol.frame(Op.RESET, b"\0")),
        ("lora without a word", protocol.frame(Op.LORA, b"\x00\x00\x00\x01")), ("cut", status[:3]),
        ("garbage then cut", b"\x13\x37" + status[:2]), ("cut then frame", status[:2] + protocol.hello()),
        ("id outside the vocabulary", protocol.reset() + feed_frames([3, vocab]) + status),
        ("id wider than the port", feed_frames([1 << 15]) + protocol.generate(1) + status),
        ("context full", protocol.reset() + feed_frames([rng.randrange(vocab) for _ in range(qm.context)])
         + protocol.generate(1)), ("status when full", status),
        ("plain", go),
        ("lora unmapped", lora_run(slots[-1].end, [rng.randrange(1 << 16) for _ in range((1 << bits) - slots[-1].end)])),
        ("unchanged", go),
        # A and B of the first slot through addresses 2**bits and 2**24 - 16 above: the port keeps the low bits
        ("lora wrapping A", lora_run((1 << 24) - 16, int8_words(16 + q.b_base - q.a_base))),
        ("lora wrapping B", lora_run((3 << bits) + q.b_base, int8_words(q.reg_base - q.b_base))),
        ("lora wrapping registers", lora_run((5 << bits) + q.reg_base,
                                             [0x8000 | 0x6000, rng.randrange(1 << 10) << 6 | 15, 0x7FFF, 0x40 | 12])),
        ("adapted", go), ("status after LoRA", status),
    ]
    results: dict[str, list[str]] = {}
    for label, chunk in script:
        want = [describe(r) for r in oracle.chunk(chunk)]
        got = [describe(r) for r in await tb.exchange(chunk, len(want), f"differential: {label}")]
        assert got == want, f"differential, {label}: RTL {got}, emulator {want}"
        results[label] = got
    plain = [f"TOKEN {t}" for t in ReferenceDecoder(qm).generate(prompt, 6)]
    assert results["plain"][2:-1] == plain and results["unchanged"] == results["plain"], results["unchanged"]
    assert results["adapted"][2:8] != plain, "the wrapped LoRA writes changed nothing: the check would mean nothing"
    # BUSY: a command while a GENERATE runs (its place among the TOKENs depends on decode times, which differ)
    want = [describe(r) for r in oracle.chunk(go + status)]
    got = [describe(r) for r in await exchange_during(tb, go, status, len(want), "differential: busy", after=4 + 4 + 1)]
    assert normalised(got) == normalised(want) and "ERROR BUSY" in got, f"busy: RTL {got}, emulator {want}"
    write_result(spec, "differential", {"chunks": len(script) + 1, "replies": results})

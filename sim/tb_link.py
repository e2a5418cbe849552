"""cocotb testcases for the host link of BoardCore, through its UART pins only (sim/sim_board.py BoardSim runs them).

Every reply is compared exactly: with a literal list where the protocol fixes it, and always with the emulator on the
board's clock (host/clocked_device.py ClockedDevice), fed each byte in the cycle it arrives: every byte the board sends
must be the emulator's and come in the same cycle, so the two statements of the protocol (the RTL and the Python
model) are checked against each other, timing included, on whatever the scripts throw at them:
  rx_buffer    a second frame (and a hundred more) sent while a FEED decodes: all answered, in order;
  rx_overflow  more than the receive FIFO holds sent while a FEED decodes: the frames it held, then ERROR OVERFLOW;
  overflow_flag  STATUS's sticky overflow flag: not before the ERROR OVERFLOW, in every STATUS after it, until a
               RESET (taken when idle, or stopping a GENERATE) clears it;
  lora_shift   LORA frames that would write 0 to a shift register (at the last word, through the address wrap, a word
               whose low 6 bits are 0, during a GENERATE) refused with ERROR BAD_LORA_SHIFT, none of their words
               written (the decode after them is the plain reference's); valid frames of the same adapter then work;
  soak         per seed, random traffic with random timing that meets every reply kind, BUSY and OVERFLOW among
               them, and frames aimed at the cycles where the executor changes state; then RESET and a prompt whose
               tokens equal the integer reference;
  client       the real DeviceClient (host/client.py) over a transport served by the simulation;
  differential hand-made scripts (valid, garbage, LoRA writes at unmapped and wrapping addresses, BUSY, a RESET
               stopping a GENERATE).
The spec (HARDWIRE_LINK_SPEC) gives the saved QModel, divisor, frame timeout, clock, lanes and each testcase's inputs;
each testcase writes its figures to results/<name>.json. The bench they share (LinkTB, the emulator as the oracle,
SimTransport) is sim/tb_link_bench.py.
"""

from __future__ import annotations

import copy
import random
import struct

import cocotb

from hardwire.host import protocol
from hardwire.host.protocol import Op
from hardwire.quant.qmodel import QModel
from hardwire.quant.reference import LoraAdapter, ReferenceDecoder
from hardwire.rtl.lora_map import lora_addr_bits, lora_address_map, lora_writes, shift_addresses
from hardwire.sim.tb_link_bench import (
    RX_LATENCY,
    LinkTB,
    Oracle,
    SimTransport,
    describe,
    exchange,
    feed_frames,
    hello_reply,
    setup,
    write_result,
)


@cocotb.test()
async def rx_buffer(dut: object) -> None:
    """Frames sent while a FEED decodes wait in the receive FIFO and are all answered, in order."""
    spec, qm, tb = await setup(dut)
    prompt = spec["long_prompt"]
    ref = ReferenceDecoder(qm).generate(prompt, 3)
    oracle = Oracle(qm, spec, tb)
    hello = hello_reply(spec, qm)
    steps = [protocol.reset(),
             feed_frames(prompt) + protocol.hello() + protocol.generate(3),  # the second frame while the first decodes
             protocol.reset() + feed_frames(prompt) + protocol.hello() * 100 + protocol.status()]  # 404 bytes behind it
    expected = [["ACK"], ["ACK", hello, *(f"TOKEN {t}" for t in ref), "ACK"],
                ["ACK", "ACK", *[hello] * 100, f"STATUS tokens={2 * len(prompt) + 3} position={len(prompt)} flags=0"]]
    waits = []
    for step, want, feed_ack in zip(steps, expected, [0, 0, 4], strict=True):  # the byte where the FEED's ACK starts
        start_rx = len(tb.received)
        got = await exchange(tb, oracle, step, "rx_buffer")
        assert got == want, f"RTL: {got}\nexpected: {want}"
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
    got = await exchange(tb, oracle, step, "rx_buffer: cut frame behind a FEED")
    assert got == want, got
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
    oracle = Oracle(qm, spec, tb)
    hello = hello_reply(spec, qm)
    await exchange(tb, oracle, protocol.reset(), "reset")
    # held: one HELLO (the receiver's waiting frame); FIFO: 2 garbage bytes, 127 HELLOs, the first 2 bytes of a
    # HELLO = 512 bytes; every later byte is dropped; the frame cut there and the garbage make one ERROR OVERFLOW
    assert depth == 2 + 4 * 127 + 2
    flood = feed_frames(prompt) + protocol.hello() + b"\x00\x00" + protocol.hello() * 130
    want = ["ACK", *[hello] * 128, "ERROR OVERFLOW"]
    first_reply = len(tb.received)
    got = await exchange(tb, oracle, flood, "rx_overflow")
    wait = tb.rx_cycles[first_reply] - tb.send_end
    assert wait > 0, f"the FEED's ACK came {-wait} cycles before the flood ended: the FIFO was never full"
    assert got == want, f"RTL: {got[:3]} ... {got[-3:]} ({len(got)} replies)\nexpected {len(want)}"
    dropped = oracle.device.dropped
    assert dropped == len(flood) - len(feed_frames(prompt)) - 4 - depth
    after = [protocol.hello(), protocol.reset() + feed_frames(prompt[:5]) + protocol.generate(4)]
    ref = ReferenceDecoder(qm).generate(prompt[:5], 4)
    for step, expect in zip(after, [[hello], ["ACK", "ACK", *(f"TOKEN {t}" for t in ref), "ACK"]], strict=True):
        got = await exchange(tb, oracle, step, "after the overflow")
        assert got == expect, f"{got} != {expect}"
    write_result(spec, "rx_overflow", {"sent": len(flood), "answered": len(want), "dropped": dropped,
                                 "first_reply_after_last_byte_cycles": wait})


def _flags(reply: str) -> int:
    """The flags of a STATUS reply as `describe` writes it."""
    assert reply.startswith("STATUS "), reply
    return int(reply.rsplit("flags=", 1)[1])


@cocotb.test()
async def overflow_flag(dut: object) -> None:
    """STATUS's flag bit 3 (overflow): a STATUS answered before the ERROR OVERFLOW does not have it; every STATUS
    after it does, other errors and commands notwithstanding, until a RESET clears it: one taken when the executor is
    idle, and one that stops a GENERATE. Every reply, flags included, equal to the emulator's in the same cycle."""
    spec, qm, tb = await setup(dut)
    prompt = spec["long_prompt"]
    oracle = Oracle(qm, spec, tb)
    hello = hello_reply(spec, qm)
    over = int(protocol.Flag.OVERFLOW)
    assert over == 8
    await exchange(tb, oracle, protocol.reset(), "reset")
    # rx_overflow's flood with a STATUS as the frame that waits behind the FEED: answered before the ERROR OVERFLOW,
    # without the flag (replies keep their order; the flag is set when the error is posted)
    flood = feed_frames(prompt) + protocol.status() + b"\x00\x00" + protocol.hello() * 130
    got = await exchange(tb, oracle, flood, "overflow_flag: the flood")
    assert got[0] == "ACK" and got[1].startswith("STATUS ") and got[2:] == [hello] * 127 + ["ERROR OVERFLOW"], got
    flags = {"before the error": _flags(got[1])}
    steps = [("after the error", protocol.status(), ["STATUS"]),
             ("after garbage", b"\x13\x37" + protocol.status(), ["STATUS", "ERROR GARBAGE"]),
             ("after a refused frame, a HELLO and a FEED", protocol.frame(Op.FEED, b"\x01") + protocol.hello()
              + feed_frames(prompt[:2]) + protocol.status(), ["ERROR BAD_LENGTH", hello, "ACK", "STATUS"]),
             ("after a RESET", protocol.reset() + protocol.status(), ["ACK", "STATUS"])]
    for label, data, want in steps:
        got = await exchange(tb, oracle, data, f"overflow_flag: {label}")
        assert [r.split()[0] if r.startswith("STATUS") else r for r in got] == want, f"{label}: {got}"
        flags[label] = _flags(next(r for r in got if r.startswith("STATUS")))
    assert flags == {"before the error": 0, "after the error": over, "after garbage": over,
                     "after a refused frame, a HELLO and a FEED": over, "after a RESET": 0}, flags
    # again, then a RESET that stops a GENERATE clears it too
    flood = protocol.reset() + feed_frames(prompt) + protocol.hello() + b"\x00\x00" + protocol.hello() * 130
    got = await exchange(tb, oracle, flood, "overflow_flag: the second flood")
    assert got == ["ACK", "ACK", *[hello] * 128, "ERROR OVERFLOW"], got
    got = await exchange(tb, oracle, protocol.status(), "overflow_flag: after the second error")
    flags["after the second error"] = _flags(got[0])
    go = feed_frames(prompt[:1]) + protocol.generate(6)
    stopped = oracle.device.met["generates_stopped"]
    gaps = [0] * len(go) + [3 * spec["token_cycles"]] + [0] * 3
    got = await exchange(tb, oracle, go + protocol.reset(), "overflow_flag: a RESET stops a GENERATE", gaps)
    assert got[0] == "ACK" and got[-1] == "ACK" and got.count("ACK") == 2 and len(got) - 2 < 6, got
    assert oracle.device.met["generates_stopped"] == stopped + 1, "the RESET did not stop the GENERATE"
    got = await exchange(tb, oracle, protocol.status(), "overflow_flag: after the RESET that stopped the GENERATE")
    flags["after a RESET that stopped a GENERATE"] = _flags(got[0])
    assert flags["after the second error"] == over and flags["after a RESET that stopped a GENERATE"] == 0, flags
    write_result(spec, "overflow_flag", {"flags": flags, "dropped": oracle.device.dropped})


@cocotb.test()
async def lora_shift(dut: object) -> None:
    """LORA frames any word of which would write 0 to an a_shift or b_shift register are refused as a whole with ERROR
    BAD_LORA_SHIFT: the zero at the frame's last word, reached through the address wrap (the frame's 24-bit address
    is the register's only in its low lora_addr_bits bits), a word whose low 6 bits (what the register keeps) are 0,
    and one arriving while a GENERATE runs (the shift check comes before BUSY; a valid LORA there gets BUSY). None of
    their words is written: the decode after them is the plain reference's. The same adapter's valid frames then
    load it: the decode is the reference's with that adapter."""
    spec, qm, tb = await setup(dut)
    oracle = Oracle(qm, spec, tb)
    bits, slots = lora_addr_bits(qm), lora_address_map(qm)
    q = slots[0]
    one = next(a for a in spec["client"]["adapters"] if (a["layer"], a["site"]) == (q.layer, q.site))
    adapter = LoraAdapter(a=_tensor(one["a"]), b=_tensor(one["b"]), a_mult=one["a_mult"], a_shift=one["a_shift"],
                          b_mult=one["b_mult"], b_shift=one["b_shift"])
    writes = dict(lora_writes(qm, spec["lanes"], {(q.layer, q.site): adapter}))
    assert sorted(writes) == list(range(q.a_base, q.end)), "slot 0 has padding: the frames below assume none"
    a_shift, b_shift = q.reg_base + 1, q.reg_base + 3
    assert {a_shift, b_shift} <= set(shift_addresses(qm))

    def frame(start: int, first: int, last: int, **words: int) -> bytes:
        """One LORA frame of the adapter's words for port addresses first..last, sent at 24-bit address `start`
        (which the port sees as `first`), with words replaced: a_shift=..., b_shift=..."""
        assert start & ((1 << bits) - 1) == first and last - first < protocol.MAX_LORA_WORDS
        values = {**writes, **{a_shift: words.get("a_shift", writes[a_shift]),
                               b_shift: words.get("b_shift", writes[b_shift])}}
        return protocol.frame(Op.LORA, start.to_bytes(3, "little")
                              + struct.pack(f"<{last - first + 1}H", *(values[a] for a in range(first, last + 1))))

    prompt = spec["client"]["prompt"]
    go = protocol.reset() + feed_frames(prompt) + protocol.generate(6)
    plain = [f"TOKEN {t}" for t in ReferenceDecoder(qm).generate(prompt, 6)]
    adapted = [f"TOKEN {t}" for t in ReferenceDecoder(qm, lora={(q.layer, q.site): adapter}).generate(prompt, 6)]
    assert adapted != plain, "the adapter does not change the continuation: the checks below would mean nothing"
    refused = {  # each frame also holds most of the adapter's A and B: written, they would change the decode
        "zero b_shift, the last word": frame(8, 8, b_shift, b_shift=0),
        "zero a_shift through the wrap": frame((1 << 24) - (1 << bits) + 6, 6, b_shift, a_shift=0),
        "b_shift 0xABC0 (low 6 bits 0)": frame((7 << bits) + 40, 40, b_shift, b_shift=0xABC0),
        "zero a_shift, the last word": frame(a_shift - 100, a_shift - 100, a_shift, a_shift=0),
    }
    results: dict[str, list[str]] = {}
    for label, data in refused.items():
        results[label] = got = await exchange(tb, oracle, data, f"lora_shift: {label}")
        assert got == ["ERROR BAD_LORA_SHIFT"], f"{label}: {got}"
    # right behind a GENERATE (checked while it runs): a zero shift is refused for it, not BUSY; a valid LORA (unmapped:
    # it changes nothing) gets BUSY
    unmapped = protocol.lora([(slots[-1].end + i, 0x1234) for i in range(3)])[0]
    for label, late, error in (("zero shift while generating", frame(120, 120, b_shift, b_shift=0), "ERROR BAD_LORA_SHIFT"),
                               ("valid LORA while generating", unmapped, "ERROR BUSY")):
        results[label] = got = await exchange(tb, oracle, go + late, f"lora_shift: {label}")
        assert [r for r in got if r.startswith("ERROR")] == [error], f"{label}: {got}"
        assert [r for r in got if r.startswith("TOKEN")] == plain and got[-1] == "ACK", f"{label}: {got}"
    results["after the refused frames"] = got = await exchange(tb, oracle, go, "lora_shift: after the refused frames")
    assert got == ["ACK", "ACK", *plain, "ACK"], f"a refused LORA frame changed the model: {got}, plain {plain}"
    valid = protocol.lora(sorted(writes.items()))
    results["valid frames"] = got = await exchange(tb, oracle, b"".join(valid), "lora_shift: the valid frames")
    assert got == ["ACK"] * len(valid), got
    results["adapted"] = got = await exchange(tb, oracle, go, "lora_shift: adapted")
    assert got == ["ACK", "ACK", *adapted, "ACK"], f"with the adapter: {got}, reference {adapted}"
    write_result(spec, "lora_shift", {"replies": results, "refused": len(refused) + 1})


# -- the soak -------------------------------------------------------------------------------------------------------

PIECES = {  # kind: weight
    "frame": 6,  # one valid command
    "frames": 4,  # 2 to 5 back to back: those behind a GENERATE get BUSY, a RESET among them stops it
    "garbage": 4,  # 1 to 79 random bytes
    "cut": 2,  # a frame cut short: what follows within the frame timeout continues it
    "bad_crc": 2,
    "odd": 2,  # 1 to 3 intact frames, each with an unknown op, a length its op refuses, or a LORA word that would write
    #            0 to a shift register (ERROR BAD_LORA_SHIFT: refused as a whole, so it changes nothing)
    "slow": 2,  # a frame with a pause inside it, or garbage then a frame, the pause within 3 cycles of the frame
    #             timeout, either side
    "edge": 2,  # a GENERATE, then a frame checked within 2 cycles of a change of the executor's state while it runs
    "flood": 1,  # RESET, a FEED of 20 to 44 or 65 to 71 ids (the context holds 64), then 300 to 900 bytes of
    #              frames and garbage; half of the time a STATUS once the board is idle again (the overflow flag)
    "busy_flood": 1,  # a GENERATE of 5 to 20 tokens, then 10 to 40 frames while it runs, back to back or apart
    "pause": 2,  # the line quiet for 1 to 4 frame timeouts
    "idle": 2,  # wait until the board is idle (as the emulator says), then up to 3 byte times
}
REPLY_KINDS = ["ACK", "TOKEN", "STATUS", "HELLO", *(f"ERROR {e.name}" for e in protocol.Error)]


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


def _odd_frame(rng: random.Random, qm: QModel) -> bytes:
    """An intact frame the receiver refuses: an op that is no command, a length its op's rule refuses, or a LORA frame
    with a word whose low 6 bits are 0 bound for a shift register (any upper address bits: the port keeps the low
    ones; 0 to 3 random words before it, 0 to 2 after it)."""
    roll = rng.random()
    if roll < 0.25:
        bits = lora_addr_bits(qm)
        before, after = rng.randrange(4), rng.randrange(3)
        start = ((rng.randrange(1 << (24 - bits)) << bits) + rng.choice(shift_addresses(qm)) - before) & 0xFFFFFF
        words = [rng.randrange(1 << 16) for _ in range(before + 1 + after)]
        words[before] = rng.randrange(1 << 10) << 6
        return protocol.frame(Op.LORA, start.to_bytes(3, "little") + struct.pack(f"<{len(words)}H", *words))
    if roll < 0.625:
        return protocol.frame(rng.choice([b for b in range(256) if b not in Op._value2member_map_]),
                              bytes(rng.randrange(256) for _ in range(rng.randrange(4))))
    op, payload = rng.choice([(Op.HELLO, b"\x00"), (Op.FEED, b"\x01"), (Op.GENERATE, b"\x00\x00"),
                              (Op.GENERATE, b"\x01"), (Op.LORA, b"\x00\x00\x00\x01"), (Op.STATUS, b"\x07\x00")])
    return protocol.frame(op, payload)


def _stream(rng: random.Random, qm: QModel, unmapped: list[int], size: int) -> bytes:
    """About `size` bytes of valid frames with some garbage."""
    out = b""
    while len(out) < size:
        out += _random_frame(rng, qm, unmapped) if rng.random() < 0.85 else bytes(rng.randrange(256) for _ in range(5))
    return out


def _piece(rng: random.Random, kind: str, qm: QModel, unmapped: list[int], spec: dict) -> tuple[bytes, list[int]]:
    """The bytes of one piece of soak traffic and the idle cycles before each of them after the first."""
    vocab = qm.config.vocab_size
    if kind == "frame":
        data = _random_frame(rng, qm, unmapped)
    elif kind == "frames":
        data = b"".join(_random_frame(rng, qm, unmapped) for _ in range(rng.randrange(2, 6)))
    elif kind == "garbage":
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 80)))
    elif kind == "cut":
        whole = _random_frame(rng, qm, unmapped)
        data = whole[:rng.randrange(1, len(whole))]
    elif kind == "bad_crc":
        whole = _random_frame(rng, qm, unmapped)
        data = whole[:-1] + bytes([whole[-1] ^ rng.randrange(1, 256)])
    elif kind == "odd":
        data = b"".join(_odd_frame(rng, qm) for _ in range(rng.randrange(1, 4)))
    elif kind == "slow":  # the quiet rule acts when two bytes arrive more than the timeout apart
        data = _random_frame(rng, qm, unmapped)
        pause = rng.randrange(len(data) - 1)
        if rng.random() < 0.3:
            garbage = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 6)))
            data, pause = garbage + data, len(garbage) - 1
        gaps = [0] * (len(data) - 1)
        gaps[pause] = spec["timeout_cycles"] - 10 * spec["divisor"] + rng.randrange(-2, 4)
        return data, gaps
    elif kind == "edge":  # the GENERATE here; _aim sends the frame
        data = protocol.reset() + feed_frames([rng.randrange(vocab) for _ in range(rng.randrange(1, 4))])
        data += protocol.generate(rng.randrange(2, 6))
    elif kind == "flood":
        n = rng.choice([rng.randrange(20, 45), rng.randrange(65, 72)])  # half of them run out of context
        data = protocol.reset() + feed_frames([rng.randrange(vocab) for _ in range(n)])
        data += _stream(rng, qm, unmapped, rng.randrange(300, 900))
    elif kind == "busy_flood":  # frames back to back, or apart: their BUSY between the TOKENs; no RESET among them
        data = protocol.reset() + feed_frames([rng.randrange(vocab)]) + protocol.generate(rng.randrange(5, 21))
        gaps = [0] * (len(data) - 1)
        apart = rng.random() < 0.5
        for _ in range(rng.randrange(10, 41)):
            frame = next(f for f in iter(lambda: _random_frame(rng, qm, unmapped), None) if f[1] != Op.RESET)
            gaps += [rng.randrange(1000) if apart else 0] + [0] * (len(frame) - 1)
            data += frame
        return data, gaps
    else:  # pause, idle: the gap before the next piece is all
        data = b""
    return data, [0] * max(0, len(data) - 1)


def _gap(rng: random.Random, spec: dict) -> int:
    """Idle cycles before a piece: none, part of a byte (off the byte grid), up to the frame timeout, or beyond it."""
    byte, timeout = 10 * spec["divisor"], spec["timeout_cycles"]
    return rng.choice([0, 0, rng.randrange(1, byte), rng.randrange(byte, timeout), rng.randrange(timeout, 3 * timeout)])


def _aim(rng: random.Random, oracle: Oracle, qm: QModel, spec: dict, now: int) -> tuple[bytes, int, str]:
    """A frame (HELLO, STATUS, RESET, GENERATE or FEED) and the gap before it that make the receiver check it within
    2 cycles of a cycle where the executor enters a state (GENERATE's TOKEN, hand-over, decode; the SEND of its ACK):
    a copy of the emulator, run ahead, says when those are (the receiver checks a frame 3 cycles after its last byte
    arrives, when it is idle). -> the frame, the gap, what it aims at."""
    probe = copy.deepcopy(oracle.device, {id(qm): qm})
    probe.trace = []
    probe.run_idle()
    edges = [(cycle, state) for cycle, state in probe.trace if state != "IDLE"] or [(now, "none")]
    cycle, state = rng.choice(edges)
    frame = rng.choice([protocol.hello(), protocol.status(), protocol.reset(), protocol.generate(1),
                        feed_frames([rng.randrange(qm.config.vocab_size)])])
    offset = rng.randrange(-2, 3)
    start = cycle + offset - 3 - RX_LATENCY - (len(frame) - 1) * 10 * spec["divisor"]
    return frame, max(0, start - now), f"{state}{offset:+d}"


async def _soak_seed(tb: LinkTB, oracle: Oracle, qm: QModel, spec: dict, seed: int) -> dict:
    """Random traffic for spec["soak"]["seconds"] of line time, every reply byte checked against the emulator as it
    arrives -> what the traffic met."""
    rng = random.Random(seed)
    unmapped = list(range(lora_address_map(qm)[-1].end, 1 << lora_addr_bits(qm)))
    assert unmapped, "the test model's LoRA map fills its address space: no unmapped address to write"
    device = oracle.device
    begin, first_rx, sent0 = tb.cycle, len(tb.received), tb.sent
    device.met["max_fifo"] = 0
    met0 = dict(device.met, dropped=device.dropped)
    pieces: dict[str, int] = {}
    while tb.cycle - begin < spec["soak"]["seconds"] * spec["clk_hz"]:
        kind = rng.choices(list(PIECES), list(PIECES.values()))[0]
        pieces[kind] = pieces.get(kind, 0) + 1
        data, gaps = _piece(rng, kind, qm, unmapped, spec)
        gap = _gap(rng, spec) if kind != "pause" else rng.randrange(spec["timeout_cycles"], 4 * spec["timeout_cycles"])
        if kind == "idle":  # the emulator runs on until idle: no byte sent from now arrives before
            gap = max(0, device.run_idle() + 1 - RX_LATENCY - tb.cycle) + rng.randrange(3 * tb.byte_cycles)
        if data:
            await tb.send(data, [gap, *gaps])
        elif gap:
            await tb.cycles(gap)
        oracle.follow(f"seed {seed} {kind} {data[:8].hex()}")
        if kind == "edge":
            frame, gap, aim = _aim(rng, oracle, qm, spec, tb.cycle)
            await tb.send(frame, [gap] + [0] * (len(frame) - 1))
            oracle.follow(f"seed {seed} aimed at {aim}: {frame.hex()}")
        elif kind == "flood" and rng.random() < 0.5:  # once the board is idle (its ERROR OVERFLOW sent), a STATUS:
            #                                          the overflow flag, unless a RESET in the flood came after it
            gap = max(0, device.run_idle() + 1 - RX_LATENCY - tb.cycle) + rng.randrange(3 * tb.byte_cycles)
            await tb.send(protocol.status(), [gap, 0, 0, 0])
            oracle.follow(f"seed {seed} STATUS after the flood")
        oracle.check(f"soak seed {seed}, {kind} piece {sum(pieces.values())}")
    span = tb.cycle - begin
    await oracle.finish(f"soak seed {seed}, the end")
    replies = {k: 0 for k in REPLY_KINDS}
    texts = [describe(r) for r in protocol.FrameParser().push(bytes(tb.received[first_rx:]))]
    kinds = [text if text.startswith("ERROR") else text.split()[0] for text in texts]
    for key in kinds:
        replies[key] = replies.get(key, 0) + 1
    met = {k: v - met0[k] for k, v in dict(device.met, dropped=device.dropped).items()}
    met["errors_among_tokens"] = sum(kinds[i - 1:i + 2:2] == ["TOKEN", "TOKEN"] and kinds[i].startswith("ERROR")
                                     for i in range(1, len(kinds) - 1))
    met["status_overflow_flag"] = sum(t.startswith("STATUS") and bool(_flags(t) & protocol.Flag.OVERFLOW) for t in texts)
    return {"seed": seed, "line_cycles": span, "line_seconds": round(span / spec["clk_hz"], 3),
            "bytes_sent": tb.sent - sent0, "bytes_received": len(tb.received) - first_rx, "pieces": pieces,
            "replies": replies, "met": met}


@cocotb.test()
async def soak(dut: object) -> None:
    """Random traffic through the UART pins, for each seed: valid frames alone and back to back (GENERATEs with
    frames behind them: BUSY, RESET stopping them), garbage, cut, slow, refused and bad-CRC frames, FEEDs with more
    behind them than the FIFO holds (OVERFLOW), pauses, gaps off the byte grid; every reply byte equal to the
    emulator's on the board's clock (ClockedDevice), in the same cycle. Then RESET and a prompt whose tokens equal
    the integer reference."""
    spec, qm, tb = await setup(dut)
    oracle = Oracle(qm, spec, tb)
    seeds = [await _soak_seed(tb, oracle, qm, spec, seed) for seed in spec["soak"]["seeds"]]
    # the end: a prompt through the same link, tokens equal to the integer reference
    prompt, n = spec["soak"]["prompt"], spec["soak"]["n"]
    ref = ReferenceDecoder(qm).generate(prompt, n)
    got = await exchange(tb, oracle, protocol.reset() + feed_frames(prompt) + protocol.generate(n), "soak: the final prompt")
    assert got == ["ACK", "ACK", *(f"TOKEN {t}" for t in ref), "ACK"], f"after the soak: {got}, reference {ref}"
    assert tb.parser.dropped == 0, "the board sent bytes that are not frames"
    write_result(spec, "soak", {"seeds": seeds, "final_tokens": ref, "cycles": tb.cycle})


@cocotb.test()
async def client(dut: object) -> None:
    """The host client (host/client.py, as `hardwire chat` uses it) against the RTL: HELLO, RESET, FEED, GENERATE,
    an ERROR raised as DeviceError, LoRA adapters loaded with load_lora: tokens equal the integer reference."""
    from cocotb.task import bridge

    from hardwire.host.client import DeviceClient, DeviceError

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
    assert out["hello"] == [protocol.PROTOCOL_VERSION, qm.config.vocab_size, qm.context, spec["lanes"]], out["hello"]
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
    oracle = Oracle(qm, spec, tb)
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
        results[label] = await exchange(tb, oracle, chunk, f"differential: {label}")
    plain = [f"TOKEN {t}" for t in ReferenceDecoder(qm).generate(prompt, 6)]
    assert results["plain"][2:-1] == plain and results["unchanged"] == results["plain"], results["unchanged"]
    assert results["adapted"][2:8] != plain, "the wrapped LoRA writes changed nothing: the check would mean nothing"
    # a STATUS while a GENERATE runs: BUSY; then a RESET: it stops the GENERATE (no ACK of its own)
    token = spec["token_cycles"]
    for label, late, wait in (("busy", status, 2), ("reset while generating", protocol.reset(), 5)):
        gaps = [0] * len(go) + [wait * token] + [0] * (len(late) - 1)
        results[label] = got = await exchange(tb, oracle, go + late, f"differential: {label}", gaps)
        if late == status:
            assert "ERROR BUSY" in got, got
        else:  # the RESET's ACK ends it: the GENERATE's own never comes
            assert got[:2] == ["ACK", "ACK"] and got[-1] == "ACK" and 3 < len(got) < 2 + 6 + 1, got
    write_result(spec, "differential", {"chunks": len(script) + 2, "replies": results})


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
each testcase writes its figures to results/<name>.json.
"""

from __future__ import annotations

import json
import os
import random
import struct
from pathlib import Path

import cocotb
from cocotb.simtime import get_sim_time
from cocotb.triggers import FallingEdge, Timer

from hardwire.boards import protocol
from hardwire.boards.emulator import EmulatedDevice
from hardwire.boards.protocol import Error, Op, Reply, Response
from hardwire.boards.tb_board import BoardTB
from hardwire.quant.qmodel import QModel
from hardwire.quant.reference import LoraAdapter, ReferenceDecoder
from hardwire.rtl.lora_map import REGISTERS, RESET, lora_addr_bits, lora_address_map

WATCHDOG = 3_000_000  # cycles one exchange may take before the testcase fails instead of hanging


def _spec() -> dict:
    with open(os.environ["HARDWIRE_LINK_SPEC"]) as fh:
        return json.load(fh)


def describe(r: Response) -> str:
    """A reply as text; STATUS without its cycle count (the chip counts its clock, the emulator its decoding)."""
    if r.op == Reply.ERROR:
        return f"ERROR {Error(r.payload[0]).name}" if r.payload and r.payload[0] in Error._value2member_map_ \
            else f"ERROR 0x{r.payload.hex()}"
    if r.op == Reply.TOKEN:
        return f"TOKEN {r.token}"
    if r.op == Reply.STATUS:
        s = r.status
        return f"STATUS tokens={s.tokens} position={s.position} flags={int(s.flags)}"
    if r.op == Reply.HELLO:
        return f"HELLO {r.payload.hex()}"
    return Reply(r.op).name if r.op in Reply._value2member_map_ else str(r)


class LinkTB(BoardTB):
    """BoardTB that also records the cycle of every byte sent and received, and waits for the line to settle.

    It waits with Timer, one wake-up per wait, never with ClockCycles, which wakes Python at every clock edge: that
    makes the soak's 1.4 million cycles take seconds instead of a minute."""

    def __init__(self, dut: object, spec: dict) -> None:
        super().__init__(dut, spec["divisor"], WATCHDOG)
        self.spec = spec
        self.timeout = spec["timeout_cycles"]
        self.byte_cycles = 10 * spec["divisor"]
        self.rx_cycles: list[int] = []  # when each received byte's stop bit was sampled
        self.sent = 0
        self.send_end = 0  # the cycle the last send finished

    @property
    def cycle(self) -> int:
        """Clock cycles since the simulation began (from its time: a coroutine per cycle would halve its speed)."""
        return int(get_sim_time("ns")) // self.PERIOD_NS

    async def cycles(self, n: int) -> None:
        await Timer(n * self.PERIOD_NS, "ns")

    async def _monitor(self) -> None:
        while True:
            await FallingEdge(self.dut.tx)
            await self.cycles(self.divisor // 2)
            assert int(self.dut.tx.value) == 0, "tx: a glitch where a start bit was expected"
            byte = 0
            for i in range(8):
                await self.cycles(self.divisor)
                byte |= int(self.dut.tx.value) << i
            await self.cycles(self.divisor)
            assert int(self.dut.tx.value) == 1, f"tx: framing error after byte 0x{byte:02x}"
            self.received.append(byte)
            self.rx_cycles.append(self.cycle)
            self.replies.extend(self.parser.push(bytes([byte])))

    async def send(self, data: bytes) -> None:
        """8N1 on `rx`, bytes back to back."""
        for byte in data:
            for bit in [0, *((byte >> i) & 1 for i in range(8)), 1]:
                self.dut.rx.value = bit
                await self.cycles(self.divisor)
        self.sent += len(data)
        self.send_end = self.cycle

    async def settle(self) -> None:
        """Wait until the line has been quiet both ways for the frame timeout plus 8 byte times (so the receiver's
        quiet rule has acted, and any reply it caused, or any reply too many, has had time to arrive); bounded."""
        need = self.timeout + 8 * self.byte_cycles
        start = self.cycle
        while self.cycle - max(self.send_end, self.rx_cycles[-1] if self.rx_cycles else 0) < need:
            await self.cycles(64)
            assert self.cycle - start < self.watchdog, f"the board kept sending for {self.cycle - start} cycles"

    async def expect(self, start: int, count: int, what: str) -> list[Response]:
        """Wait until `count` replies have come after the first `start`; fail after the watchdog."""
        for _ in range(0, self.watchdog, 64):
            if len(self.replies) >= start + count:
                return self.replies[start:start + count]
            await self.cycles(64)
        got = [describe(r) for r in self.replies[start:]]
        raise AssertionError(f"{what}: expected {count} replies within {self.watchdog} cycles, got {got}")

    async def exchange(self, data: bytes, count: int, what: str) -> list[Response]:
        """Send `data`, wait for `count` replies (bounded), then for the line to settle -> every reply that came."""
        start = len(self.replies)
        await self.send(data)
        await self.expect(start, count, what)
        await self.settle()
        return self.replies[start:]


class Oracle:
    """The emulator fed the same bytes at the same line times: one byte per byte time, a quiet gap between chunks."""

    def __init__(self, qm: QModel, spec: dict, token_cycles: int = 0) -> None:
        clk = spec["clk_hz"]
        self.byte_s = 10 * spec["divisor"] / clk
        self.timeout_s = spec["timeout_cycles"] / clk
        self.device = EmulatedDevice(qm, lanes=spec["lanes"], frame_timeout=self.timeout_s,
                                     token_seconds=token_cycles / clk)
        self.t = 1.0

    def chunk(self, data: bytes) -> list[Response]:
        out = bytearray()
        for byte in data:
            self.t += self.byte_s
            out += self.device.receive(bytes([byte]), self.t)
        for _ in range(1 << 16):  # every event due: FEEDs ending, GENERATE steps, the quiet line's errors
            event = self.device.next_event()
            if event is None:
                break
            self.t = max(self.t, event)
            out += self.device.poll(self.t)
        else:
            raise AssertionError("the emulator never went idle")
        self.t += 2 * self.timeout_s
        parser = protocol.FrameParser()
        replies = parser.push(bytes(out))
        assert parser.dropped == 0
        return replies


def _write(spec: dict, name: str, result: dict) -> None:
    Path(spec["results"], f"{name}.json").write_text(json.dumps(result))


def _hello(spec: dict, qm: QModel) -> str:
    return "HELLO " + protocol.hello_payload(protocol.Hello(1, qm.config.vocab_size, qm.context, spec["lanes"])).hex()


def _feed(tokens: list[int]) -> bytes:
    return b"".join(protocol.feed(tokens))


async def _setup(dut: object) -> tuple[dict, QModel, LinkTB]:
    """Clock, reset, and the LoRA SRAM back to the all-zero adapters: the testcases share one simulator, and a reset
    clears the LoRA registers but not the block RAM of A (a board keeps it too, until written)."""
    spec = _spec()
    qm = QModel.load(spec["qmodel"])
    tb = LinkTB(dut, spec)
    await tb.start()
    writes = []
    for slot in lora_address_map(qm):
        writes += [(a, 0) for a in range(slot.a_base, slot.reg_base)]
        writes += [(slot.reg_base + n, RESET[name]) for n, name in enumerate(REGISTERS)]
    for frame in protocol.lora(writes):
        assert [describe(r) for r in await tb.exchange(frame, 1, "clearing LoRA")] == ["ACK"]
    return spec, qm, tb


@cocotb.test()
async def rx_buffer(dut: object) -> None:
    """Frames sent while a FEED decodes wait in the receive FIFO and are all answered, in order."""
    spec, qm, tb = await _setup(dut)
    prompt = spec["long_prompt"]
    ref = ReferenceDecoder(qm).generate(prompt, 3)
    oracle = Oracle(qm, spec, spec["token_cycles"])
    hello = _hello(spec, qm)
    steps = [protocol.reset(),
             _feed(prompt) + protocol.hello() + protocol.generate(3),  # the second frame while the first decodes
             protocol.reset() + _feed(prompt) + protocol.hello() * 100 + protocol.status()]  # 404 bytes behind it
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
    step = protocol.reset() + _feed(prompt[:30]) + protocol.hello() + protocol.hello()[:2]
    start_rx = len(tb.received)
    want = ["ACK", "ACK", hello, "ERROR TIMEOUT"]
    got = [describe(r) for r in await tb.exchange(step, len(want), "rx_buffer: cut frame behind a FEED")]
    assert got == want and [describe(r) for r in oracle.chunk(step)] == want, got
    gap = tb.rx_cycles[start_rx + 20] - tb.rx_cycles[start_rx + 19]  # ACK, ACK: 8 bytes; HELLO: 12
    assert gap <= 2 * tb.byte_cycles, f"the TIMEOUT came {gap} cycles after the HELLO's reply"
    _write(spec, "rx_buffer", {"replies": [len(w) for w in expected], "bytes": [len(s) for s in steps],
                               "first_reply_after_last_byte_cycles": waits, "timeout_after_ack_cycles": gap})


@cocotb.test()
async def rx_overflow(dut: object) -> None:
    """More than the FIFO holds behind a FEED: the frames it held are answered, then one ERROR OVERFLOW; the link
    then works (HELLO, and a prompt whose tokens equal the reference)."""
    spec, qm, tb = await _setup(dut)
    prompt, depth = spec["long_prompt"], spec["rx_depth"]
    oracle = Oracle(qm, spec, spec["token_cycles"])
    hello = _hello(spec, qm)
    await tb.exchange(protocol.reset(), 1, "reset")
    oracle.chunk(protocol.reset())
    # held: one HELLO (the receiver's waiting frame); FIFO: 2 garbage bytes, 127 HELLOs, the first 2 bytes of a
    # HELLO = 512 bytes; every later byte is dropped; the frame cut there and the garbage make one ERROR OVERFLOW
    assert depth == 2 + 4 * 127 + 2
    flood = _feed(prompt) + protocol.hello() + b"\x00\x00" + protocol.hello() * 130
    want = ["ACK", *[hello] * 128, "ERROR OVERFLOW"]
    first_reply = len(tb.received)
    got = [describe(r) for r in await tb.exchange(flood, len(want), "rx_overflow")]
    wait = tb.rx_cycles[first_reply] - tb.send_end
    assert wait > 0, f"the FEED's ACK came {-wait} cycles before the flood ended: the FIFO was never full"
    assert got == want, f"RTL: {got[:3]} ... {got[-3:]} ({len(got)} replies)\nexpected {len(want)}"
    emulated = [describe(r) for r in oracle.chunk(flood)]
    assert emulated == want, f"the emulator: {emulated[:3]} ... {emulated[-3:]} ({len(emulated)} replies)"
    dropped = oracle.device.dropped
    assert dropped == len(flood) - len(_feed(prompt)) - 4 - depth
    after = [protocol.hello(), protocol.reset() + _feed(prompt[:5]) + protocol.generate(4)]
    ref = ReferenceDecoder(qm).generate(prompt[:5], 4)
    for step, expect in zip(after, [[hello], ["ACK", "ACK", *(f"TOKEN {t}" for t in ref), "ACK"]], strict=True):
        got = [describe(r) for r in await tb.exchange(step, len(expect), "after the overflow")]
        assert got == expect, f"{got} != {expect}"
    _write(spec, "rx_overflow", {"sent": len(flood), "answered": len(want), "dropped": dropped,
                                 "first_reply_after_last_byte_cycles": wait})


def _normalised(replies: list[str]) -> tuple[list[str], list[str]]:
    """Replies without, and the ERRORs alone: for chunks where an error's place among TOKENs depends on timing."""
    return [r for r in replies if not r.startswith("ERROR")], sorted(r for r in replies if r.startswith("ERROR"))


async def _during(tb: LinkTB, frame: bytes, extra: bytes, count: int, what: str, after: int = 1) -> list[Response]:
    """Send `frame`, then `extra` as soon as `after` bytes of the replies are in (a byte arriving while a reply is
    being sent); -> every reply. Checks that `extra` really went out before the replies were over."""
    start, start_rx = len(tb.replies), len(tb.received)
    await tb.send(frame)
    for _ in range(0, tb.watchdog, 8):
        if len(tb.received) >= start_rx + after:
            break
        await tb.cycles(8)
    else:
        raise AssertionError(f"{what}: no reply began")
    await tb.send(extra)
    sent = tb.send_end
    await tb.expect(start, count, what)
    await tb.settle()
    assert any(c > sent for c in tb.rx_cycles[start_rx:]), f"{what}: the reply was over before the extra bytes"
    return tb.replies[start:]


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
        return _feed([rng.randrange(vocab) for _ in range(rng.randrange(1, 6))])
    if kind == "badfeed":
        bad = rng.choice([rng.randrange(vocab, 1 << token_bits), rng.randrange(1 << token_bits, 1 << 16)])
        return _feed([rng.randrange(vocab), bad])
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
    spec, qm, tb = await _setup(dut)
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
                frame = protocol.reset() + _feed([rng.randrange(qm.config.vocab_size)]) + protocol.generate(6)
                extra = bytes([rng.randrange(256)])  # a whole frame would get BUSY, which the emulator (no decode
                # time here) cannot say: the differential testcase checks BUSY
            want = [describe(r) for r in oracle.chunk(frame + extra)]
            got = [describe(r) for r in await _during(tb, frame, extra, len(want), "soak: byte during a reply", after)]
            assert _normalised(got) == _normalised(want), f"soak, during {frame.hex()} + {extra.hex()}: RTL {got}, " \
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
    got = [describe(r) for r in await tb.exchange(protocol.reset() + _feed(prompt) + protocol.generate(n), n + 3,
                                                  "soak: the final prompt")]
    assert got == ["ACK", "ACK", *(f"TOKEN {t}" for t in ref), "ACK"], f"after the soak: {got}, reference {ref}"
    assert tb.parser.dropped == 0, "the board sent bytes that are not frames"
    _write(spec, "soak", {"chunks": counts, "random_bytes": random_bytes, "valid_frames": frames, "bytes_sent": tb.sent,
                          "bytes_received": len(tb.received), "replies": replies, "tokens_checked": tokens + n,
                          "cycles": tb.cycle, "final_tokens": ref})


class SimTransport:
    """A client.Transport served by the simulation: `write` drives the UART pin, `read` runs the simulation until a
    byte arrives or `timeout` seconds of the board's clock have passed. Called from a cocotb bridge thread."""

    def __init__(self, tb: LinkTB, clk_hz: int) -> None:
        from cocotb.task import resume

        self.tb, self.clk_hz, self.name, self.pos = tb, clk_hz, "rtl-sim", 0
        self._read, self._write = resume(self._aread), resume(self.tb.send)

    async def _aread(self, size: int, timeout: float) -> bytes:
        limit, waited = max(1, int(timeout * self.clk_hz)), 0
        while self.pos >= len(self.tb.received) and waited < limit:
            step = min(64, limit - waited)
            await self.tb.cycles(step)
            waited += step
        data = bytes(self.tb.received[self.pos:self.pos + size])
        self.pos += len(data)
        return data

    def read(self, size: int, timeout: float) -> bytes:
        return self._read(size, timeout)

    def write(self, data: bytes) -> None:
        self._write(data)


@cocotb.test()
async def client(dut: object) -> None:
    """The host client (boards/client.py, as `hardwire chat` uses it) against the RTL: HELLO, RESET, FEED, GENERATE,
    an ERROR raised as DeviceError, LoRA adapters loaded with load_lora: tokens equal the integer reference."""
    from cocotb.task import bridge

    from hardwire.boards.client import DeviceClient, DeviceError

    spec, qm, tb = await _setup(dut)
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
    _write(spec, "client", {**out, "bytes_sent": tb.sent, "bytes_received": len(tb.received)})


def _tensor(rows: list) -> object:
    import torch

    return torch.tensor(rows, dtype=torch.int64)


@cocotb.test()
async def differential(dut: object) -> None:
    """Hand-made byte scripts to the RTL and to the emulator, every reply compared: valid frames, every receiver
    error, ids outside the vocabulary, LoRA writes at unmapped and at wrapping addresses (which must change the
    model exactly as the emulator's address decode says), BUSY during a GENERATE."""
    spec, qm, tb = await _setup(dut)
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

    go = protocol.reset() + _feed(prompt) + protocol.generate(6)
    script: list[tuple[str, bytes]] = [
        ("hello", protocol.hello()), ("status", status), ("reset", protocol.reset()),
        ("feed+generate", _feed(prompt) + protocol.generate(3)), ("status after", status),
        ("garbage", b"\x00\x13\x37\xff"), ("bad crc", status[:-1] + bytes([status[-1] ^ 0x40])),
        ("unknown op", protocol.frame(0x07)), ("odd feed", protocol.frame(Op.FEED, b"\x01\x00\x02")),
        ("generate 0", protocol.frame(Op.GENERATE, b"\x00\x00")), ("reset with payload", protocol.frame(Op.RESET, b"\0")),
        ("lora without a word", protocol.frame(Op.LORA, b"\x00\x00\x00\x01")), ("cut", status[:3]),
        ("garbage then cut", b"\x13\x37" + status[:2]), ("cut then frame", status[:2] + protocol.hello()),
        ("id outside the vocabulary", protocol.reset() + _feed([3, vocab]) + status),
        ("id wider than the port", _feed([1 << 15]) + protocol.generate(1) + status),
        ("context full", protocol.reset() + _feed([rng.randrange(vocab) for _ in range(qm.context)])
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
    got = [describe(r) for r in await _during(tb, go, status, len(want), "differential: busy", after=4 + 4 + 1)]
    assert _normalised(got) == _normalised(want) and "ERROR BUSY" in got, f"busy: RTL {got}, emulator {want}"
    _write(spec, "differential", {"chunks": len(script) + 1, "replies": results})

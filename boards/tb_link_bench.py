"""The bench the host-link testcases (boards/tb_link.py) share: a BoardTB that times every byte on the line, the
emulator fed the same bytes at the same line times (the oracle every reply is compared with), replies as text, the
common setup, and a client.Transport served by the simulation.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from cocotb.simtime import get_sim_time
from cocotb.triggers import FallingEdge, Timer

from hardwire.boards import protocol
from hardwire.boards.emulator import EmulatedDevice
from hardwire.boards.protocol import Error, Reply, Response
from hardwire.boards.tb_board import BoardTB
from hardwire.quant.qmodel import QModel
from hardwire.rtl.lora_map import REGISTERS, RESET, lora_address_map

WATCHDOG = 3_000_000  # cycles one exchange may take before the testcase fails instead of hanging


def load_spec() -> dict:
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


def write_result(spec: dict, name: str, result: dict) -> None:
    Path(spec["results"], f"{name}.json").write_text(json.dumps(result))


def hello_reply(spec: dict, qm: QModel) -> str:
    return "HELLO " + protocol.hello_payload(protocol.Hello(1, qm.config.vocab_size, qm.context, spec["lanes"])).hex()


def feed_frames(tokens: list[int]) -> bytes:
    return b"".join(protocol.feed(tokens))


async def setup(dut: object) -> tuple[dict, QModel, LinkTB]:
    """Clock, reset, and the LoRA SRAM back to the all-zero adapters: the testcases share one simulator, and a reset
    clears the LoRA registers but not the block RAM of A (a board keeps it too, until written)."""
    spec = load_spec()
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


def normalised(replies: list[str]) -> tuple[list[str], list[str]]:
    """Replies without, and the ERRORs alone: for chunks where an error's place among TOKENs depends on timing."""
    return [r for r in replies if not r.startswith("ERROR")], sorted(r for r in replies if r.startswith("ERROR"))


async def exchange_during(tb: LinkTB, frame: bytes, extra: bytes, count: int, what: str, after: int = 1) -> list[Response]:
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

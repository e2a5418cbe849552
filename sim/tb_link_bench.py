"""The bench the host-link testcases (sim/tb_link.py) share: a BoardTB that times every byte on the line, the
emulator on the board's clock fed each byte in the cycle it arrives (the oracle every reply byte and its cycle are
compared with), replies as text, the common setup, and a client.Transport served by the simulation.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from cocotb.simtime import get_sim_time
from cocotb.triggers import FallingEdge, Timer

from hardwire.host import protocol
from hardwire.host.clocked_device import ClockedDevice
from hardwire.host.protocol import Error, Reply, Response
from hardwire.quant.qmodel import QModel
from hardwire.rtl.lora_map import REGISTERS, RESET, lora_address_map
from hardwire.sim.tb_board import BoardTB

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


RX_LATENCY = 40  # cycles from the start bit LinkTB drives on `rx` to UartRx offering the byte (boards/uart.py): the
#                  synchroniser, half a bit to confirm the start, eight bits, the stop bit sampled in its middle
TX_LATENCY = 39  # cycles from UartTx taking a byte to LinkTB's monitor sampling its stop bit: the start bit from the
#                  next cycle, then half a bit and nine bits
COUNTER_ZERO = -1  # the cycle the chip's clock counter (STATUS cycles) read 0 in, from LinkTB's first after reset
# (each of the three as measured on the Verilator build: only their sum and differences are observable, and those are
# what the emulator must and does match: every reply byte in its cycle, every STATUS with the chip's cycle count)


class LinkTB(BoardTB):
    """BoardTB that also records the cycle of every byte sent and received, and waits for the line to settle.

    It waits with Timer, one wake-up per wait, never with ClockCycles, which wakes Python at every clock edge (that
    would make the soak's millions of cycles take minutes); `send` wakes once per run of equal bits."""

    def __init__(self, dut: object, spec: dict) -> None:
        super().__init__(dut, spec["divisor"], WATCHDOG)
        self.spec = spec
        self.timeout = spec["timeout_cycles"]
        self.byte_cycles = 10 * spec["divisor"]
        self.rx_cycles: list[int] = []  # when each received byte's stop bit was sampled
        self.out = bytearray()  # every byte sent
        self.starts: list[int] = []  # the cycle each byte's start bit began
        self.sent = 0
        self.send_end = 0  # the cycle the last send finished
        self.reset_cycle = 0  # the first cycle out of reset

    @property
    def cycle(self) -> int:
        """Clock cycles since the simulation began (from its time: a coroutine per cycle would halve its speed)."""
        return int(get_sim_time("ns")) // self.PERIOD_NS

    async def start(self) -> None:
        await super().start()
        self.reset_cycle = self.cycle

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

    async def send(self, data: bytes, gaps: list[int] | None = None) -> None:
        """8N1 on `rx`: before byte i, gaps[i] cycles of idle line (none: back to back)."""
        runs: list[list[int]] = [[1, 0]]  # [level, cycles]: the line idles high
        at, starts = self.cycle, []
        for i, byte in enumerate(data):
            gap = gaps[i] if gaps else 0
            at += gap
            starts.append(at)
            at += self.byte_cycles
            for level, cycles in [(1, gap), (0, self.divisor), *(((byte >> k) & 1, self.divisor) for k in range(8)),
                                  (1, self.divisor)]:
                if level == runs[-1][0]:
                    runs[-1][1] += cycles
                else:
                    runs.append([level, cycles])
        for level, cycles in runs:
            if cycles:
                self.dut.rx.value = level
                await self.cycles(cycles)
        assert self.cycle == at, f"sent until cycle {self.cycle}, planned {at}"
        self.out += data
        self.starts += starts
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
    """The emulator on the board's clock (ClockedDevice) fed every byte LinkTB sends, in the cycle UartRx offers it:
    it predicts every byte the board sends and the cycle LinkTB receives it in, and `check` holds the two equal."""

    def __init__(self, qm: QModel, spec: dict, tb: LinkTB) -> None:
        self.tb = tb
        self.device = ClockedDevice(qm, lanes=spec["lanes"], divisor=spec["divisor"], timeout=spec["timeout_cycles"],
                                    start=tb.cycle, counter_zero=tb.reset_cycle + COUNTER_ZERO)
        self.fed = len(tb.starts)  # bytes LinkTB sent before this oracle: the device gets every later one
        self.base = len(tb.received)  # bytes received before it
        self.log: list[tuple[int, str]] = []  # (cycle, label) of what the caller sent, for failure messages
        self.checked = 0  # reply bytes found equal so far

    def follow(self, label: str = "") -> None:
        """Give the device every byte LinkTB has sent since the last call, each in the cycle it arrives."""
        tb, device = self.tb, self.device
        if label and self.fed < len(tb.starts):
            self.log.append((tb.starts[self.fed], label))
        for byte, start in zip(tb.out[self.fed:], tb.starts[self.fed:], strict=True):
            device.receive(bytes([byte]), start + RX_LATENCY)
        self.fed = len(tb.starts)

    def check(self, what: str, final: bool = False) -> None:
        """The board's bytes equal the device's and came in the same cycles: those received before now (all of them
        once `final`: then none may have come that the device did not send)."""
        tb, k = self.tb, self.checked
        now = tb.cycle
        self.device.poll(now - TX_LATENCY - 1)  # no byte sent from now on arrives before now + RX_LATENCY
        want = [(byte, cycle + TX_LATENCY) for cycle, byte in self.device.sent[k:] if final or cycle + TX_LATENCY < now]
        got = [(byte, cycle) for byte, cycle in zip(tb.received[self.base + k:], tb.rx_cycles[self.base + k:], strict=True)
               if final or cycle < now]
        if got != want:
            raise AssertionError(self._difference(what))
        self.checked += len(want)

    def _difference(self, what: str) -> str:
        """Where the board and the device part: the byte, its cycle, the replies before it, what was sent before it."""
        tb, k0 = self.tb, self.checked
        want = [(byte, cycle + TX_LATENCY) for cycle, byte in self.device.sent]
        got = list(zip(tb.received[self.base:], tb.rx_cycles[self.base:], strict=True))
        k = next((i for i in range(k0, min(len(got), len(want))) if got[i] != want[i]), min(len(got), len(want)))
        at = got[k][1] if k < len(got) else want[k][1] if k < len(want) else tb.cycle

        def replies(stream: list[tuple[int, int]]) -> list[str]:
            parser, out = protocol.FrameParser(), []
            for byte, cycle in stream[:k + 16]:
                out += [f"{describe(r)} @{cycle}" for r in parser.push(bytes([byte]))]
            return out[-5:]

        sent = [f"{label} @{c}" for c, label in self.log if c <= at][-6:]
        return (f"{what}: the board and the emulator part at reply byte {k}, cycle {at}: the board sent "
                f"{got[k] if k < len(got) else 'nothing'}, the emulator {want[k] if k < len(want) else 'nothing'} "
                f"(byte, cycle received). Replies up to there, the board's: {replies(got)}; the emulator's: "
                f"{replies(want)}. Sent before it: {sent}")

    async def finish(self, what: str) -> None:
        """Run the device until it is idle, wait for the board to send what it predicts and settle, compare all."""
        device, tb = self.device, self.tb
        device.run_idle()
        last = device.sent[-1][0] + TX_LATENCY if device.sent else 0  # the cycle LinkTB receives the last byte in
        if tb.cycle <= last:
            assert last - tb.cycle < tb.watchdog, f"{what}: the emulator's replies take {last - tb.cycle} cycles"
            await tb.cycles(last - tb.cycle + 1)
        await tb.settle()
        self.check(what, final=True)


async def exchange(tb: LinkTB, oracle: Oracle, data: bytes, what: str, gaps: list[int] | None = None) -> list[str]:
    """Send `data` (with `gaps`), and check every reply against the oracle's, byte for byte and cycle for cycle
    -> the replies as text."""
    first = len(tb.received)
    await tb.send(data, gaps)
    oracle.follow(what)
    await oracle.finish(what)
    return [describe(r) for r in protocol.FrameParser().push(bytes(tb.received[first:]))]


def write_result(spec: dict, name: str, result: dict) -> None:
    Path(spec["results"], f"{name}.json").write_text(json.dumps(result))


def hello_reply(spec: dict, qm: QModel) -> str:
    hello = protocol.Hello(protocol.PROTOCOL_VERSION, qm.config.vocab_size, qm.context, spec["lanes"])
    return "HELLO " + protocol.hello_payload(hello).hex()


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

"""cocotb testbench for BoardCore through its UART pins only, as the host will see the board.

sim/sim_board.py passes a JSON spec through HARDWIRE_BOARD_SPEC: the divisor (clocks per
bit), the frame timeout in cycles, the prompt, n and the reference tokens, garbage bytes, a
watchdog and where to write the result. The test: prompt in → reference tokens out; garbage →
at least one ERROR; quiet for longer than the timeout, RESET → ACK; the prompt again → the
reference tokens again.
"""

from __future__ import annotations

import json
import os

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, FallingEdge, RisingEdge

from hardwire.host import protocol


class BoardTB:
    """Owns the clock, reset, a UART driver on `rx` and a UART monitor on `tx`."""

    PERIOD_NS = 10

    def __init__(self, dut: object, divisor: int, watchdog: int) -> None:
        self.dut = dut
        self.divisor = divisor
        self.watchdog = watchdog  # cycles one exchange may take before the test fails instead of hanging
        self.parser = protocol.FrameParser()
        self.replies: list[protocol.Response] = []
        self.received = bytearray()

    async def start(self) -> None:
        cocotb.start_soon(Clock(self.dut.clk, self.PERIOD_NS, unit="ns").start())
        self.dut.rx.value = 1
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 3)
        self.dut.rst.value = 0
        await RisingEdge(self.dut.clk)
        cocotb.start_soon(self._monitor())

    async def send(self, data: bytes) -> None:
        """8N1 on `rx`, one bit per `divisor` clocks, bytes back to back."""
        for byte in data:
            for bit in [0, *((byte >> i) & 1 for i in range(8)), 1]:
                self.dut.rx.value = bit
                await ClockCycles(self.dut.clk, self.divisor)

    async def _monitor(self) -> None:
        """Sample `tx` mid-bit after each start edge; a low stop bit fails the test (the device must not)."""
        while True:
            await FallingEdge(self.dut.tx)
            await ClockCycles(self.dut.clk, self.divisor // 2)
            assert int(self.dut.tx.value) == 0, "tx: a glitch where a start bit was expected"
            byte = 0
            for i in range(8):
                await ClockCycles(self.dut.clk, self.divisor)
                byte |= int(self.dut.tx.value) << i
            await ClockCycles(self.dut.clk, self.divisor)
            assert int(self.dut.tx.value) == 1, f"tx: framing error after byte 0x{byte:02x}"
            self.received.append(byte)
            self.replies.extend(self.parser.push(bytes([byte])))

    async def expect(self, start: int, count: int, what: str) -> list[protocol.Response]:
        """Wait until `count` replies have come after the first `start`; fail after the watchdog."""
        for _ in range(0, self.watchdog, 64):
            if len(self.replies) >= start + count:
                return self.replies[start:start + count]
            await ClockCycles(self.dut.clk, 64)
        got = [str(r) for r in self.replies[start:]]
        raise AssertionError(f"{what}: expected {count} replies within {self.watchdog} cycles, got {got} "
                             f"(bytes received: {self.received.hex()})")

    async def quiet(self, cycles: int) -> None:
        await ClockCycles(self.dut.clk, cycles)


def _tokens(replies: list[protocol.Response], what: str) -> list[int]:
    ops = [r.op for r in replies]
    assert ops == [protocol.Reply.TOKEN] * (len(ops) - 1) + [protocol.Reply.ACK], \
        f"{what}: expected TOKENs then ACK, got {[str(r) for r in replies]}"
    return [r.token for r in replies[:-1]]


@cocotb.test()
async def prompt_garbage_reset_prompt(dut: object) -> None:
    with open(os.environ["HARDWIRE_BOARD_SPEC"]) as fh:
        spec = json.load(fh)
    tb = BoardTB(dut, spec["divisor"], spec["watchdog"])
    await tb.start()
    prompt, n, reference = spec["prompt"], spec["n"], spec["reference"]
    result: dict = {}

    async def session(label: str) -> list[int]:
        start = len(tb.replies)
        await tb.send(protocol.reset() + b"".join(protocol.feed(prompt)) + protocol.generate(n))
        replies = await tb.expect(start, n + 3, label)
        assert [r.op for r in replies[:2]] == [protocol.Reply.ACK] * 2, f"{label}: {[str(r) for r in replies]}"
        return _tokens(replies[2:], label)

    result["first"] = await session("first session")
    before = len(tb.replies)
    await tb.send(bytes(spec["garbage"]))
    await tb.quiet(spec["timeout_cycles"] + 20 * spec["divisor"])
    await tb.expect(before, 1, "garbage")  # at least one ERROR, already here or soon
    errors = tb.replies[before:]
    result["garbage_replies"] = [str(r) for r in errors]
    assert errors and all(r.op == protocol.Reply.ERROR for r in errors), result["garbage_replies"]
    await tb.quiet(spec["timeout_cycles"] + 20 * spec["divisor"])  # the host rule: quiet for longer than T
    result["second"] = await session("after garbage")
    result["reference"] = reference
    result["dropped"] = tb.parser.dropped
    with open(spec["result"], "w") as fh:
        json.dump(result, fh)
    assert result["first"] == reference and result["second"] == reference, result
    assert tb.parser.dropped == 0, "the device sent bytes that are not frames"

"""UartTx → UartRx in Amaranth's simulator: every byte value, framing errors, backpressure, overrun."""

from __future__ import annotations

import random

import pytest
from amaranth.hdl import Module
from rtl_sim import run

from hardwire.boards.core import clocks_per_bit
from hardwire.boards.uart import UartRx, UartTx


def _loopback(divisor: int) -> tuple[Module, UartTx, UartRx]:
    m = Module()
    m.submodules.tx = tx = UartTx(divisor)
    m.submodules.rx = rx = UartRx(divisor)
    m.d.comb += rx.rx.eq(tx.tx)
    return m, tx, rx


@pytest.mark.parametrize("divisor", [4, 13])
def test_loopback_all_bytes(divisor):
    m, tx, rx = _loopback(divisor)
    rng = random.Random(divisor)
    sent = list(range(256))
    got: list[int] = []
    errors = []

    async def producer(ctx):
        for value in sent:
            while rng.random() < 0.2:  # idle gaps between bytes
                ctx.set(tx.i.valid, 0)
                await ctx.tick().repeat(rng.randrange(1, 3 * divisor))
            ctx.set(tx.i.payload, value)
            ctx.set(tx.i.valid, 1)
            await ctx.tick().until(tx.i.ready)
        ctx.set(tx.i.valid, 0)

    async def consumer(ctx):
        ctx.set(rx.o.ready, 1)
        while len(got) < len(sent):
            _, _, valid, payload, overrun, error = await ctx.tick().sample(rx.o.valid, rx.o.payload, rx.overrun,
                                                                          rx.error)
            if valid:
                got.append(int(payload))
            if overrun or error:
                errors.append((overrun, error))

    run(m, producer, consumer, deadline_cycles=256 * 14 * divisor * 2)
    assert got == sent
    assert errors == []


async def _drive_frame(ctx, line, divisor: int, value: int, stop: int) -> None:
    """One 8N1 character on a line driven by the testbench, with the given stop-bit level."""
    for bit in [0, *((value >> i) & 1 for i in range(8)), stop]:
        ctx.set(line, bit)
        await ctx.tick().repeat(divisor)
    ctx.set(line, 1)


def test_framing_error_dropped():
    divisor = 6
    rx = UartRx(divisor)
    got: list[int] = []
    errors: list[int] = []

    async def line(ctx):
        ctx.set(rx.rx, 1)
        await ctx.tick().repeat(10)
        await _drive_frame(ctx, rx.rx, divisor, 0x5A, stop=0)  # stop bit low: dropped
        await ctx.tick().repeat(3 * divisor)
        await _drive_frame(ctx, rx.rx, divisor, 0xC3, stop=1)
        await ctx.tick().repeat(4 * divisor)

    async def watch(ctx):
        ctx.set(rx.o.ready, 1)
        for _ in range(40 * divisor):
            _, _, valid, payload, error = await ctx.tick().sample(rx.o.valid, rx.o.payload, rx.error)
            if valid:
                got.append(int(payload))
            if error:
                errors.append(1)

    run(rx, line, watch, deadline_cycles=100 * divisor)
    assert got == [0xC3]
    assert errors == [1]


def test_rx_overrun_keeps_first_byte():
    """Nobody takes `o`: the second byte is dropped with one overrun strobe, the first stays offered."""
    divisor = 4
    rx = UartRx(divisor)
    overruns: list[int] = []
    offered: list[int] = []

    async def line(ctx):
        ctx.set(rx.rx, 1)
        ctx.set(rx.o.ready, 0)
        await ctx.tick().repeat(5)
        await _drive_frame(ctx, rx.rx, divisor, 0x11, stop=1)
        await _drive_frame(ctx, rx.rx, divisor, 0x22, stop=1)
        await ctx.tick().repeat(3 * divisor)
        offered.append(int(ctx.get(rx.o.payload)) if ctx.get(rx.o.valid) else -1)
        ctx.set(rx.o.ready, 1)
        await ctx.tick()
        ctx.set(rx.o.ready, 0)
        await ctx.tick().repeat(2)
        offered.append(int(ctx.get(rx.o.valid)))

    async def watch(ctx):
        for _ in range(30 * divisor):
            _, _, overrun = await ctx.tick().sample(rx.overrun)
            overruns.append(int(overrun))

    run(rx, line, watch, deadline_cycles=100 * divisor)
    assert sum(overruns) == 1
    assert offered == [0x11, 0]


def test_tx_backpressure():
    """Bytes offered back to back: ready stays low for a whole character, none is lost or repeated."""
    divisor = 5
    m, tx, rx = _loopback(divisor)
    sent = [0x00, 0xFF, 0xA5, 0x3C, 0x81]
    accepted: list[int] = []
    ready_trace: list[int] = []
    got: list[int] = []

    async def producer(ctx):
        for value in sent:
            ctx.set(tx.i.payload, value)
            ctx.set(tx.i.valid, 1)
            while True:
                _, _, ready = await ctx.tick().sample(tx.i.ready)
                ready_trace.append(int(ready))
                if ready:
                    accepted.append(value)
                    break
        ctx.set(tx.i.valid, 0)

    async def consumer(ctx):
        ctx.set(rx.o.ready, 1)
        while len(got) < len(sent):
            _, _, valid, payload = await ctx.tick().sample(rx.o.valid, rx.o.payload)
            if valid:
                got.append(int(payload))

    run(m, producer, consumer, deadline_cycles=len(sent) * 12 * divisor)
    assert accepted == sent and got == sent
    # after the first byte, each waits a whole character (10 bits) with ready low
    assert ready_trace.count(0) >= (len(sent) - 1) * 10 * divisor


@pytest.mark.parametrize("cls", [UartRx, UartTx])
def test_divisor_too_small(cls):
    with pytest.raises(ValueError, match=r"^divisor \(clocks per bit\) must be at least 4, got 3: raise the clock "
                                         r"or lower the baud rate$"):
        cls(3)


def test_baud_the_clock_cannot_make():
    with pytest.raises(ValueError, match=r"^a 1000000 Hz clock cannot make 500000 baud: 2 clocks per bit, the UART "
                                         r"needs at least 4; lower the baud rate to at most 250000$"):
        clocks_per_bit(1_000_000, 500_000)
    with pytest.raises(ValueError, match=r"^a 1000000 Hz clock makes 166667 baud instead of 180000 \(6 clocks per "
                                         r"bit\), more than 2% off; choose another clock or baud rate$"):
        clocks_per_bit(1_000_000, 180_000)
    assert clocks_per_bit(25_000_000, 115_200) == 217


# -- BoardCore's Verilog: lint (tests/test_boards_link_rtl.py runs it under cocotb) ------------------

def _board_qm():
    from random_ir import random_ir

    from hardwire.quant.quantize import quantize

    ir = random_ir(d=16, heads=2, kv_heads=1, ffn=24, vocab=20, context=16, layers=1, seed=0)
    return quantize(ir, "int8", context=16)


@pytest.mark.verilator
def test_board_verilog_lints(tmp_path):
    from hardwire.boards.core import BoardCore
    from hardwire.sim.sim_board import TOP_NAME, write_board_verilog
    from hardwire.sim.tools import lint

    core = BoardCore(_board_qm(), lanes=8, storage="rom", clk_hz=8 * 115_200, baud=115_200)
    result = lint(write_board_verilog(core, tmp_path), TOP_NAME)
    assert result.returncode == 0, result.stderr[-4000:]


def test_board_core_leds():
    """BoardCore in Amaranth's simulator through its pins: heartbeat period, busy while decoding,
    token and error LEDs stretched to LED_STRETCH_S (here 40 cycles at an 800 Hz clock)."""
    from hardwire.boards.core import LED_BUSY, LED_ERROR, LED_HEARTBEAT, LED_TOKEN, BoardCore
    from hardwire.host import protocol

    core = BoardCore(_board_qm(), lanes=8, storage="rom", clk_hz=800, baud=100)
    assert core.divisor == 8 and core.timeout == 32 * 10 * 8
    trace: list[int] = []
    stop: list[bool] = []

    async def host(ctx):
        ctx.set(core.rx, 1)
        await ctx.tick().repeat(20)
        bad = protocol.status()[:-1] + b"\x00"  # bad CRC: an ERROR reply
        for byte in bad + b"".join(protocol.feed([2])) + protocol.generate(1):
            await _drive_frame(ctx, core.rx, core.divisor, byte, stop=1)
        await ctx.tick().repeat(4000)  # the GENERATE token is decoded and the last replies leave
        stop.append(True)

    async def watch(ctx):
        while not stop:
            _, _, leds = await ctx.tick().sample(core.leds)
            trace.append(int(leds))

    run(core, host, watch, deadline_cycles=200_000)

    def runs(bit: int) -> list[int]:
        """Lengths of the runs of cycles with LED `bit` on."""
        out, length = [], 0
        for value in [*trace, 0]:
            if value >> bit & 1:
                length += 1
            elif length:
                out.append(length)
                length = 0
        return out

    heartbeat = runs(LED_HEARTBEAT)
    assert heartbeat[1:-1] and all(n == 256 for n in heartbeat[1:-1])  # 9-bit counter: 256 on, 256 off
    assert len(runs(LED_ERROR)) == 1 and runs(LED_ERROR)[0] >= 40
    assert len(runs(LED_TOKEN)) == 1 and runs(LED_TOKEN)[0] >= 40
    busy = runs(LED_BUSY)  # two tokens decoded (the FEED's, the GENERATE's), maybe in one stretched run
    assert 1 <= len(busy) <= 2 and sum(busy) > 100 and not trace[-1] >> LED_BUSY & 1


def test_board_core_bad_arguments():
    from hardwire.boards.core import BoardCore

    qm = _board_qm()
    with pytest.raises(ValueError, match=r"^timeout_bytes must be a positive integer, got 0$"):
        BoardCore(qm, lanes=8, storage="rom", clk_hz=12_000_000, baud=115_200, timeout_bytes=0)
    with pytest.raises(ValueError, match=r"^a 12000000 Hz clock cannot make 4000000 baud: 3 clocks per bit"):
        BoardCore(qm, lanes=8, storage="rom", clk_hz=12_000_000, baud=4_000_000)
    with pytest.raises(ValueError, match=r"^lanes must be a power of two from 1 to 64, got 3$"):
        BoardCore(qm, lanes=3, storage="rom", clk_hz=12_000_000, baud=115_200)

"""UART receiver and transmitter, 8N1, one divisor (clocks per bit) fixed at build time.

The host link needs nothing more: no parity, no flow control, one stop bit. The receiver
never stalls the line: a byte that its consumer has not taken by the time the next one is
complete is dropped and `overrun` pulses, since the wire cannot be paused.
"""

# no `from __future__ import annotations`: wiring.Component reads the port annotations as objects

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

MIN_DIVISOR = 4  # the receiver samples mid-bit after a 2-flop synchroniser: fewer clocks leave no middle


def check_divisor(divisor: int) -> None:
    """Raise a ValueError a user can act on when the divisor cannot make a UART bit."""
    if not isinstance(divisor, int) or isinstance(divisor, bool):
        raise TypeError(f"divisor (clocks per bit) must be an integer, got {divisor!r}")
    if divisor < MIN_DIVISOR:
        raise ValueError(f"divisor (clocks per bit) must be at least {MIN_DIVISOR}, got {divisor}: "
                         "raise the clock or lower the baud rate")


class UartRx(wiring.Component):
    """Receives 8N1 bytes from the `rx` line; each good byte is offered once on `o`.

    The line goes through two flip-flops (it comes from another clock domain), a start bit is
    confirmed half a bit after its falling edge, and every later bit is sampled a whole bit
    after the previous one, i.e. in the middle of the bit. A stop bit that reads low is a
    framing error: the byte is dropped, `error` pulses, and the receiver waits for the line
    to go high again (a break is one error, not a stream of zero bytes).
    """

    rx: In(1, init=1)  # the line idles high
    o: Out(stream.Signature(8))
    overrun: Out(1)  # one-cycle strobe: a byte was dropped because `o` still held the last one
    error: Out(1)  # one-cycle strobe: framing error (stop bit low), the byte was dropped

    def __init__(self, divisor: int) -> None:
        try:
            check_divisor(divisor)
        except (TypeError, ValueError):
            self._MustUse__silence = True  # never elaborated: no "created but never used" warning
            raise
        self.divisor = divisor
        super().__init__()

    def elaborate(self, platform: object) -> Module:
        m = Module()
        d = self.divisor
        sync = Signal(2, init=0b11)  # 2-flop synchroniser, idle high
        m.d.sync += sync.eq(Cat(self.rx, sync[0]))
        line = sync[1]

        timer = Signal(range(d))
        bits = Signal(range(8))
        shreg = Signal(8)
        m.d.sync += [self.overrun.eq(0), self.error.eq(0)]
        with m.If(self.o.ready):
            m.d.sync += self.o.valid.eq(0)

        with m.FSM(name="uart_rx"):
            with m.State("IDLE"), m.If(~line):
                m.d.sync += timer.eq(d // 2 - 1)
                m.next = "START"
            with m.State("START"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Elif(line):  # a glitch, not a start bit
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += [timer.eq(d - 1), bits.eq(0)]
                    m.next = "DATA"
            with m.State("DATA"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Else():
                    m.d.sync += [shreg.eq(Cat(shreg[1:], line)), timer.eq(d - 1), bits.eq(bits + 1)]
                    with m.If(bits == 7):  # LSB first: after eight shifts shreg holds the byte
                        m.next = "STOP"
            with m.State("STOP"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Elif(line):
                    with m.If(self.o.valid & ~self.o.ready):
                        m.d.sync += self.overrun.eq(1)
                    with m.Else():
                        m.d.sync += [self.o.payload.eq(shreg), self.o.valid.eq(1)]
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += self.error.eq(1)
                    m.next = "BREAK"
            with m.State("BREAK"), m.If(line):
                m.next = "IDLE"
        return m


class UartTx(wiring.Component):
    """Sends each byte taken from `i` as 8N1 on `tx`; `i.ready` is high only between bytes,
    so a producer simply waits (the transmitter never drops a byte)."""

    i: In(stream.Signature(8))
    tx: Out(1, init=1)  # the line idles high

    def __init__(self, divisor: int) -> None:
        try:
            check_divisor(divisor)
        except (TypeError, ValueError):
            self._MustUse__silence = True  # never elaborated: no "created but never used" warning
            raise
        self.divisor = divisor
        super().__init__()

    def elaborate(self, platform: object) -> Module:
        m = Module()
        d = self.divisor
        timer = Signal(range(d))
        bits = Signal(range(10))
        shreg = Signal(9)  # data bits LSB first, then the stop bit

        with m.FSM(name="uart_tx"):
            with m.State("IDLE"):
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid):
                    m.d.sync += [self.tx.eq(0), shreg.eq(Cat(self.i.payload, 1)), bits.eq(9), timer.eq(d - 1)]
                    m.next = "SEND"
            with m.State("SEND"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Elif(bits == 0):  # the stop bit has lasted a whole bit
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += [self.tx.eq(shreg[0]), shreg.eq(shreg[1:]), bits.eq(bits - 1), timer.eq(d - 1)]
        return m

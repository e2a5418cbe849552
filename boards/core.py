"""BoardCore: everything of the board design that does not depend on the board.

UART pins in, UART pins out, four LEDs: a UartRx and UartTx at clocks-per-bit =
round(clk_hz / baud), the HostLink protocol engine, and the Decoder. boards/top.py puts it
on a platform (pins, PLL); the cocotb test (sim/sim_board.py) drives its pins directly.
"""

# no `from __future__ import annotations`: wiring.Component reads the port annotations as objects

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..quant.qmodel import QModel
from ..rtl.decoder import Decoder
from ..rtl.lora_map import lora_addr_bits, shift_addresses
from .host_link import HostLink
from .uart import MIN_DIVISOR, UartRx, UartTx

LED_HEARTBEAT, LED_BUSY, LED_TOKEN, LED_ERROR = range(4)
LED_STRETCH_S = 0.05  # an event lights its LED at least this long, so a human sees a one-cycle strobe


def clocks_per_bit(clk_hz: int, baud: int) -> int:
    """round(clk_hz / baud), or a ValueError saying what to change when the UART cannot work."""
    if not isinstance(clk_hz, int) or clk_hz <= 0:
        raise ValueError(f"clk_hz must be a positive integer, got {clk_hz!r}")
    if not isinstance(baud, int) or baud <= 0:
        raise ValueError(f"baud must be a positive integer, got {baud!r}")
    divisor = round(clk_hz / baud)
    if divisor < MIN_DIVISOR:
        raise ValueError(f"a {clk_hz} Hz clock cannot make {baud} baud: {divisor} clocks per bit, the UART needs at "
                         f"least {MIN_DIVISOR}; lower the baud rate to at most {clk_hz // MIN_DIVISOR}")
    if abs(clk_hz / divisor - baud) / baud > 0.02:
        raise ValueError(f"a {clk_hz} Hz clock makes {clk_hz / divisor:.0f} baud instead of {baud} "
                         f"({divisor} clocks per bit), more than 2% off; choose another clock or baud rate")
    return divisor


class BoardCore(wiring.Component):
    """The decoder behind the host protocol on a UART (docs/protocol.md)."""

    rx: In(1, init=1)  # UART from the host; idles high
    tx: Out(1, init=1)  # UART to the host
    leds: Out(4)  # 0 heartbeat, 1 decoder busy, 2 token sent, 3 error seen

    def __init__(self, qm: QModel, *, lanes: int, storage: str, clk_hz: int, baud: int, rows: int = 1,
                 attention_rows: int | None = None, softmax_lanes: int = 1, dsp_rows: int | None = None,
                 epilogue_lanes: int = 1, timeout_bytes: int = 32) -> None:
        try:
            self.divisor = clocks_per_bit(clk_hz, baud)
            if not isinstance(timeout_bytes, int) or timeout_bytes < 1:
                raise ValueError(f"timeout_bytes must be a positive integer, got {timeout_bytes!r}")
            self.decoder = Decoder(qm, rows=rows, lanes=lanes, storage=storage, attention_rows=attention_rows,
                                   softmax_lanes=softmax_lanes, dsp_rows=dsp_rows, epilogue_lanes=epilogue_lanes)
        except ValueError:
            self._MustUse__silence = True
            raise
        self.qm, self.lanes, self.storage, self.clk_hz, self.baud = qm, lanes, storage, clk_hz, baud
        self.timeout = timeout_bytes * 10 * self.divisor  # cycles: 10 bits per byte
        # qm.context: the context the build has (`hardwire compile --context`), which the decoder's KV cache holds;
        # qm.config.context is what the graph declares, and is None for a RoPE graph that declares none
        self.link = HostLink(vocab=qm.config.vocab_size, context=qm.context, lanes=lanes,
                             lora_addr_bits=lora_addr_bits(qm), timeout=self.timeout, lora_shifts=shift_addresses(qm))
        self.uart_rx, self.uart_tx = UartRx(self.divisor), UartTx(self.divisor)
        super().__init__()

    def elaborate(self, platform: object) -> Module:
        m = Module()
        m.submodules.uart_rx = rx = self.uart_rx
        m.submodules.uart_tx = tx = self.uart_tx
        m.submodules.link = link = self.link
        m.submodules.decoder = dec = self.decoder
        wiring.connect(m, rx.o, link.rx)
        wiring.connect(m, link.tx, tx.i)
        wiring.connect(m, link.tokens, dec.tokens)
        wiring.connect(m, dec.out, link.out)
        wiring.connect(m, link.lora, dec.lora)
        m.d.comb += [link.status.eq(dec.status), rx.rx.eq(self.rx), self.tx.eq(tx.tx)]

        # LEDs: a heartbeat blinking with a period of 0.5–1 s, and each event stretched to LED_STRETCH_S
        beat = Signal(max(1, (self.clk_hz // 2).bit_length()))
        m.d.sync += beat.eq(beat + 1)
        m.d.comb += self.leds[LED_HEARTBEAT].eq(beat[-1])
        stretch = max(1, round(self.clk_hz * LED_STRETCH_S))
        for led, event in ((LED_BUSY, dec.status.busy | link.generating), (LED_TOKEN, link.token_sent),
                           (LED_ERROR, link.error_sent | link.dropped | rx.overrun | rx.error)):
            left = Signal(range(stretch + 1), name=f"led{led}_left")
            with m.If(event):
                m.d.sync += left.eq(stretch)
            with m.Elif(left != 0):
                m.d.sync += left.eq(left - 1)
            m.d.comb += self.leds[led].eq(event | (left != 0))
        return m

"""BoardTop: H1's BoardCore on a real board: UART pins, LEDs, and the clock.

This is the one file where vendor primitives appear (EHXPLLL on the ECP5, SB_PLL40_PAD on
the iCE40, rPLL on the GW2A; the GW5A boards run at their oscillator; the dividers are searched in
boards/plls.py): everything below it is
vendor-neutral. Without --clock-mhz the design runs from
the board's oscillator through the platform's own clock domain (which also holds reset while
the FPGA starts). With a different frequency a PLL makes it, and the design is held in reset
until the PLL locks and, on the iCE40, 15 µs more (its block RAMs read as zero for about 3 µs
after configuration).
"""

from __future__ import annotations

from amaranth.hdl import ClockDomain, Const, Elaboratable, Instance, Module, Signal
from amaranth.lib import io
from amaranth.lib.cdc import ResetSynchronizer

from ..quant.qmodel import QModel
from .core import LED_BUSY, LED_ERROR, LED_HEARTBEAT, LED_TOKEN, BoardCore
from .parts import Part, part
from .plls import Ecp5Pll, GowinRpll, Pll, board_pll

ICE40_BRAM_WAIT_S = 15e-6  # 3 µs of zero reads after configuration, with the platform's 5x margin

def _platform(board: Part) -> object:
    """The board's platform (Part.platform: "module:Class", amaranth-boards' or boards/gowin.py's)."""
    import importlib

    if not board.platform:
        raise ValueError(f"the {board.title} has no platform here: {board.no_build or 'no pins are known'}")
    module, name = board.platform.split(":")
    return getattr(importlib.import_module(module), name)()


class BoardTop(Elaboratable):
    """The BoardCore with its pins, LEDs and clock on the board's amaranth-boards platform."""

    def __init__(self, qm: QModel, *, lanes: int, storage: str, board: str, baud: int = 115200, rows: int = 1,
                 attention_rows: int | None = None, softmax_lanes: int = 1, dsp_rows: int | None = None,
                 epilogue_lanes: int = 1, clock_mhz: float | None = None) -> None:
        try:
            self.part = part(board)
            self.pll: Pll | None = None
            if clock_mhz is not None and not clock_mhz > 0:
                raise ValueError(f"clock_mhz must be positive, got {clock_mhz!r}")
            if clock_mhz is not None and abs(clock_mhz - self.part.clock_mhz) > 1e-9:
                self.pll = board_pll(self.part, clock_mhz)
            self.clock_mhz = self.pll.f_out_mhz if self.pll is not None else self.part.clock_mhz
            self.clk_hz = round(self.clock_mhz * 1e6)
            self.core = BoardCore(qm, rows=rows, lanes=lanes, storage=storage, attention_rows=attention_rows,
                                  softmax_lanes=softmax_lanes, dsp_rows=dsp_rows, epilogue_lanes=epilogue_lanes,
                                  clk_hz=self.clk_hz, baud=baud)
        except ValueError:
            self._MustUse__silence = True  # refused, never elaborated: no "created but never used" warning
            raise
        self.platform = _platform(self.part)

    def elaborate(self, platform: object) -> Module:
        m = Module()
        core = self.core
        if self.pll is not None:
            self._pll_domain(m, platform)
        m.submodules.core = core
        # every pin of the UART resource raw (the ULX3S's also has rts and dtr, unused here); buffers below
        uart = platform.request("uart", 0, dir={sub.name: "-" for sub in platform.lookup("uart", 0).ios})
        m.submodules.uart_rx = rx = io.Buffer("i", uart.rx)
        m.submodules.uart_tx = tx = io.Buffer("o", uart.tx)
        m.d.comb += [core.rx.eq(rx.i), tx.o.eq(core.tx)]
        # Part.leds: four or more LEDs (ULX3S, Tang Nano 20K, Tang Mega 138K): the first four show heartbeat, busy,
        # token, error; two: the first (the iCEBreaker's green) heartbeat and tokens, the second (red) busy and errors
        green, red = core.leds[LED_HEARTBEAT] | core.leds[LED_TOKEN], core.leds[LED_ERROR] | core.leds[LED_BUSY]
        leds = {"four": [("led", i, None, core.leds[i]) for i in range(4)],
                "pair": [("led", 0, None, green), ("led", 1, None, red)],
                "green_red": [("led_g", 0, None, green), ("led_r", 0, None, red)],
                "rgb": [("rgb_led", 0, "g", green), ("rgb_led", 0, "r", red)],  # the OrangeCrab's RGB LED
                "none": []}[self.part.leds]  # the Colorlight 5A-75B's one LED is its UART's tx pin
        requested = {}
        for name, number, sub, value in leds:
            if (name, number) not in requested:
                requested[name, number] = platform.request(name, number, dir="-")
            pins = requested[name, number] if sub is None else getattr(requested[name, number], sub)
            m.submodules[f"{name}{number}{sub or ''}"] = led = io.Buffer("o", pins)
            m.d.comb += led.o.eq(value)
        return m

    def _pll_domain(self, m: Module, platform: object) -> None:
        """The sync domain from a PLL; reset held until lock (and the iCE40's block-RAM wait) is over."""
        m.domains.sync = cd_sync = ClockDomain("sync")
        locked = Signal()
        clk_io = platform.request(platform.default_clk, dir="-")
        pll = self.pll
        if isinstance(pll, Ecp5Pll):
            m.submodules.clk_buf = clk_buf = io.Buffer("i", clk_io)
            m.submodules.pll = Instance(
                "EHXPLLL",
                a_ICP_CURRENT="12", a_LPF_RESISTOR="8", a_MFG_ENABLE_FILTEROPAMP="1", a_MFG_GMCREF_SEL="2",
                a_FREQUENCY_PIN_CLKI=f"{self.part.clock_mhz:g}", a_FREQUENCY_PIN_CLKOP=f"{pll.f_out_mhz:.4f}",
                p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
                p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA", p_OUTDIVIDER_MUXB="DIVB",
                p_OUTDIVIDER_MUXC="DIVC", p_OUTDIVIDER_MUXD="DIVD", p_CLKOP_ENABLE="ENABLED",
                p_CLKI_DIV=pll.clki_div, p_CLKFB_DIV=pll.clkfb_div, p_CLKOP_DIV=pll.clkop_div,
                p_CLKOP_CPHASE=pll.clkop_cphase, p_CLKOP_FPHASE=0, p_FEEDBK_PATH="CLKOP",
                i_CLKI=clk_buf.i, i_CLKFB=cd_sync.clk, o_CLKOP=cd_sync.clk, o_LOCK=locked,
                i_RST=Const(0), i_STDBY=Const(0), i_PHASESEL0=Const(0), i_PHASESEL1=Const(0),
                i_PHASEDIR=Const(1), i_PHASESTEP=Const(1), i_PHASELOADREG=Const(1), i_PLLWAKESYNC=Const(0),
                i_ENCLKOP=Const(0))
            wait = 16
        elif isinstance(pll, GowinRpll):  # internal feedback, fixed dividers, every dynamic input tied off
            m.submodules.clk_buf = clk_buf = io.Buffer("i", clk_io)
            m.submodules.pll = Instance(
                "rPLL",
                p_FCLKIN=f"{self.part.clock_mhz:g}", p_IDIV_SEL=pll.idiv_sel, p_FBDIV_SEL=pll.fbdiv_sel,
                p_ODIV_SEL=pll.odiv_sel, p_DEVICE=self.platform.family, p_CLKFB_SEL="internal",
                p_DYN_IDIV_SEL="false", p_DYN_FBDIV_SEL="false", p_DYN_ODIV_SEL="false",
                i_CLKIN=clk_buf.i, i_CLKFB=Const(0), i_RESET=Const(0), i_RESET_P=Const(0), i_FBDSEL=Const(0, 6),
                i_IDSEL=Const(0, 6), i_ODSEL=Const(0, 6), i_PSDA=Const(0, 4), i_DUTYDA=Const(0, 4),
                i_FDLY=Const(0, 4), o_CLKOUT=cd_sync.clk, o_LOCK=locked)
            wait = 16
        else:
            m.submodules.pll = Instance(
                "SB_PLL40_PAD",
                p_FEEDBACK_PATH="SIMPLE", p_DIVR=pll.divr, p_DIVF=pll.divf, p_DIVQ=pll.divq,
                p_FILTER_RANGE=pll.filter_range,
                io_PACKAGEPIN=clk_io.io, i_RESETB=Const(1), i_BYPASS=Const(0),
                o_PLLOUTGLOBAL=cd_sync.clk, o_LOCK=locked)
            wait = round(ICE40_BRAM_WAIT_S * pll.f_out_mhz * 1e6)
        platform.add_clock_constraint(cd_sync.clk, self.clk_hz)
        # reset: asserted while unlocked, released in step with the clock (the "boot" domain, the same clock),
        # then held `wait` cycles more; the core's reset is one register, on the ECP5 driven onto a global network
        # (DCCA): from the synchroniser through a LUT to every register's LSR across the die it was the routed
        # 4 x 32 build's critical path (22.2 ns, 20.7 ns of it routing, 2026-12-07)
        m.domains.boot = cd_boot = ClockDomain("boot")
        m.d.comb += cd_boot.clk.eq(cd_sync.clk)
        m.submodules.reset_sync = ResetSynchronizer(~locked, domain="boot")
        hold = Signal(range(wait + 1), init=wait)
        with m.If(hold != 0):
            m.d.boot += hold.eq(hold - 1)
        core_reset = Signal(init=1)
        m.d.boot += core_reset.eq(hold != 0)
        if isinstance(pll, Ecp5Pll):
            m.submodules.reset_buf = Instance("DCCA", i_CLKI=core_reset, i_CE=Const(1), o_CLKO=cd_sync.rst)
        else:  # nextpnr-ice40 and -himbaechel promote a high fan-out reset to a global network themselves
            m.d.comb += cd_sync.rst.eq(core_reset)

"""The PLL dividers for a clock the board's oscillator does not give: the ECP5's EHXPLLL, the iCE40's SB_PLL40 and
the GW2A's rPLL, each searched as its vendor's or its open tool's calculator does. boards/top.py instantiates them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .parts import Part

# ECP5 EHXPLLL limits in MHz (prjtrellis ecppll: PFD 3.125..400, VCO 400..800, output 10..400)
ECP5_PFD = (3.125, 400.0)
ECP5_VCO = (400.0, 800.0)
ECP5_OUT = (10.0, 400.0)
# iCE40 PLL limits in MHz (icestorm icepll, SIMPLE feedback: PFD 10..133, VCO 533..1066, output 16..275)
ICE40_PFD = (10.0, 133.0)
ICE40_VCO = (533.0, 1066.0)
ICE40_OUT = (16.0, 275.0)


@dataclass(frozen=True)
class Ecp5Pll:
    """EHXPLLL dividers: f_out = f_in / clki_div * clkfb_div, f_vco = f_out * clkop_div."""

    clki_div: int
    clkfb_div: int
    clkop_div: int
    clkop_cphase: int
    f_out_mhz: float
    f_vco_mhz: float


@dataclass(frozen=True)
class Ice40Pll:
    """SB_PLL40 dividers (SIMPLE feedback): f_out = f_in * (divf + 1) / ((divr + 1) * 2**divq)."""

    divr: int
    divf: int
    divq: int
    filter_range: int
    f_out_mhz: float
    f_vco_mhz: float


def ecp5_pll(f_in: float, f_out: float) -> Ecp5Pll:
    """The dividers nearest f_out, searched as prjtrellis's ecppll does (ties: the VCO nearest 600 MHz)."""
    if not ECP5_OUT[0] <= f_out <= ECP5_OUT[1]:
        raise ValueError(f"the ECP5 PLL makes {ECP5_OUT[0]:g} to {ECP5_OUT[1]:g} MHz, not {f_out:g} MHz")
    best: tuple[float, float, Ecp5Pll] | None = None
    for clki_div in range(1, 129):
        f_pfd = f_in / clki_div
        if not ECP5_PFD[0] <= f_pfd <= ECP5_PFD[1]:
            continue
        for clkfb_div in range(1, 81):
            for clkop_div in range(1, 129):
                f_vco = f_pfd * clkfb_div * clkop_div
                if not ECP5_VCO[0] <= f_vco <= ECP5_VCO[1]:
                    continue
                got = f_vco / clkop_div
                key = (abs(got - f_out), abs(f_vco - 600))
                if best is None or key < best[:2]:
                    # CLKOP_CPHASE: the primary output shifted by 180 degrees, as Lattice's tools set it
                    best = (*key, Ecp5Pll(clki_div, clkfb_div, clkop_div, clkop_div // 2, got, f_vco))
    assert best is not None  # some divider pair always lands in the VCO range for a legal output
    return best[2]


def ice40_pll(f_in: float, f_out: float) -> Ice40Pll:
    """The dividers nearest f_out, searched as icestorm's icepll does for SIMPLE feedback."""
    if not ICE40_OUT[0] <= f_out <= ICE40_OUT[1]:
        raise ValueError(f"the iCE40 PLL makes {ICE40_OUT[0]:g} to {ICE40_OUT[1]:g} MHz, not {f_out:g} MHz")
    best: tuple[float, Ice40Pll] | None = None
    for divr in range(16):
        f_pfd = f_in / (divr + 1)
        if not ICE40_PFD[0] <= f_pfd <= ICE40_PFD[1]:
            continue
        for divf in range(128):
            f_vco = f_pfd * (divf + 1)
            if not ICE40_VCO[0] <= f_vco <= ICE40_VCO[1]:
                continue
            for divq in range(1, 7):
                got = f_vco / (1 << divq)
                if best is None or abs(got - f_out) < best[0]:
                    # the loop filter follows the PFD frequency (SB_PLL40 documentation, icepll)
                    filter_range = next(i + 1 for i, top in enumerate((17, 26, 44, 66, 101, float("inf")))
                                        if f_pfd < top)
                    best = (abs(got - f_out), Ice40Pll(divr, divf, divq, filter_range, got, f_vco))
    if best is None:
        raise ValueError(f"no iCE40 PLL setting makes {f_out:g} MHz from {f_in:g} MHz")
    return best[1]


# GW2A rPLL limits in MHz (Gowin DS102, GW2A family data sheet, PLL: PFD 3..500, VCO 500..1250, CLKOUT 3.90625..625;
# the same figures as apycula's gowin_pll calculator for the GW2A-18). ODIV_SEL takes these values only
GW2A_PFD = (3.0, 500.0)
GW2A_VCO = (500.0, 1250.0)
GW2A_OUT = (3.90625, 625.0)
GW2A_ODIV = (2, 4, 8, 16, 32, 48, 64, 80, 96, 112, 128)


@dataclass(frozen=True)
class GowinRpll:
    """rPLL dividers: f_out = f_in * (fbdiv_sel + 1) / (idiv_sel + 1), f_vco = f_out * odiv_sel."""

    idiv_sel: int
    fbdiv_sel: int
    odiv_sel: int
    f_out_mhz: float
    f_vco_mhz: float


def gowin_rpll(f_in: float, f_out: float) -> GowinRpll:
    """The dividers nearest f_out (ties: the VCO nearest the middle of its range, then the smaller dividers)."""
    if not GW2A_OUT[0] <= f_out <= GW2A_OUT[1]:
        raise ValueError(f"the GW2A PLL makes {GW2A_OUT[0]:g} to {GW2A_OUT[1]:g} MHz, not {f_out:g} MHz")
    middle = sum(GW2A_VCO) / 2
    best: tuple[float, float, GowinRpll] | None = None
    for idiv in range(64):
        if not GW2A_PFD[0] <= f_in / (idiv + 1) <= GW2A_PFD[1]:
            continue
        for fbdiv in range(64):
            got = f_in * (fbdiv + 1) / (idiv + 1)
            for odiv in GW2A_ODIV:
                f_vco = got * odiv
                if not GW2A_VCO[0] <= f_vco <= GW2A_VCO[1]:
                    continue
                key = (abs(got - f_out), abs(f_vco - middle))
                if best is None or key < best[:2]:
                    best = (*key, GowinRpll(idiv, fbdiv, odiv, got, f_vco))
    if best is None:
        raise ValueError(f"no GW2A PLL setting makes {f_out:g} MHz from {f_in:g} MHz")
    return best[2]


Pll = Ecp5Pll | Ice40Pll | GowinRpll


def board_pll(board: Part, f_out: float) -> Pll:
    """The PLL setting nearest f_out on this board's part; a clear error where hardwire sets none up."""
    if board.family == "ecp5":
        return ecp5_pll(board.clock_mhz, f_out)
    if board.family == "ice40":
        return ice40_pll(board.clock_mhz, f_out)
    if board.device.startswith("GW2A"):
        return gowin_rpll(board.clock_mhz, f_out)
    raise ValueError(f"the {board.title} runs at its {board.clock_mhz:g} MHz oscillator: hardwire sets up the GW2A's "
                     f"rPLL, not the GW5A's PLLA yet (leave out --clock-mhz)")


def pll_output_range(board: Part) -> tuple[float, float] | None:
    """The frequencies the board's PLL makes, or None where hardwire sets up no PLL."""
    if board.family == "ecp5":
        return ECP5_OUT
    if board.family == "ice40":
        return ICE40_OUT
    return GW2A_OUT if board.device.startswith("GW2A") else None

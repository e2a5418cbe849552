"""ECP5 board platforms that amaranth-boards lacks a piece of.

The OrangeCrab r0.2's USB goes straight to the FPGA (no USB-serial chip), and amaranth-boards' platform names no
UART. The host link needs one, so these platforms add it where litex-boards puts the board's serial port
(litex_boards/platforms/gsd_orangecrab.py, `feather_serial`: tx on Feather pin 1, rx on pin 0), which amaranth-boards'
own `io` connector maps to balls M18 (pin 1) and N17 (pin 0). A 3.3 V USB-serial adapter wired to those two pins
and ground is the board's host link.
"""

from __future__ import annotations

from amaranth.build import Attrs
from amaranth_boards.orangecrab_r0_2 import OrangeCrabR0_2_25FPlatform, OrangeCrabR0_2_85FPlatform
from amaranth_boards.resources import UARTResource

ORANGECRAB_UART = UARTResource(0, rx="N17", tx="M18", attrs=Attrs(IO_TYPE="LVCMOS33", PULLMODE="UP"))


class OrangeCrab25FPlatform(OrangeCrabR0_2_25FPlatform):
    resources = (*OrangeCrabR0_2_25FPlatform.resources, ORANGECRAB_UART)


class OrangeCrab85FPlatform(OrangeCrabR0_2_85FPlatform):
    resources = (*OrangeCrabR0_2_85FPlatform.resources, ORANGECRAB_UART)

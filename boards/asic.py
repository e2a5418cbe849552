"""How big the decoder would be as a chip: generic gates and a transistor estimate.

This is the vendor-neutral end of the flow, the HC1 idea measured: the `logic` storage
design (weights as constant case tables, no ROM) synthesised by yosys to a two-input static
CMOS gate set (NAND, NOR, NOT: `abc -g cmos2`) plus plain D flip-flops, with the writable
memories (KV cache, LoRA SRAM, activation buffers) left as SRAM arrays and counted in bits.
Transistors follow from a table per cell type (static CMOS, below). No placement, no wires,
no SRAM periphery: a floor for the logic, not a signed-off die.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from ..rtl.build import TOP_NAME
from .fpga import run_tool, tool_command

# Transistors per cell in static CMOS. Two-input NAND/NOR: 2 series + 2 parallel devices; an
# inverter: 1 pair; AND/OR: NAND/NOR plus an inverter; XOR/XNOR and MUX2: the usual 12-device
# static forms; AOI/OAI: two devices per input; a positive-edge D flip-flop: master-slave
# latches with transmission gates and the local clock inverter (24); an SRAM bit: the 6T cell.
TRANSISTORS: dict[str, int] = {
    "$_NOT_": 2, "$_BUF_": 4, "$_NAND_": 4, "$_NOR_": 4, "$_AND_": 6, "$_OR_": 6, "$_ANDNOT_": 6, "$_ORNOT_": 6,
    "$_XOR_": 12, "$_XNOR_": 12, "$_MUX_": 12, "$_NMUX_": 10, "$_AOI3_": 6, "$_OAI3_": 6, "$_AOI4_": 8,
    "$_OAI4_": 8, "$_DFF_P_": 24,
}
SRAM_BIT_TRANSISTORS = 6

# After synthesis to coarse cells: ROMs (tables with init) become logic, RAMs stay memories (SRAM
# arrays, counted from a scratch copy holding only them), every flip-flop becomes a plain $_DFF_P_
# with its enable and reset as gates, and ABC maps all logic to NAND/NOR/NOT with an area-oriented
# script (structural hashing, dc2 rewriting, `map -a`): abc's default delay-driven script takes
# 25 times longer here and gives about 15% more gates.
SCRIPT = f"""
read_verilog decoder.v
synth -flatten -top {TOP_NAME} -run begin:fine
opt -fast -full
memory_map -rom-only
opt -full
design -save main
delete t:* t:$mem_v2 %d
write_json asic_memories.json
design -load main
techmap
opt -fast
dfflegalize -cell $_DFF_P_ 01
abc -g cmos2 -script +strash;dc2;map,-a
opt_clean -purge
tee -q -o asic_stat.json stat -json
tee -q -o asic_stat_cmos.json stat -json -tech cmos
"""


def build_asic(folder: Path, *, progress: bool = True) -> dict:
    """Gate count by type and a transistor estimate for a `logic`-storage build; writes folder/build_asic.json."""
    report_path = folder / "report.json"
    if not report_path.exists() or not (folder / "decoder.v").exists():
        raise FileNotFoundError(f"{folder} is not a build folder (no decoder.v or report.json); make one with "
                                f"`hardwire compile MODEL.onnx --weights logic -o {folder}`")
    report = json.loads(report_path.read_text())
    if report["storage"] != "logic":
        raise ValueError(f"{folder} holds its weights in ROM (--weights {report['storage']}), which an ASIC flow "
                         f"would need a memory compiler for; the ASIC estimate is for weights as gates: compile with "
                         f"`hardwire compile MODEL.onnx --weights logic -o DIR` and run `hardwire build DIR --target asic`")
    start = time.time()
    work = folder / "asic"
    shutil.rmtree(work, ignore_errors=True)  # nothing of an earlier run may be read as this one's
    work.mkdir()
    (work / "decoder.v").write_bytes((folder / "decoder.v").read_bytes())
    (work / "asic.ys").write_text(SCRIPT)
    if progress:
        print(f"synthesising {folder / 'decoder.v'} to NAND/NOR/NOT gates and flip-flops (yosys + abc) ...", flush=True)
    run_tool([tool_command("yosys"), "-q", "-l", "asic.log", "asic.ys"], work, work / "asic.log", "yosys", progress)
    cells = json.loads((work / "asic_stat.json").read_text())["design"]["num_cells_by_type"]
    cells = {name: int(count) for name, count in cells.items() if name != "$scopeinfo"}
    sram = _memory_bits(work / "asic_memories.json")
    cells.pop("$mem_v2", None)
    unknown = sorted(set(cells) - set(TRANSISTORS))
    if unknown:
        raise RuntimeError(f"synthesis left cell types with no transistor figure: {', '.join(unknown)}")
    logic = sum(count * TRANSISTORS[name] for name, count in cells.items())
    # yosys's own static-CMOS count (stat -tech cmos, flip-flops at 16), for comparison; memories not included
    yosys_cmos = json.loads((work / "asic_stat_cmos.json").read_text())["design"].get("estimated_num_transistors")
    result = {
        "top": TOP_NAME, "cells": dict(sorted(cells.items())), "cell_count": sum(cells.values()),
        "flip_flops": cells.get("$_DFF_P_", 0), "transistors_per_cell": {k: TRANSISTORS[k] for k in sorted(cells)},
        "logic_transistors": logic, "sram_bits": sram, "sram_transistors": sram * SRAM_BIT_TRANSISTORS,
        "transistors": logic + sram * SRAM_BIT_TRANSISTORS, "params": report["params"],
        "transistors_per_weight": round((logic + sram * SRAM_BIT_TRANSISTORS) / report["params"], 1),
        "yosys_cmos_logic_transistors": int(str(yosys_cmos).rstrip("+")) if yosys_cmos is not None else None,
        "seconds": round(time.time() - start, 1),
        "method": "yosys synth, abc -g cmos2 (static CMOS NAND2/NOR2/NOT, map -a), $_DFF_P_ flip-flops, RAMs as 6T SRAM bits",
    }
    (folder / "build_asic.json").write_text(json.dumps(result, indent=1) + "\n")
    if progress:
        print("cell type      count   transistors")
        for name, count in result["cells"].items():
            print(f"{name:<12}{count:>9,}{count * TRANSISTORS[name]:>14,}")
        print(f"SRAM bits   {sram:>9,}{sram * SRAM_BIT_TRANSISTORS:>14,}")
        print(f"total: {result['cell_count']:,} cells, {result['transistors']:,} transistors "
              f"({result['transistors_per_weight']} per weight) in {result['seconds']:.0f} s; "
              f"wrote {folder / 'build_asic.json'}")
    return result


def _memory_bits(path: Path) -> int:
    """Bits of the RAMs yosys kept as memories: SIZE x WIDTH of each $mem_v2 cell."""
    if not path.exists():
        return 0
    total = 0
    for module in json.loads(path.read_text()).get("modules", {}).values():
        for cell in module.get("cells", {}).values():
            if cell["type"] == "$mem_v2":
                params = cell["parameters"]
                total += int(params["SIZE"], 2) * int(params["WIDTH"], 2)
    return total

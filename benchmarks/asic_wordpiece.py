"""The bundled word-piece model through sky130hd, measured, beside what `hardwire project` predicts for it.

    hardwire compile models/tinyshakespeare_pieces.onnx --quant int8 --weights rom -o WORK/rom
    hardwire build WORK/rom --target asic          # (and --weights logic -o WORK/logic, likewise)
    python benchmarks/asic_wordpiece.py WORK/rom [WORK/logic ...]

For each synthesised folder (its build_asic.json) this times the netlist again with the wide nets buffered (as the
projection's fit points are), projects the same model and engine from its configuration alone
(boards/asic_projection.py: the model's ModelConfig, the build's rows, lanes, epilogue and softmax lanes and
context), prints measured against projected, and stores both in benchmarks/results/asic_wordpiece.json. The
projection models `--weights rom` only; a logic build is reported as measured.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

from hardwire.boards.asic_projection import (
    buffered_timing,
    load_fit,
    logic_measured,
    project,
)
from hardwire.frontend import load
from hardwire.rtl.plan import HardwarePlan

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "tinyshakespeare_pieces.onnx"
RESULT = ROOT / "benchmarks" / "results" / "asic_wordpiece.json"


def compare(folder: Path, model_fit, fo4: float, cfg) -> dict:
    build = json.loads((folder / "build_asic.json").read_text())
    report = json.loads((folder / "report.json").read_text())
    keep = ("storage", "cell_count", "flip_flops", "logic_area_um2", "logic_transistors", "rom_bits", "rom_area_um2",
            "rom_transistors", "weight_rom_bits", "weight_rom_area_um2", "weight_rom_transistors",
            "weight_rom_transistors_per_parameter", "sram_bits", "sram_area_um2", "sram_transistors", "area_um2",
            "transistors", "params", "transistors_per_parameter", "area_um2_per_parameter", "critical_path_ns",
            "critical_path_endpoint", "critical_path_depth", "logic_max_clock_mhz", "clock_limits_mhz", "clock_mhz",
            "clock_limited_by", "seconds", "library", "corner")
    out = {"folder": str(folder), "scheme": report["scheme"], "measured": {k: build[k] for k in keep}}
    buffered = buffered_timing(folder)
    out["measured"].update(buffered)
    if report["storage"] != "rom":
        return out
    plan = HardwarePlan(rows=report["rows"], lanes=report["lanes"], storage="rom",
                        epilogue_lanes=report["epilogue_lanes"], softmax_lanes=report["softmax_lanes"],
                        attention_rows=report["attention_rows"])
    proj = project(cfg, report["scheme"], plan, model_fit, context=report["context"], parameters=report["params"],
                   fo4_sky130_ns=fo4)["sky130"]
    m = out["measured"]
    logic = logic_measured({"measured": m})
    area = logic[0] + m["rom_area_um2"] + m["sram_area_um2"]
    transistors = logic[1] + m["rom_transistors"] + m["sram_transistors"]
    clock = min(1000.0 / m["buffered_path_ns"], *(v for k, v in m["clock_limits_mhz"].items() if k != "logic"))
    pairs = {
        "logic_area_um2": (proj["logic_area_mm2"] * 1e6, logic[0]),
        "logic_transistors": (proj["logic_transistors"], logic[1]),
        "rom_area_um2": (proj["rom_area_mm2"] * 1e6, m["rom_area_um2"]),
        "rom_transistors": (proj["rom_transistors"], m["rom_transistors"]),
        "weight_rom_transistors": (proj["weight_rom_transistors"], m["weight_rom_transistors"]),
        "sram_area_um2": (proj["sram_area_mm2"] * 1e6, m["sram_area_um2"]),
        "area_um2": (proj["area_mm2"] * 1e6, area),
        "transistors": (proj["transistors"], transistors),
        "path_ns": (proj["critical_path_ns"], m["buffered_path_ns"]),
        "clock_mhz": (proj["clock_mhz"], clock),
    }
    out["projected_vs_measured"] = {k: {"projected": p, "measured": v, "error": p / v - 1} for k, (p, v) in pairs.items()}
    out["engine"] = plan.shape
    return out


def main(folders: list[str]) -> int:
    ir = load(MODEL, verify=False)
    model_fit, fo4 = load_fit()
    stored = json.loads(RESULT.read_text()) if RESULT.exists() else {"builds": {}}
    for name in folders:
        folder = Path(name)
        result = compare(folder, model_fit, fo4, ir.config)
        result["date"] = datetime.date.today().isoformat()
        key = f"{result['scheme']}-{result['measured']['storage']}"
        stored["builds"][key] = result
        m = result["measured"]
        print(f"{key}: {m['cell_count']:,} cells ({m['flip_flops']:,} FFs), logic {m['logic_area_um2']:,.0f} um2 "
              f"{m['logic_transistors']:,} tr; ROM {m['rom_bits']:,} b {m['rom_area_um2']:,.0f} um2 "
              f"{m['rom_transistors']:,} tr (weights {m['weight_rom_bits']:,} b {m['weight_rom_area_um2']:,.0f} um2 "
              f"{m['weight_rom_transistors']:,} tr, {m['weight_rom_transistors_per_parameter']}/param); SRAM "
              f"{m['sram_bits']:,} b {m['sram_area_um2']:,.0f} um2 {m['sram_transistors']:,} tr; total "
              f"{m['area_um2']:,.0f} um2 {m['transistors']:,} tr = {m['area_um2_per_parameter']} um2 "
              f"{m['transistors_per_parameter']} tr a parameter; path {m['critical_path_ns']} ns "
              f"({m['critical_path_depth']} cells, {m['critical_path_endpoint']}), buffered {m['buffered_path_ns']} ns "
              f"({m['fanout_buffers']:,} buffers, {m['fanout_buffer_area_um2']:,.0f} um2); clock {m['clock_mhz']} MHz "
              f"({m['clock_limited_by']}); {m['seconds']} s")
        for k, v in result.get("projected_vs_measured", {}).items():
            print(f"  {k:<24} projected {v['projected']:>14,.2f}  measured {v['measured']:>14,.2f}  "
                  f"error {v['error']:+.1%}")
    stored["model"] = str(MODEL.relative_to(ROOT))
    stored["fit_points"] = list(model_fit.points)
    RESULT.write_text(json.dumps(stored, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

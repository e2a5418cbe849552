"""Fmax probe: a small row-parallel decoder placed and routed on the ULX3S-85F in about 12 minutes here.

    .venv/bin/python benchmarks/fmax_probe.py [--mhz 60] [-o build/fmax_probe]

The full bundled model takes an hour to place and route on this machine; this probe has every block
of it (row units on DSPs and by shift-add, attention on 2 rows, a 2-lane softmax and epilogue, LoRA
slots, the UART host link) around a random 2-layer, 32-wide, mixed36 model, so each change to the
pipelining is measured in minutes. Prints LUT4 / FF / DP16KD / MULT18X18D, Fmax and the critical
path from nextpnr's log (source, sink, logic and routing delay of each hop).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT.parent))  # run from a checkout: the root is the hardwire package
sys.path.insert(0, str(ROOT / "tests"))  # random_ir: small random models built without ONNX

from random_ir import random_ir  # noqa: E402

from hardwire.boards.fpga import NAME, build_board  # noqa: E402
from hardwire.quant.quantize import quantize  # noqa: E402
from hardwire.rtl.build import compile_to  # noqa: E402

SHAPE = dict(rows=4, lanes=8, attention_rows=2, softmax_lanes=2, epilogue_lanes=2, dsp_rows=2)


def critical_path(log: Path) -> list[str]:
    """The hops of nextpnr's critical path report: one line per cell or net with its delay."""
    lines = log.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "Critical path report for clock" in line)
    hops = []
    for line in lines[start + 1:]:
        if "ns logic" in line:
            hops.append(line.replace("Info:", "").strip())
            break
        if any(key in line for key in ("clk-to-q", " logic ", "routing", "setup")):
            hops.append(" ".join(line.replace("Info:", "").split())[:160])
    return hops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mhz", type=float, default=60.0, help="the PLL clock to build at (default 60)")
    parser.add_argument("-o", "--out", type=Path, default=ROOT / "build" / "fmax_probe")
    args = parser.parse_args()
    ir = random_ir(vocab=48, d=32, layers=2, heads=4, kv_heads=2, ffn=64, context=32, seed=1)
    compile_to(quantize(ir, "mixed36"), args.out, storage="rom", progress=False, **SHAPE)
    result = build_board(args.out, "ulx3s", clock_mhz=args.mhz, progress=True)
    print(json.dumps({k: result[k] for k in ("luts", "ffs", "brams", "dsps", "fmax_mhz", "clock_mhz", "timing_met")}))
    print("critical path:")
    for hop in critical_path(args.out / "board_ulx3s" / f"{NAME}.tim"):
        print("  " + hop)


if __name__ == "__main__":
    main()

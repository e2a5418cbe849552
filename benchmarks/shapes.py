"""Engine shapes on paper: the schedule's cycles per token and the board's fit estimate, no simulation.

    .venv/bin/python benchmarks/shapes.py [--model M.onnx] [--quant mixed36] [--board ulx3s]
                                          [--configs 4x16/2,8x16/4:s4:d6] [--auto]

A configuration is speed.py's ROWSxLANES[/ATTENTION_ROWS][:sSOFTMAX_LANES][:dDSP_ROWS][:eEPILOGUE_LANES]. For
each: cycles per token at positions 6, the middle and the end of the context (and the ratio to
the MAC bound), the latency floor, and the block RAMs, MULT18X18D and shift-add and epilogue LUT4s the fit
check estimates, with what does not fit. `--auto` adds the shape `--rows auto` chooses. The
cycle figures are the schedule that a cocotb test holds equal to the simulated cycles; the
resources are estimates (speed.py and `hardwire build` measure them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT.parent))  # run from a checkout: the root is the hardwire package
sys.path.insert(0, str(ROOT / "benchmarks"))

from speed import parse_config  # noqa: E402

from hardwire.boards.parts import choose_plan, estimate_model, part  # noqa: E402
from hardwire.cli import BUNDLED_MODEL  # noqa: E402
from hardwire.frontend import load  # noqa: E402
from hardwire.quant.quantize import quantize  # noqa: E402
from hardwire.rtl.plan import cycles_per_token_estimate, latency_floor_cycles, macs_per_token  # noqa: E402

DEFAULT_CONFIGS = "1x16,4x16/2,4x16/2:s8,4x32/1,4x32/1:d3,8x16/4:d6,8x16/4:s4:d6,8x32/4:s4:d2,16x32/8:s8:d2"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=BUNDLED_MODEL)
    parser.add_argument("--quant", default="mixed36")
    parser.add_argument("--board", default="ulx3s")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS)
    parser.add_argument("--auto", action="store_true", help="add the shape --rows auto picks")
    args = parser.parse_args()
    print(f"quantising {args.model.name} ({args.quant}) ...", file=sys.stderr, flush=True)
    qm = quantize(load(args.model), args.quant)
    board = part(args.board)
    plans = [parse_config(text) for text in args.configs.split(",")]
    if args.auto:
        plans.append(choose_plan(qm, board, "rom")[0])
    positions = (6, qm.context // 2, qm.context - 1)
    print(f"| shape | MACs/cycle | {' | '.join(f'position {p}' for p in positions)} | latency floor | "
          f"{board.bram_name} | {board.dsp_name} | shift-add + epilogue LUT4 | fits the {board.title} |")
    print("|---" * (7 + len(positions)) + "|")
    for plan in plans:
        cells = []
        for p in positions:
            cycles = cycles_per_token_estimate(qm, plan, p)
            cells.append(f"{cycles:,} ({cycles / -(-macs_per_token(qm, p) // plan.macs_per_cycle):.2f}×)")
        fit = estimate_model(qm, board, plan, label=plan.shape)
        problems = fit.problems()
        verdict = "yes" if not problems else "no: " + ", ".join(
            what for what, word in (("block RAM", "block-RAM"), ("multipliers", board.dsp_name), ("LUTs", "LUT4s"))
            if any(word in problem for problem in problems))
        print(f"| {plan.shape} | {plan.macs_per_cycle} | {' | '.join(cells)} | "
              f"{latency_floor_cycles(qm, plan, positions[1]):,} | {fit.blocks} of {board.bram_blocks} | "
              f"{fit.dsp_lanes} + ~{fit.other_dsps} of {board.dsps} | {fit.extra_luts:,} | {verdict} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

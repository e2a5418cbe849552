"""Which bundled model fits which board, at which scheme, or how much of its context: the fit check only.

For every board in the parts table (boards/parts.py) and each bundled model, the scheme of best measured quality
that fits (boards/sizing.py's QUALITY_ORDER, with the --rows auto engine, as `hardwire compile --board B` picks
it); when none fits at the model's full context, the longest context (halving from it) at which one does. No
place and route runs: block RAM, multipliers and the LUT floor as boards/parts.py estimates them, in seconds per
board. Writes a Markdown table (docs/boards.md holds its output) and prints it.

    .venv/bin/python benchmarks/board_fit.py                # the three bundled models, every board
    .venv/bin/python benchmarks/board_fit.py --boards tang_nano_20k ulx3s_25f --models small
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT.parent))

from hardwire.boards.parts import PARTS, FitError, choose_plan, estimate_model  # noqa: E402
from hardwire.boards.sizing import QUALITY_ORDER  # noqa: E402
from hardwire.frontend import load  # noqa: E402
from hardwire.quant.quantize import quantize  # noqa: E402
from hardwire.rtl.plan import HardwarePlan  # noqa: E402

MODELS = {"character": ROOT / "models" / "tinyshakespeare.onnx",
          "word-piece": ROOT / "models" / "tinyshakespeare_pieces.onnx",
          "small": ROOT / "models" / "tinyshakespeare_small.onnx"}
MIN_CONTEXT = 8  # the shortest context tried before a board is called too small for the model


def fit_cell(ir, board: str, cache: dict) -> str:
    """'int8: 2 x 16 ..., 150/208 BSRAM', 'int3 at context 64 of 128: ...' or 'no: REASON'. The schemes are tried
    at the model's full context; a shorter context only with the narrowest (int3), and not at all when int3's weight
    ROMs alone outgrow the part's block RAM (no context helps then). A part with fewer LUTs than the smallest decoder
    measured (Part.min_decoder_luts) is refused without the search: no scheme, engine or context gets under it."""
    target = PARTS[board]
    full = ir.config.context

    def quantised(scheme: str, context: int):
        if (scheme, context) not in cache:
            cache[scheme, context] = quantize(ir, scheme, context=context)
        return cache[scheme, context]

    def attempt(qm) -> str | None:
        smallest = estimate_model(qm, target, HardwarePlan(storage="rom", lanes=1), label=qm.scheme)
        if smallest.bits("weights") > target.bram_bits:  # the weight ROMs alone outgrow the part: skip the search
            return None
        try:
            plan, fit, cycles = choose_plan(qm, target, "rom")
        except FitError:
            return None
        return f"{plan.shape}, {cycles:,} cycles/token, {fit.blocks}/{target.bram_blocks} {target.bram_name}"

    if target.min_decoder_luts > target.luts:  # the smallest decoder measured needs more LUTs than the part has
        qm = quantised(QUALITY_ORDER[-1], full)
        smallest = estimate_model(qm, target, HardwarePlan(storage="rom", lanes=1), label="the decoder")
        if smallest.bits("weights") <= target.bram_bits:  # (else the message below names the weights)
            return "no, at any scheme and context: " + smallest.problems()[0]
    for scheme in QUALITY_ORDER:
        found = attempt(quantised(scheme, full))
        if found:
            return f"{scheme}: {found}"
    narrowest = QUALITY_ORDER[-1]
    qm = quantised(narrowest, full)
    smallest = estimate_model(qm, target, HardwarePlan(storage="rom", lanes=1), label=narrowest)
    if smallest.bits("weights") > target.bram_bits:
        return (f"no, at any scheme and context: {narrowest}'s weight ROMs alone are {smallest.bits('weights'):,} bits, "
                f"the {target.title} has {target.bram_bits:,} bits of block RAM")
    context = full // 2
    while context >= MIN_CONTEXT:
        found = attempt(quantised(narrowest, context))
        if found:
            return f"{narrowest} at context {context} of {full}: {found}"
        context //= 2
    problems = smallest.problems()
    return "no: " + (problems[0] if problems else "no engine shape fits")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boards", nargs="*", default=list(PARTS), choices=list(PARTS))
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    args = parser.parse_args(argv)
    rows = []
    for name in args.models:
        start = time.time()
        ir = load(MODELS[name], verify=False)
        cache: dict = {}
        for board in args.boards:
            cell = fit_cell(ir, board, cache)
            rows.append((PARTS[board].title, board, name, cell))
            print(f"{name} on {board}: {cell}", file=sys.stderr, flush=True)
        print(f"({name}: {time.time() - start:.0f} s)", file=sys.stderr, flush=True)
    print("| board | --board | model | best scheme that fits (--rows auto shape, cycles/token, block RAM) |")
    print("|---|---|---|---|")
    for title, board, model, cell in rows:
        print(f"| {title} | `{board}` | {model} | {cell} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

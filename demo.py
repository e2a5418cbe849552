"""`hardwire demo`: the whole path on one model, ending in a summary table.

import + proof → the chip sized for the board (the ULX3S-85F unless --board names another): the
scheme of best measured quality that fits and the `--rows auto` engine shape (boards/sizing.py)
→ Verilog → cocotb + Verilator token-exact simulation of a prompt → summary, with tokens per
second at the clock a routed build of that very design reached (benchmarks/results/routed_builds.json,
with its date), or else estimated at the board's oscillator and labelled so: a few minutes.
With a board (`hardwire demo --board ulx3s`, `make bitstream`) the bitstream follows the
simulation (place and route: 15–35 minutes for the bundled model on 2 cores) and the summary
has the measured Fmax and tokens per second. Each stage prints as it goes; the summary
collects the figures a user judges the chip by.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from .boards.parts import Part
from .quant.qmodel import QModel
from .rtl.plan import HardwarePlan

RESULTS = Path(__file__).resolve().parent / "benchmarks" / "results"
QUALITY = RESULTS / "quality.json"
ROUTED_BUILDS = RESULTS / "routed_builds.json"  # the routed bitstreams whose clocks the demo may quote
ROUTED_BUILDS_NAME = "benchmarks/results/routed_builds.json"  # how the summary names it
ESTIMATE_BOARD = "ulx3s"  # the board the simulation-only demo sizes the chip for and takes its clock from
BITSTREAM_COMMAND = "make bitstream"  # runs `hardwire demo --board ulx3s`


@dataclass(frozen=True)
class DemoOptions:
    model: Path
    prompt: str
    n: int  # tokens generated in the simulation
    quant: str | None  # None (the default): the best measured quality that fits the board (boards/sizing.py)
    lanes: int | None  # None (the default): the --rows auto shape for the board; N: 1 row x N lanes
    weights: str
    board: str | None  # None (the default): stop after the simulation, with an estimated speed
    out: Path


def _quality(model: Path, scheme: str) -> str:
    """The quality benchmark's figures for this scheme, when they were measured on this model."""
    if not QUALITY.exists():
        return "not measured (benchmarks/quality.py)"
    result = json.loads(QUALITY.read_text())
    if result.get("model", "tinyshakespeare.onnx") != model.name:
        return "not measured for this model (benchmarks/quality.py)"
    for row in result["rows"]:
        if row["scheme"].split(" @ ")[0] == scheme:  # "mixed36 @ 4.0": the default budget the demo uses
            return (f"validation loss {row['val_loss']:.4f}, top-1 agreement with float {100 * row['agreement']:.2f}% "
                    f"(benchmarks/quality.py, {result['date']})")
    return "not measured for this scheme (benchmarks/quality.py)"


def routed_build(model: Path, qm: QModel, plan: HardwarePlan, board: str) -> dict | None:
    """The newest routed build with timing met recorded for this board, model file, scheme, context and engine
    shape, or None. Another shape, scheme or model is another circuit, whose clock says nothing about this one;
    a build that missed timing says only that its clock is too fast (routed_builds.json keeps those too)."""
    if not ROUTED_BUILDS.exists():
        return None
    hd = qm.config.head_dim
    want = {"board": board, "model_sha256": hashlib.sha256(model.read_bytes()).hexdigest(), "scheme": qm.scheme,
            "context": qm.context, "storage": plan.storage, "rows": plan.rows, "lanes": plan.lanes,
            "attention_rows": plan.attn_rows(hd), "softmax_lanes": plan.softmax_lanes,
            "epilogue_lanes": plan.epilogue_lanes, "dsp_rows": plan.rows - plan.shift_add_rows}
    builds = [b for b in json.loads(ROUTED_BUILDS.read_text())["builds"]
              if b.get("timing_met") and all(b.get(key) == value for key, value in want.items())]
    return max(reversed(builds), key=lambda b: b["date"], default=None)  # of one date, the one recorded last


def _speed(model: Path, qm: QModel, plan: HardwarePlan, board: Part, cycles_per_token: float) -> str:
    """Tokens per second at the clock of a routed build of this very design, with its date; else an estimate at the
    board's oscillator, labelled so. Both name the shape and where the clock comes from."""
    build = routed_build(model, qm, plan, board.board)
    if build is None:
        return (f"{board.clock_mhz * 1e6 / cycles_per_token:,.0f} (ESTIMATE: the {board.title}'s {board.clock_mhz:g} "
                f"MHz oscillator, the clock its bitstream runs at by default, / simulated cycles per token of "
                f"{plan.shape}, {qm.scheme}; no routed build of this shape and scheme that met timing is recorded "
                f"in {ROUTED_BUILDS_NAME}, so no place and route has checked a clock for it)")
    return (f"{build['clock_mhz'] * 1e6 / cycles_per_token:,.0f} at {build['clock_mhz']:g} MHz, the clock of the routed "
            f"build of {plan.shape}, {qm.scheme} on the {board.title} of {build['date']} (timing met, Fmax "
            f"{build['fmax_mhz']:g} MHz; {ROUTED_BUILDS_NAME}), / simulated cycles per token")


def run_demo(opts: DemoOptions) -> int:
    from .boards.parts import part
    from .boards.sizing import size_for_board
    from .frontend import load
    from .frontend.vocab import encode
    from .quant.quantize import quantize
    from .rtl.build import compile_to
    from .sim.runner import simulate

    steps = 4 if opts.board is None else 5
    times: dict[str, float] = {}
    start = time.time()
    print(f"[1/{steps}] importing {opts.model} and proving it against onnxruntime ...", flush=True)
    ir = load(opts.model)
    print(f"      {ir.config.n_layers} layers × {ir.config.d_model}, {ir.n_params:,} parameters; {ir.proof.summary()}")
    times["import"] = time.time() - start
    if ir.vocab is None:
        raise ValueError("the demo needs a character-level model with a vocabulary (vocab.json beside the model)")
    missing = sorted({c for c in opts.prompt if c not in ir.vocab})
    if missing or not opts.prompt:
        raise ValueError(f"the prompt must be non-empty and use the model's characters; not in the vocabulary: {missing}")
    prompt = encode(opts.prompt, ir.vocab, "prompt")

    start = time.time()
    target = part(opts.board or ESTIMATE_BOARD)  # the chip is sized for this board even when nothing is built
    given = None if opts.lanes is None else HardwarePlan(lanes=opts.lanes, storage=opts.weights)
    if opts.quant is not None and given is not None:  # both given: built as asked, as before
        print(f"[2/{steps}] quantising ({opts.quant}) ...", flush=True)
        qm, plan, scheme_why, shape_why = quantize(ir, opts.quant, progress=True), given, "as given (--quant)", \
            f"as given (--lanes {opts.lanes})"
    else:
        print(f"[2/{steps}] sizing the chip for the {target.title}: "
              f"{'the weight scheme of best measured quality that fits, ' if opts.quant is None else ''}"
              f"{'the --rows auto engine shape' if given is None else f'{given.shape} as given'} ...", flush=True)
        choice, shape = size_for_board(lambda scheme: quantize(ir, scheme, progress=True), target, scheme=opts.quant,
                                       plan=given, storage=opts.weights,
                                       progress=lambda line: print(f"      {line}", flush=True))
        print(f"      {choice.summary()}\n      {shape.summary()}", flush=True)
        qm, plan = choice.qm, shape.plan
        scheme_why = choice.reason() if choice.chosen else "as given (--quant)"
        shape_why = (f"the --rows auto shape for the {target.title}; " if given is None else
                     f"as given (--lanes {opts.lanes}); ") + shape.fit.summary()
    times["quantise"] = time.time() - start

    start = time.time()
    print(f"[3/{steps}] generating Verilog ({plan.shape}, {opts.weights} weights) ...", flush=True)
    report = compile_to(qm, opts.out, rows=plan.rows, lanes=plan.lanes, attention_rows=plan.attention_rows,
                        softmax_lanes=plan.softmax_lanes, dsp_rows=plan.dsp_rows, epilogue_lanes=plan.epilogue_lanes,
                        storage=opts.weights, vocab=ir.vocab)
    times["verilog"] = time.time() - start

    print(f"[4/{steps}] simulating the Verilog with cocotb + Verilator ({len(prompt)} prompt tokens, {opts.n} "
          f"generated) ...", flush=True)
    # the Verilated C++ at -O1 (sim/runner.py's QUICK_BUILD): the board-sized engine of the bundled model, 8 rows x 32
    # lanes in int4, builds in 27 s instead of 219 s at Verilator's -Os and simulates its 38 tokens in 3 s either way
    sim = simulate(opts.out, prompt, opts.n, optimise=False)
    times["verilator build"], times["simulation"] = sim.build_seconds, sim.run_seconds
    (opts.out / "sim.json").write_text(json.dumps({
        "tokens": sim.tokens, "reference_tokens": sim.reference_tokens, "match": sim.match,
        "cycles_per_token": sim.cycles_per_token, "lane_utilisation": sim.lane_utilisation, "cycles": sim.cycles,
        "macs": sim.macs, "lanes": sim.lanes}, indent=1) + "\n")

    fit = None
    if opts.board is not None:
        from .boards.fpga import build_board

        start = time.time()
        target = part(opts.board)
        print(f"[5/{steps}] building the {target.title} bitstream: synthesis, place and route, packing. This is the "
              f"long step (15–35 minutes for the bundled model on a 2-core machine) with progress bars (a line every "
              f"30 s when the output is not a terminal); Ctrl-C stops it", flush=True)
        fit = build_board(opts.out, opts.board)
        times["place and route"] = time.time() - start

    text = opts.prompt + "".join(ir.vocab[t] for t in sim.tokens)
    rows = [("model", f"{opts.model.name}: {ir.n_params:,} parameters"),
            ("quantisation", f"{qm.scheme}, {qm.avg_weight_bits:.2f} bits/weight, {qm.weight_bits:,} code bits: "
                             f"{scheme_why}"),
            ("quality", _quality(opts.model, qm.scheme)),
            ("engine", f"{plan.shape}, {plan.macs_per_cycle} MACs/cycle: {shape_why}"),
            ("simulation", f"{'PASS' if sim.match else 'FAIL'}: {len(sim.tokens)} tokens "
                           f"{'equal' if sim.match else 'differ from'} the integer reference"),
            ("cycles per token", f"{sim.cycles_per_token:,.0f} (schedule estimate at position {report.position}: "
                                 f"{report.cycles_per_token_estimate:,})"),
            ("MAC-lane utilisation", f"{100 * sim.lane_utilisation:.1f}% of {plan.macs_per_cycle} MAC lanes")]
    if fit is None:
        rows.append(("tokens per second", _speed(opts.model, qm, plan, target, sim.cycles_per_token)))
    else:
        timing = "met" if fit["timing_met"] else "NOT MET: the bitstream may misbehave"
        rows += [("FPGA", f"{opts.board}: {fit['luts']:,} LUTs, {fit['ffs']:,} FFs, {fit['brams']} BRAM, "
                          f"{fit['dsps']} DSP"),
                 ("clock", f"{fit['clock_mhz']:g} MHz; Fmax {fit['fmax_mhz']:.1f} MHz, timing {timing}"),
                 ("tokens per second", f"{fit['tok_s']:,.0f} at the {fit['clock_mhz']:g} MHz clock the bitstream is "
                                       f"built with ({fit['tok_s_at_fmax']:,.0f} if clocked at Fmax)"),
                 ("bitstream", fit["bitstream"])]
    rows.append(("stage times", ", ".join(f"{k} {v:.0f} s" for k, v in times.items())))
    width = max(len(k) for k, _ in rows)
    print("\nsummary")
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    print(f"\ngenerated text:\n{text}")
    if fit is None:
        print(f"\nThe demo stops here: the FPGA bitstream is a separate, long step (place and route, 15–35 minutes for "
              f"the bundled model on a 2-core machine). Run `{BITSTREAM_COMMAND}` (or `hardwire demo --board "
              f"{ESTIMATE_BOARD}`) for it and the measured speed.")
    return 0 if sim.match else 1

"""`hardwire demo`: the whole path on one model, ending in a summary table.

import + proof → quantise → Verilog → cocotb + Verilator token-exact simulation of a
prompt → summary, with tokens per second estimated at the board's clock: a few minutes.
With a board (`hardwire demo --board ulx3s`, `make bitstream`) the bitstream follows the
simulation (place and route: 45–70 minutes for the bundled model on 2 cores) and the summary
has the measured Fmax and tokens per second. Each stage prints as it goes; the summary
collects the figures a user judges the chip by.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

QUALITY = Path(__file__).resolve().parent / "benchmarks" / "results" / "quality.json"
ESTIMATE_BOARD = "ulx3s"  # the board whose clock the simulation-only demo estimates tokens per second at
BITSTREAM_COMMAND = "make bitstream"  # runs `hardwire demo --board ulx3s`


@dataclass(frozen=True)
class DemoOptions:
    model: Path
    prompt: str
    n: int  # tokens generated in the simulation
    quant: str
    lanes: int
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


def run_demo(opts: DemoOptions) -> int:
    from .boards.parts import part
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
    print(f"[2/{steps}] quantising ({opts.quant}) ...", flush=True)
    qm = quantize(ir, opts.quant)
    times["quantise"] = time.time() - start

    start = time.time()
    print(f"[3/{steps}] generating Verilog ({opts.lanes} lanes, {opts.weights} weights) ...", flush=True)
    report = compile_to(qm, opts.out, lanes=opts.lanes, storage=opts.weights, vocab=ir.vocab)
    times["verilog"] = time.time() - start

    print(f"[4/{steps}] simulating the Verilog with cocotb + Verilator ({len(prompt)} prompt tokens, {opts.n} "
          f"generated) ...", flush=True)
    sim = simulate(opts.out, prompt, opts.n)
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
              f"long step (45–70 minutes for the bundled model on a 2-core machine); a progress line every 30 s, "
              f"Ctrl-C stops it", flush=True)
        fit = build_board(opts.out, opts.board)
        times["place and route"] = time.time() - start

    text = opts.prompt + "".join(ir.vocab[t] for t in sim.tokens)
    rows = [("model", f"{opts.model.name}: {ir.n_params:,} parameters"),
            ("quantisation", f"{opts.quant}, {qm.avg_weight_bits:.2f} bits/weight, {qm.weight_bits:,} code bits"),
            ("quality", _quality(opts.model, opts.quant)),
            ("simulation", f"{'PASS' if sim.match else 'FAIL'}: {len(sim.tokens)} tokens "
                           f"{'equal' if sim.match else 'differ from'} the integer reference"),
            ("cycles per token", f"{sim.cycles_per_token:,.0f} (schedule estimate at position {report.position}: "
                                 f"{report.cycles_per_token_estimate:,})"),
            ("MAC-lane utilisation", f"{100 * sim.lane_utilisation:.1f}% of {opts.lanes} lanes")]
    if fit is None:
        board = part(ESTIMATE_BOARD)
        rows.append(("tokens per second", f"{board.clock_mhz * 1e6 / sim.cycles_per_token:,.0f} (ESTIMATE: the "
                     f"{board.title}'s {board.clock_mhz:g} MHz oscillator, the clock its bitstream runs at by default, "
                     f"/ simulated cycles per token; no place and route has checked that clock yet)"))
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
        print(f"\nThe demo stops here: the FPGA bitstream is a separate, long step (place and route, 45–70 minutes for "
              f"the bundled model on a 2-core machine). Run `{BITSTREAM_COMMAND}` (or `hardwire demo --board "
              f"{ESTIMATE_BOARD}`) for it and the measured speed.")
    return 0 if sim.match else 1

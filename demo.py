"""`hardwire demo`: the whole path on one model, ending in a summary table.

import + proof → quantise → Verilog → cocotb + Verilator token-exact simulation of a
prompt → bitstream for a board (place and route) → summary. Each stage prints as it goes;
the summary collects the figures a user judges the chip by.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

QUALITY = Path(__file__).resolve().parent / "benchmarks" / "results" / "quality.json"


@dataclass(frozen=True)
class DemoOptions:
    model: Path
    prompt: str
    n: int  # tokens generated in the simulation
    quant: str
    lanes: int
    weights: str
    board: str | None  # None: stop after simulation
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
    from .frontend import load
    from .quant.quantize import quantize
    from .rtl.build import compile_to
    from .sim.runner import simulate

    times: dict[str, float] = {}
    start = time.time()
    print(f"[1/5] importing {opts.model} and proving it against onnxruntime ...", flush=True)
    ir = load(opts.model)
    print(f"      {ir.config.n_layers} layers × {ir.config.d_model}, {ir.n_params:,} parameters; {ir.proof.summary()}")
    times["import"] = time.time() - start
    if ir.vocab is None:
        raise ValueError("the demo needs a character-level model with a vocabulary (vocab.json beside the model)")
    missing = sorted({c for c in opts.prompt if c not in ir.vocab})
    if missing or not opts.prompt:
        raise ValueError(f"the prompt must be non-empty and use the model's characters; not in the vocabulary: {missing}")
    prompt = [ir.vocab.index(c) for c in opts.prompt]

    start = time.time()
    print(f"[2/5] quantising ({opts.quant}) ...", flush=True)
    qm = quantize(ir, opts.quant)
    times["quantise"] = time.time() - start

    start = time.time()
    print(f"[3/5] generating Verilog ({opts.lanes} lanes, {opts.weights} weights) ...", flush=True)
    report = compile_to(qm, opts.out, lanes=opts.lanes, storage=opts.weights, vocab=ir.vocab)
    times["verilog"] = time.time() - start

    print(f"[4/5] simulating the Verilog with cocotb + Verilator ({len(prompt)} prompt tokens, {opts.n} generated) ...",
          flush=True)
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
        print(f"[5/5] building the {opts.board} bitstream (yosys, nextpnr; several minutes) ...", flush=True)
        fit = build_board(opts.out, opts.board)
        times["place and route"] = time.time() - start
    else:
        print("[5/5] no board: skipping the bitstream")

    text = opts.prompt + "".join(ir.vocab[t] for t in sim.tokens)
    rows = [("model", f"{opts.model.name}: {ir.n_params:,} parameters"),
            ("quantisation", f"{opts.quant}, {qm.avg_weight_bits:.2f} bits/weight, {qm.weight_bits:,} code bits"),
            ("quality", _quality(opts.model, opts.quant)),
            ("simulation", f"{'PASS' if sim.match else 'FAIL'}: {len(sim.tokens)} tokens "
                           f"{'equal' if sim.match else 'differ from'} the integer reference"),
            ("cycles per token", f"{sim.cycles_per_token:,.0f} (schedule estimate at position {report.position}: "
                                 f"{report.cycles_per_token_estimate:,})"),
            ("MAC-lane utilisation", f"{100 * sim.lane_utilisation:.1f}% of {opts.lanes} lanes")]
    if fit is not None:
        rows += [("FPGA", f"{opts.board}: {fit['luts']:,} LUTs, {fit['ffs']:,} FFs, {fit['brams']} BRAM, "
                          f"{fit['dsps']} DSP"),
                 ("Fmax", f"{fit['fmax_mhz']:.1f} MHz"),
                 ("tokens per second", f"{fit['fmax_mhz'] * 1e6 / sim.cycles_per_token:,.0f} (Fmax / cycles per token)")]
    rows.append(("stage times", ", ".join(f"{k} {v:.0f} s" for k, v in times.items())))
    width = max(len(k) for k, _ in rows)
    print("\nsummary")
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    print(f"\ngenerated text:\n{text}")
    return 0 if sim.match else 1

"""Speed and area of the chip against CPU decoding of the same model: a sweep of engine shapes.

    .venv/bin/python benchmarks/speed.py [--model M.onnx] [--configs 1x16,4x16/2,8x16] [--quant int8] [-n 16]
                                         [--board ulx3s | --no-board] [--board-configs 4x16/2] [--no-cpu]
                                         [--scheduler tcp://host:8786 | --workers N]

A configuration is ROWSxLANES[/ATTENTION_ROWS] (rtl/plan.py's HardwarePlan). For each: compile
(time per stage), simulate the Verilog under cocotb + Verilator (cycles per token, MAC
utilisation, simulated tokens/s, every token checked against the integer reference), the
board's fit estimate, and with a board, place and route it (LUTs, FFs, BRAM, DSP, Fmax) to get
tokens/s at the clock the bitstream is built with (and at Fmax). Then the CPU baseline
(benchmarks/cpu_baseline.py) on the same model, and the ratio chip / CPU. Also the share of
the block-RAM bandwidth bound (weight bits per token / (BRAMs on the part × port width):
the fewest cycles any ROM design could take on that part) and bits and BRAM per parameter.
Prints a table, writes benchmarks/results/speed.json and, with matplotlib, speed.png.

The points run as Dask tasks (benchmarks/fan_out.py): on a local cluster of one worker process per
core by default, or on the cluster whose scheduler `--scheduler` names.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT.parent))  # run from a checkout: the root is the hardwire package

from fan_out import fan_out  # noqa: E402

from hardwire.cli import BUNDLED_MODEL  # noqa: E402
from hardwire.frontend import load  # noqa: E402
from hardwire.quant.quantize import quantize  # noqa: E402
from hardwire.rtl.build import compile_to  # noqa: E402
from hardwire.rtl.plan import HardwarePlan, cycles_per_token_estimate, latency_floor_cycles  # noqa: E402
from hardwire.sim.runner import simulate  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
# Block RAM of the parts, for the bandwidth bound: count and the widest read port in bits
BRAM_PORTS = {"ulx3s": (208, 36), "icebreaker": (30, 16)}  # ECP5-85F DP16KD; iCE40UP5K EBR


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def parse_config(text: str) -> HardwarePlan:
    """ROWSxLANES[/ATTENTION_ROWS][:sSOFTMAX_LANES][:dDSP_ROWS][:eEPILOGUE_LANES], e.g. 4x16/2 or 8x16/4:s4:d6:e2."""
    shape, *options = text.split(":")
    shape, _, attention = shape.partition("/")
    rows, _, lanes = shape.partition("x")
    extra = {"s": 1, "d": None, "e": 1} | {option[0]: int(option[1:]) for option in options}
    return HardwarePlan(rows=int(rows), lanes=int(lanes), attention_rows=int(attention) if attention else None,
                        softmax_lanes=extra["s"], dsp_rows=extra["d"], epilogue_lanes=extra["e"])


def label(plan: HardwarePlan) -> str:
    return (f"{plan.rows}x{plan.lanes}" + (f"/{plan.attention_rows}" if plan.attention_rows is not None else "") +
            (f":s{plan.softmax_lanes}" if plan.softmax_lanes > 1 else "") +
            (f":d{plan.dsp_rows}" if plan.dsp_rows is not None else "") +
            (f":e{plan.epilogue_lanes}" if plan.epilogue_lanes > 1 else ""))


def sweep_point(ir: object, qm: object, plan: HardwarePlan, *, args: argparse.Namespace, log: object) -> dict:
    """One engine shape: compile, simulate, fit estimate, and (with a board) place and route."""
    name = label(plan)
    build = args.build_root / name.replace("/", "a")
    before = _digest(build / "decoder.v")
    start = time.time()
    report = compile_to(qm, build, rows=plan.rows, lanes=plan.lanes, attention_rows=plan.attention_rows,
                        dsp_rows=plan.dsp_rows, softmax_lanes=plan.softmax_lanes, epilogue_lanes=plan.epilogue_lanes,
                        storage=args.weights, vocab=ir.vocab,
                        progress=False)
    stages = {"generate_verilog_s": round(time.time() - start, 1)}
    log(f"  {name}: Verilog in {stages['generate_verilog_s']} s; simulating {args.tokens} tokens ...")
    prompt = [ir.vocab.index(c) for c in args.prompt]
    sim = simulate(build, prompt, args.tokens, progress=False)
    if not sim.match:
        raise SystemExit(f"{name}: the Verilog decoded {sim.tokens}, the reference {sim.reference_tokens}")
    stages |= {"verilator_build_s": sim.build_seconds, "simulation_s": sim.run_seconds}
    fed = len(sim.cycles)
    plan = HardwarePlan(rows=plan.rows, lanes=plan.lanes, storage=args.weights, attention_rows=plan.attention_rows,
                        softmax_lanes=plan.softmax_lanes, dsp_rows=plan.dsp_rows, epilogue_lanes=plan.epilogue_lanes)
    estimates = [cycles_per_token_estimate(qm, plan, p) for p in range(fed)]
    at64 = min(64, qm.context - 1)
    row = {"config": name, "rows": plan.rows, "lanes": plan.lanes, "macs_per_cycle": plan.macs_per_cycle,
           "cycles_per_token": sim.cycles_per_token, "lane_utilisation": sim.lane_utilisation,
           "mac_bound_cycles": sum(sim.macs[-args.tokens:]) / args.tokens / plan.macs_per_cycle,
           "estimate_equals_simulation": estimates == sim.cycles,
           "cycles_at_64": cycles_per_token_estimate(qm, plan, at64),
           "latency_floor_cycles": latency_floor_cycles(qm, plan, at64), "bram_bound_cycles": report.bram_bound_cycles,
           "simulated_tokens_per_s": fed / sim.run_seconds,
           "stages": stages, "weight_bits": report.weight_bits, "params": report.params,
           "positions": list(range(fed)), "cycles": sim.cycles, "macs": sim.macs}
    placed = build / f"build_{args.board}.json"
    fit = None
    if args.board:
        from hardwire.boards.parts import estimate  # the board flow's fit check (issue 6)

        needs = estimate(build, args.board)
        row |= {"bram_estimate": needs.blocks, "bram_available": needs.part.bram_blocks}
        if needs.problems():
            row["does_not_fit"] = "; ".join(needs.problems())
            log(f"  {name}: does not fit the {needs.part.title}: {needs.summary()}")
    if "does_not_fit" in row:
        pass
    elif args.board and before == _digest(build / "decoder.v") and placed.exists():
        # compiles are byte-identical, so an earlier place and route of this Verilog still holds
        log(f"  {name}: reusing {placed} (same Verilog)")
        fit = json.loads(placed.read_text())
        stages["place_and_route_s"] = fit.get("seconds")
    elif args.board and (args.board_configs is None or name in args.board_configs):
        from hardwire.boards.fpga import build_board  # the board flow (issue 6)

        log(f"  {name}: place and route for {args.board} (tens of minutes for the bundled model) ...")
        start = time.time()
        fit = build_board(build, args.board)
        stages["place_and_route_s"] = round(time.time() - start, 1)
    if fit is not None:
        count, width = BRAM_PORTS[args.board]
        bound = report.weight_bits / (count * width)
        row |= {"luts": fit["luts"], "ffs": fit["ffs"], "brams": fit["brams"], "dsps": fit["dsps"],
                "fmax_mhz": fit["fmax_mhz"], "clock_mhz": fit["clock_mhz"], "timing_met": fit["timing_met"],
                "tokens_per_s": fit["clock_mhz"] * 1e6 / sim.cycles_per_token,
                "tokens_per_s_at_fmax": fit["fmax_mhz"] * 1e6 / sim.cycles_per_token,
                "bram_bound_cycles": bound, "bram_bound_share": bound / sim.cycles_per_token,
                "brams_per_param": fit["brams"] / report.params}
    row["bits_per_param"] = report.weight_bits / report.params
    return row


def table(result: dict) -> str:
    lines = [f"hardwire speed, {result['model']} ({result['quant']}, {result['weights']}), {result['date']}, "
             f"{result['machine']}", "",
             "| rows x lanes[/attention] | MACs/cycle | cycles/token | estimate exact | vs MAC bound | MAC utilisation "
             "| cycles at 64 | latency floor | LUTs | FFs | BRAM | DSP | Fmax MHz | clock MHz | tokens/s | sim tokens/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        board = (f"{r['luts']:,} | {r['ffs']:,} | {r['brams']} | {r['dsps']} | {r['fmax_mhz']:.1f} | "
                 f"{r['clock_mhz']:.1f} | {r['tokens_per_s']:,.0f}") if "luts" in r else (
                 f"does not fit: {r['bram_estimate']} of {r['bram_available']} BRAM | | | | | |" if "does_not_fit" in r
                 else (f"(fit estimate {r['bram_estimate']} BRAM) | — | — | — | — | — | —" if "bram_estimate" in r
                       else "— | — | — | — | — | — | —"))
        lines.append(f"| {r['config']} | {r['macs_per_cycle']} | {r['cycles_per_token']:,.0f} | "
                     f"{'yes' if r['estimate_equals_simulation'] else 'NO'} | "
                     f"{r['cycles_per_token'] / r['mac_bound_cycles']:.2f}× | {100 * r['lane_utilisation']:.1f}% | "
                     f"{r['cycles_at_64']:,} | {r['latency_floor_cycles']:,} | {board} | "
                     f"{r['simulated_tokens_per_s']:.1f} |")
    lines += ["", "| config | generate Verilog s | Verilator build s | simulation s | place and route s |",
              "|---|---|---|---|---|"]
    for r in result["rows"]:
        s = r["stages"]
        lines.append(f"| {r['config']} | {s['generate_verilog_s']} | {s['verilator_build_s']} | {s['simulation_s']} | "
                     f"{s.get('place_and_route_s', '—')} |")
    lines.append(f"\nimport {result['stages']['import_s']} s, quantise {result['stages']['quantise_s']} s; "
                 f"{result['rows'][0]['bits_per_param']:.2f} weight bits per parameter; block-RAM bound "
                 f"{result['rows'][0]['bram_bound_cycles']:,} cycles/token")
    cpu = result.get("cpu")
    if cpu:
        lines.append("\n| CPU decoder (batch 1, KV cache) | tokens/s |\n|---|---|")
        lines += [f"| {r['name']} | {r['tokens_per_s']:,.0f} |" for r in cpu["rows"] if r.get("tokens_per_s")]
        best = max((r for r in result["rows"] if "tokens_per_s" in r), key=lambda r: r["tokens_per_s"], default=None)
        if best:
            lines.append(f"\nchip at {best['config']}: {best['tokens_per_s']:,.0f} tokens/s at {best['clock_mhz']:.1f} MHz "
                         f"= {best['tokens_per_s'] / result['cpu_float_tokens_per_s']:.2f}× the fastest CPU float decode "
                         f"({result['cpu_float_tokens_per_s']:,.0f} tokens/s: {result.get('cpu_float_engine', '?')})")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> bool:
    """Tokens/s (cycles at a stated clock) and LUTs against MACs per cycle, and cycles per position."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = result["rows"]
    fig, (left, right, third) = plt.subplots(1, 3, figsize=(15, 4))
    macs = [r["macs_per_cycle"] for r in rows]
    clock = result.get("plot_clock_mhz", 50.0)
    left.plot(macs, [clock * 1e6 / r["cycles_per_token"] for r in rows], "o", label=f"chip at {clock:.0f} MHz (simulated cycles)")
    placed = [r for r in rows if "tokens_per_s" in r]
    if placed:
        left.plot([r["macs_per_cycle"] for r in placed], [r["tokens_per_s"] for r in placed], "s",
                  label="chip as built (bitstream clock)")
    if result.get("cpu_float_tokens_per_s"):
        left.axhline(result["cpu_float_tokens_per_s"], color="grey", ls="--", label="CPU float, KV cache")
        left.axhline(15 * result["cpu_float_tokens_per_s"], color="red", ls=":", label="15x CPU")
    left.set(xscale="log", yscale="log", xlabel="MACs per cycle", ylabel="tokens/s", title="tokens per second")
    left.legend(fontsize=7)
    if placed:
        right.plot([r["macs_per_cycle"] for r in placed], [r["luts"] for r in placed], "o")
    right.set(xscale="log", xlabel="MACs per cycle", ylabel="LUT4", title=f"LUTs ({result['board']}, placed configs)")
    for r in rows:
        third.plot(r["positions"], r["cycles"], label=r["config"])
    third.set(xlabel="position", ylabel="cycles per token", title="cycles per token by position", yscale="log")
    third.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=BUNDLED_MODEL)
    parser.add_argument("--configs", default="1x16,2x16,4x16/2,4x32/1,8x16",
                        help="comma-separated engine shapes ROWSxLANES[/ATTENTION_ROWS]")
    parser.add_argument("--quant", default="mixed36", choices=("int8", "mixed36", "mxfp4", "int4", "int3"))
    parser.add_argument("--weights", default="rom", choices=("rom", "logic"))
    parser.add_argument("-n", "--tokens", type=int, default=64, help="tokens generated in each simulation")
    parser.add_argument("--prompt", default="ROMEO:")
    parser.add_argument("--board", default="ulx3s", choices=tuple(BRAM_PORTS))
    parser.add_argument("--no-board", dest="board", action="store_const", const=None, help="skip place and route")
    parser.add_argument("--board-configs", type=lambda v: set(v.split(",")), default=None,
                        help="place and route only these configs (default: all that fit; the bundled model takes "
                             "an hour each); an earlier result for identical Verilog is always reused")
    parser.add_argument("--no-cpu", action="store_true", help="skip the CPU baseline")
    parser.add_argument("--build-root", type=Path, default=ROOT / "build" / "speed")
    parser.add_argument("--out", type=Path, default=RESULTS / "speed.json")
    parser.add_argument("--scheduler", default=None,
                        help="a Dask scheduler's address (tcp://host:8786) to run the points on; default: a local "
                             "cluster of one single-threaded worker process per core")
    parser.add_argument("--workers", type=int, default=None, help="worker processes of the local cluster")
    args = parser.parse_args()

    def log(s: str) -> None:
        print(s, flush=True)

    start = time.time()
    ir = load(args.model)
    imported = time.time()
    qm = quantize(ir, args.quant)
    stages = {"import_s": round(imported - start, 1), "quantise_s": round(time.time() - imported, 1)}
    log(f"imported in {stages['import_s']} s, quantised ({args.quant}) in {stages['quantise_s']} s")
    plans = [parse_config(c) for c in args.configs.split(",")]
    rows = fan_out(partial(sweep_point, ir, qm, args=args, log=print), plans, scheduler=args.scheduler,
                   workers=args.workers, log=log)
    rows = sorted(rows, key=lambda r: (r["macs_per_cycle"], r["config"]))
    result = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "model": str(args.model.name),
              "machine": f"{platform.processor() or platform.machine()}, {__import__('os').cpu_count()} cores",
              "quant": args.quant, "weights": args.weights, "board": args.board, "tokens": args.tokens,
              "stages": stages, "rows": rows}
    if not args.no_cpu:
        from cpu_baseline import measure_cpu

        log("CPU baseline ...")
        cpu = measure_cpu(args.model, 128, threads=1, log=log)
        result["cpu"] = cpu
        result["cpu_float_tokens_per_s"] = cpu["fastest_float"]["tokens_per_s"]  # llama.cpp F32 when installed
        result["cpu_float_engine"] = cpu["fastest_float"]["name"]
    print("\n" + table(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    if plot(result, args.out.with_suffix(".png")):
        print(f"wrote {args.out.with_suffix('.png')}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

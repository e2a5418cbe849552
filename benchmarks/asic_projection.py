"""Fit and check the ASIC projection (boards/asic_projection.py), then project real model shapes.

    python benchmarks/asic_projection.py --measure   # compile + synthesise the small builds to sky130hd (minutes each)
    python benchmarks/asic_projection.py             # fit, held-out errors, projection table (seconds)

`--measure` compiles each small random Llama-shaped model of POINTS (tests/random_ir.py, one layer, --weights rom),
synthesises it with `build_asic` (the code of `hardwire build DIR --target asic`) and stores what the synthesis
measured in benchmarks/results/asic_blocks.json, with the date and the command. The points marked "fit" set the
coefficients of the cost model; the "held_out" ones are predicted by that fit and compared with their synthesis.
Without --measure the script reads that file, refits, prints the fit, the held-out errors and the projection
table of the llama2.c 15M, SmolLM 135M, Llama 3.2 1B and Llama 3.1 8B shapes at several engine widths, and writes
benchmarks/results/asic_projection.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # random_ir: the tests' small model maker

from hardwire.boards.asic_projection import (  # noqa: E402
    BLOCKS_FILE,
    FEATURES,
    HC1,
    buffered_timing,
    format_table,
    load_fit,
    measured_point,
    predict_build,
    project_model,
    reference_shapes,
    widths_for,
)

RESULT = ROOT / "benchmarks" / "results" / "asic_projection.json"
# beyond the RTL's 64 rows: how wide the engine must be to reach the HC1's tokens/s (labelled "(>RTL)")
WIDE_8B = ((1024, 32), (8192, 32), (65536, 32))

# Small builds: vocabulary 16, context 8, ffn 2 x d, --weights rom, one layer and two heads (one KV head) unless
# the point says; shapes that vary the MAC lanes (rows x lanes), the code width (int8, int4), the epilogue and
# softmax lanes, d_model, and (held out only) the layers and heads.
POINTS = [
    {"name": "d8-int8-1x1", "role": "fit", "d": 8, "scheme": "int8", "rows": 1, "lanes": 1},
    {"name": "d16-int8-2x4", "role": "fit", "d": 16, "scheme": "int8", "rows": 2, "lanes": 4},
    {"name": "d16-int4-4x8-e2s2", "role": "fit", "d": 16, "scheme": "int4", "rows": 4, "lanes": 8,
     "epilogue_lanes": 2, "softmax_lanes": 2},
    {"name": "d16-int8-8x2-e2", "role": "fit", "d": 16, "scheme": "int8", "rows": 8, "lanes": 2, "epilogue_lanes": 2},
    {"name": "d32-int8-4x16-e4s4", "role": "fit", "d": 32, "scheme": "int8", "rows": 4, "lanes": 16,
     "epilogue_lanes": 4, "softmax_lanes": 4},
    {"name": "d32-int4-8x8-e2s2", "role": "fit", "d": 32, "scheme": "int4", "rows": 8, "lanes": 8,
     "epilogue_lanes": 2, "softmax_lanes": 2},
    {"name": "d16-int8-1x8-s4", "role": "fit", "d": 16, "scheme": "int8", "rows": 1, "lanes": 8, "softmax_lanes": 4},
    {"name": "d32-int4-2x8-e2", "role": "fit", "d": 32, "scheme": "int4", "rows": 2, "lanes": 8, "epilogue_lanes": 2},
    # held out: never in the fit
    {"name": "d8-int4-2x2", "role": "held_out", "d": 8, "scheme": "int4", "rows": 2, "lanes": 2},
    {"name": "d16-int8-4x4-e4s4", "role": "held_out", "d": 16, "scheme": "int8", "rows": 4, "lanes": 4,
     "epilogue_lanes": 4, "softmax_lanes": 4},
    {"name": "d32-int4-2x16-e2s8", "role": "held_out", "d": 32, "scheme": "int4", "rows": 2, "lanes": 16,
     "epilogue_lanes": 2, "softmax_lanes": 8},
    # held out, more layers and heads than any fit point: the logic should not grow with layers
    {"name": "d16-L2-int8-2x4", "role": "held_out", "d": 16, "layers": 2, "scheme": "int8", "rows": 2, "lanes": 4},
    {"name": "d64-L2-h4-int4-4x16-e4s4", "role": "held_out", "d": 64, "layers": 2, "heads": 4, "kv_heads": 2,
     "scheme": "int4", "rows": 4, "lanes": 16, "epilogue_lanes": 4, "softmax_lanes": 4},
]


def measure(names: list[str] | None, work: Path, retime: bool = False) -> None:
    """Compile and synthesise each point (or with `retime`, reuse the synthesis already in its folder), time its
    netlist with the wide nets buffered, and store the point."""
    from random_ir import random_ir

    from hardwire.boards.asic import build_asic
    from hardwire.quant.quantize import quantize
    from hardwire.rtl.build import compile_to

    stored = json.loads(BLOCKS_FILE.read_text()) if BLOCKS_FILE.exists() else {"points": []}
    by_name = {p["name"]: p for p in stored["points"]}
    for spec in POINTS:
        if names and spec["name"] not in names:
            continue
        d = spec["d"]
        qm = quantize(random_ir(vocab=16, d=d, layers=spec.get("layers", 1), heads=spec.get("heads", 2),
                                kv_heads=spec.get("kv_heads", 1), ffn=2 * d, context=8), spec["scheme"], context=8)
        folder = work / spec["name"]
        old = by_name.get(spec["name"])
        if retime and old is not None and (folder / "build_asic.json").exists():
            result = json.loads((folder / "build_asic.json").read_text())
            point = measured_point(spec, qm, result, buffered_timing(folder))
            point.update({k: old[k] for k in ("date", "command", "synthesis_seconds")})
            point["retimed"] = f"{datetime.date.today().isoformat()}: python benchmarks/asic_projection.py --retime"
        else:
            compile_to(qm, folder, lanes=spec["lanes"], rows=spec["rows"], storage="rom",
                       epilogue_lanes=spec.get("epilogue_lanes", 1), softmax_lanes=spec.get("softmax_lanes", 1),
                       progress=False)
            start = time.time()
            result = build_asic(folder, progress=False)
            seconds = round(time.time() - start, 1)
            point = measured_point(spec, qm, result, buffered_timing(folder))
            point["date"] = datetime.date.today().isoformat()
            point["command"] = f"python benchmarks/asic_projection.py --measure --only {spec['name']}"
            point["synthesis_seconds"] = seconds
        by_name[spec["name"]] = point
        print(f"{spec['name']}: logic {result['logic_area_um2']:,.0f} um2, {result['critical_path_ns']} ns "
              f"({result['critical_path_endpoint']}), {point['synthesis_seconds']:.0f} s", flush=True)
        order = [p["name"] for p in POINTS]
        stored["points"] = sorted(by_name.values(), key=lambda p: order.index(p["name"]) if p["name"] in order else 99)
        stored["library"], stored["corner"] = result["library"], result["corner"]
        BLOCKS_FILE.write_text(json.dumps(stored, indent=1) + "\n")


def what_it_takes(result: dict) -> None:
    """Where the 8B's cycles go at its widest engine, and the ceiling the schedule's fixed latencies set."""
    from collections import Counter

    from hardwire.boards.asic_projection import default_plan, standin_qmodel
    from hardwire.rtl.plan import schedule

    widest = result["projections"][-1]
    cfg = reference_shapes()["Llama 3.1 8B"]
    e = widest["engine"]
    qm = standin_qmodel(cfg, widest["scheme"], widest["context"])
    by_kind = Counter()
    for phase in schedule(qm, default_plan(e["rows"], e["lanes"], cfg.head_dim), widest["position"]):
        by_kind[phase.kind] += phase.cycles
    floor = widest["schedule"]["latency_floor_cycles"]
    clock = widest["scaled"]["clock_mhz"]
    print(f"Llama 3.1 8B at {e['rows']} x {e['lanes']} (projected): {widest['schedule']['cycles_per_token']:,} cycles a "
          "token, by phase: " + ", ".join(f"{k} {v:,}" for k, v in by_kind.most_common()))
    print(f"  the schedule's latency floor (unlimited MACs): {floor:,} cycles a token = {clock * 1e6 / floor:,.0f} "
          f"tokens/s at the scaled {clock:.0f} MHz; {HC1['tokens_per_s']:,} tokens/s at this floor needs "
          f"{HC1['tokens_per_s'] * floor / 1e6:,.0f} MHz")


def report() -> int:
    points = json.loads(BLOCKS_FILE.read_text())["points"]
    model_fit, fo4 = load_fit()
    print(f"fit points and held-out builds (measured: sky130hd tt_025C_1v80 synthesis, {BLOCKS_FILE.name}):")
    print(f"{'build':<26}{'role':>9}{'logic um2':>11}{'+buffers':>10}{'path ns':>9}{'buffered':>10}"
          f"{'proj. um2':>11}{'err':>7}{'proj. ns':>10}{'err':>7}{'area err':>9}")
    checks = []
    for p in points:
        c = predict_build(p, model_fit)
        checks.append(c)
        m = p["measured"]
        print(f"{p['name']:<26}{p['role']:>9}{m['logic_area_um2']:>11,.0f}{m['fanout_buffer_area_um2']:>10,.0f}"
              f"{m['critical_path_ns']:>9.2f}{m['buffered_path_ns']:>10.2f}{c['logic_area_um2']['projected']:>11,.0f}"
              f"{100 * c['errors']['logic_area']:>6.1f}%{c['path_ns']['projected']:>10.2f}"
              f"{100 * c['errors']['path']:>6.1f}%{100 * c['errors']['area']:>8.1f}%")
    held = [c for c in checks if c["role"] == "held_out"]
    worst = {k: max(abs(c["errors"][k]) for c in held) for k in ("logic_area", "area", "path", "clock")}
    print("held-out worst errors: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in worst.items()))
    print("coefficients (fitted, um2 / transistors): " + ", ".join(
        f"{n} {a:,.0f} / {t:,.0f}" for n, a, t in zip(FEATURES, model_fit.area, model_fit.transistors, strict=True)))
    print(f"path (fitted): {model_fit.path_ns[0]:.2f} + {model_fit.path_ns[1]:.3f} x log2(lanes x code bits) ns; "
          f"sky130 FO4 {fo4 * 1000:.1f} ps (liberty)")
    tables = {}
    for name, cfg in reference_shapes().items():
        for scheme in (("int4", "mixed36") if name == "Llama 3.1 8B" else ("int4",)):
            widths = widths_for(cfg, scheme, None, None)
            if name == "Llama 3.1 8B":
                widths += [w for w in WIDE_8B if w not in widths]
            result = project_model(cfg, scheme, widths, model_fit, fo4)
            tables[f"{name} {scheme}"] = result
            print()
            print(format_table(f"{name}", result))
    print()
    what_it_takes(tables["Llama 3.1 8B int4"])
    print()
    print(f"beside the 8B rows, {HC1['name']} ({HC1['label']}): {HC1['node']}, {HC1['area_mm2']} mm2, "
          f"~{HC1['transistors'] / 1e9:.0f} billion transistors, ~{HC1['transistors_per_parameter']} transistors a "
          f"parameter, ~{HC1['tokens_per_s']:,} tokens/s per user")
    RESULT.write_text(json.dumps({
        "date": datetime.date.today().isoformat(), "command": "python benchmarks/asic_projection.py",
        "checks": checks, "held_out_worst_errors": worst, "projections": tables, "hc1": HC1}, indent=1) + "\n")
    print(f"wrote {RESULT.relative_to(ROOT)}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", action="store_true", help="compile and synthesise the small builds first")
    parser.add_argument("--retime", action="store_true",
                        help="re-time the points already synthesised in --work (their netlists) and store them again")
    parser.add_argument("--only", nargs="*", default=None, help="with --measure: only these points")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "asic_fit", help="build folders of --measure")
    args = parser.parse_args()
    if args.measure or args.retime:
        measure(args.only, args.work, retime=args.retime)
        return 0
    return report()


if __name__ == "__main__":
    sys.exit(main())

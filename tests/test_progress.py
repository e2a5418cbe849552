"""Progress bars: the tools' logs read into numbers, the plain lines of a CI log, the rich bar of a terminal."""

from __future__ import annotations

import io
import math
import re
from pathlib import Path

import pytest
from random_ir import random_ir
from rich.console import Console

from hardwire.progress import (
    Bar,
    LogFollower,
    NextpnrLog,
    Reading,
    VerilatorBuildLog,
    YosysLog,
    duration,
    sim_progress,
    sim_progress_line,
    track,
    watch,
)

# lines of nextpnr-ecp5's log (--log top.tim) of the ULX3S build of the bundled model, router2, as written
NEXTPNR = """\
Info: Packing IOs..
Info: uart_0__tx__io feeds TRELLIS_IO uart_tx.buf.buf0, removing $nextpnr_obuf uart_0__tx__io.
Info: Packing LUT5-7s...
Info: Creating initial analytic placement for 37355 cells, random placement wirelen = 4725289.
Info:     at initial placer iter 0, wirelen = 21616
Info: Running main analytical placer, max placement attempts per cell = 203234189.
Info:     at iteration #1, type ALL: wirelen solved = 18610, spread = 1549358, legal = 1596159; time = 8.69s
Info:     at iteration #12, type ALL: wirelen solved = 255675, spread = 537181, legal = 594460; time = 12.17s
Info: HeAP Placer Time: 350.74s
Info: Running simulated annealing placer for refinement.
Info:   at iteration #10: temp = 0.000000, timing cost = 6120, wirelen = 448686
Info: SA placement time 588.63s
Info: Running router2...
Info: Setting up routing resources...
Info:     iter=1 wires=956672 overused=67805 overuse=83655 archfail=NA
Info:     iter=10 wires=1019816 overused=2291 overuse=2297 archfail=NA
Info:     iter=42 wires=1023391 overused=0 overuse=0 archfail=0
Info: Router2 time 275.22s
Info: Running router1 to check that route is legal...
Info: Routing 0 arcs.
Info:          0 |        0          0 |    0     0 |         0|       6.37       6.37|
Info: Program finished normally.
"""


def test_nextpnr_log_reads_packing_placement_and_router2() -> None:
    parse = NextpnrLog()
    readings = {line: parse(line) for line in NEXTPNR.splitlines()}
    lines = NEXTPNR.splitlines()
    assert readings[lines[0]] == Reading("packing", detail="Packing IOs")
    assert readings[lines[1]] is None  # an Info line that tells no progress
    assert readings[lines[4]] == Reading("analytic placement", detail="initial placer iteration 0, wirelen 21,616")
    assert readings[lines[7]] == Reading("analytic placement", 12, None, "iterations", "wirelen 594,460")
    assert readings[lines[9]].phase == "annealing placement"
    assert readings[lines[10]] == Reading("annealing placement", 10, None, "iterations", "wirelen 448,686")
    assert readings[lines[12]] == Reading("routing", 0, 100, "%", "setting up")
    # router2's overused wires against the first iteration's, on a log scale: 67,805 -> 0 %, 2,291 -> 30 %, 0 -> 100 %
    assert readings[lines[14]] == Reading("routing", 0.0, 100, "%", "iteration 1, overused wires: 67,805")
    assert readings[lines[15]].done == round(100 * (1 - math.log1p(2291) / math.log1p(67805)), 1) == 30.4
    assert readings[lines[16]] == Reading("routing", 100.0, 100, "%", "iteration 42, overused wires: 0")
    assert readings[lines[19]] is None and readings[lines[20]] is None  # router1's check had nothing to route


def test_nextpnr_log_reads_router1_arcs_left() -> None:
    """router1's table (rows as router1.cc formats them: "%10d | %8d %10d | %4d %5d | %9d| ..."): arcs done of
    the arcs it started with."""
    parse = NextpnrLog()
    assert parse("Info: Routing 120000 arcs.") is None
    row = "Info:       1000 |       12        988 |   12   988 |    119012|       0.52       0.52|"
    assert parse(row) == Reading("routing (router1)", 988, 120000, "arcs", "arcs left: 119,012")
    wide = "Info:     200000 |   103456     117000 | 1234 10000 |         0|      10.02      95.40|"
    assert parse(wide).done == 120000


YOSYS = """\
2.27. Executing OPT_CLEAN pass (remove unused cells and wires).
Removed 0 unused cells and 32 unused wires.
2.28. Executing MEMORY_LIBMAP pass (mapping memories to cells).
2.32.1. Executing OPT_EXPR pass (perform const folding).
3. Executing TECHMAP pass (map to technology primitives).
3.2. Continuing TECHMAP pass.
"""


def test_yosys_log_counts_passes_against_the_last_run(tmp_path: Path) -> None:
    earlier = tmp_path / "top.rpt"
    earlier.write_text(YOSYS)
    assert YosysLog.count(earlier) == 4  # N. and N.M. headings; 2.32.1 is a step inside a pass
    assert YosysLog.count(tmp_path / "none.rpt") is None
    parse = YosysLog(total=4)
    readings = [r for r in map(parse, YOSYS.splitlines()) if r is not None]
    assert [r.done for r in readings] == [1, 2, 3, 4]
    assert readings[1] == Reading("", 2, 4, "passes", "2.28 MEMORY_LIBMAP pass (mapping memories to cells)")
    assert readings[3].count() == "4/4 passes"
    fresh = YosysLog()  # a first build: no total, the passes counted
    assert fresh("1. Executing RTLIL frontend.").count() == "1 passes"
    short = YosysLog(total=1)  # a longer run than the last one: the total is dropped, not exceeded
    short("1. Executing RTLIL frontend.")
    assert short("2. Executing SYNTH_LATTICE pass.").total is None


def test_verilator_build_log_counts_the_generated_cpp_files(tmp_path: Path) -> None:
    for name in ("Vtop.cpp", "Vtop___024root__0.cpp", "Vtop__Syms__Slow.cpp"):
        (tmp_path / name).write_text("")
    parse = VerilatorBuildLog(tmp_path)
    flags = "-I.  -MMD -DVM_TRACE=0"
    lines = [  # the log of a build of the bundled model, its long flags shortened
        "- Verilator: Built from 2.609 MB sources in 32 modules, into 14.992 MB in 23 C++ files needing 0.012 MB",
        f"make: Entering directory '{tmp_path}'",
        f"c++  {flags} -O1  -c -o verilator.o /venv/site-packages/cocotb/share/lib/verilator/verilator.cpp",
        f"c++ -O1  {flags}       -x c++-header Vtop__pch.h -o Vtop__pch.h.fast.gch",
        f"c++ -O1  {flags}       -include Vtop__pch.h.fast -c Vtop.cpp",
        f"c++ -O1  {flags}       -include Vtop__pch.h.fast -c Vtop___024root__0.cpp",
        f"c++   {flags}       -include Vtop__pch.h.slow -c Vtop__Syms__Slow.cpp",
        "c++    verilator.o verilated.o Vtop__ALL.a   -lcocotbvpi_verilator     -o hardwire_decoder",
    ]
    readings = [parse(line) for line in lines]
    assert readings[0] is None  # still verilating: no count yet
    assert readings[1] == Reading("compiling", 0, 3, "files")
    assert readings[2] is None and readings[3] is None  # the runtime and the precompiled header: not counted
    assert [r.done for r in readings[4:7]] == [1, 2, 3]
    assert readings[5].detail == "Vtop___024root__0.cpp"
    assert readings[7] == Reading("compiling", 3, 3, "files", "linking hardwire_decoder")


def test_sim_progress_reads_the_testbench_line() -> None:
    assert sim_progress(sim_progress_line(12, 38)) == Reading("", 12, 38, "tokens")
    assert sim_progress("     0.00ns INFO     cocotb.regression                  Running tests") is None


def test_log_follower_reads_only_complete_new_lines(tmp_path: Path) -> None:
    log = tmp_path / "sim.log"
    follower = LogFollower(log, sim_progress)
    assert follower.poll() is None  # not written yet
    log.write_text(f"{sim_progress_line(1, 4)}\n{sim_progress_line(2, 4)}\nhardwire-prog")
    assert follower.poll().done == 2
    with log.open("a") as f:
        f.write("ress 3/4\n")  # the line the tool was writing is read whole once it ends
    assert follower.poll() == Reading("", 3, 4, "tokens")
    assert follower.poll().done == 3  # nothing new: the latest reading stands


def test_duration_is_short() -> None:
    assert [duration(s) for s in (4.4, 65, 1390, 7500)] == ["4 s", "1 min 05 s", "23 min 10 s", "2 h 05 min"]


def test_plain_lines_without_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    """Captured stdout is no terminal: a plain line per update when due (every=0 here), then a closing line."""
    with Bar("simulation", 4, unit="tokens", every=0) as bar:
        for _ in range(4):
            bar.advance()
    out = capsys.readouterr().out.splitlines()
    assert [re.sub(r", \d+ s elapsed.*", "", line) for line in out[:4]] == [
        "  simulation: 1/4 tokens (25%)", "  simulation: 2/4 tokens (50%)", "  simulation: 3/4 tokens (75%)",
        "  simulation: 4/4 tokens (100%)"]
    assert "about 0 s left" in out[0]
    assert out[4] == "  simulation: done in 0 s (4/4 tokens)"


def test_plain_lines_are_rate_limited_but_phases_show(capsys: pytest.CaptureFixture[str]) -> None:
    with Bar("nextpnr-ecp5", every=3600) as bar:
        for i in range(1, 20):
            bar.show(Reading("analytic placement", i, None, "iterations", f"wirelen {1000 - i}"))
        bar.show(Reading("routing", 30.4, 100, "%", "iteration 10, overused wires: 2,291"))
    out = capsys.readouterr().out.splitlines()
    assert out == ["  nextpnr-ecp5, analytic placement: 1 iterations, 0 s elapsed: wirelen 999",
                   "  nextpnr-ecp5, routing: 30%, 0 s elapsed, about 0 s left: iteration 10, overused wires: 2,291",
                   "  nextpnr-ecp5: done in 0 s"]


def test_plain_line_estimates_what_is_left() -> None:
    """Linear within the phase: 1 of 4 done in 10 s leaves about 30 s."""
    bar = Bar("simulation", 4, unit="tokens", console=Console(file=io.StringIO(), force_terminal=False))
    bar.advance(detail="prompt")
    assert bar.plain_line(bar.start + 10) == "  simulation: 1/4 tokens (25%), 10 s elapsed, about 30 s left: prompt"
    bar.close(ok=False)
    assert bar.console.file.getvalue() == ""  # a step that failed does not say done


def test_watch_shows_the_log_at_the_end(tmp_path: Path) -> None:
    log = tmp_path / "top.tim"
    log.write_text(NEXTPNR)
    console = Console(file=io.StringIO(), force_terminal=False)
    with Bar("nextpnr-ecp5", console=console, every=3600) as bar, watch(bar, LogFollower(log, NextpnrLog()).poll):
        pass
    assert bar.reading == Reading("routing", 100.0, 100, "%", "iteration 42, overused wires: 0")
    assert "  nextpnr-ecp5, routing: 100%" in console.file.getvalue()


def test_terminal_draws_a_rich_bar() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, force_interactive=True, width=150, color_system=None)
    with Bar("verilator build", phase="verilating", console=console) as bar:
        bar.show(Reading("compiling", 0, 3, "files"))
        bar.advance(detail="Vtop.cpp")
        bar.advance(2, detail="Vtop__Syms__Slow.cpp")
    text = console.file.getvalue()
    assert "verilator build, verilating" in text and "verilator build, compiling" in text
    assert "3/3 files" in text and "Vtop__Syms__Slow.cpp" in text
    assert "done in" not in text  # the bar itself stays on screen; no plain lines


def test_disabled_and_track(capsys: pytest.CaptureFixture[str]) -> None:
    assert list(track(["a", "b"], "nothing", enabled=False)) == ["a", "b"]
    assert capsys.readouterr().out == ""
    assert list(track(["q", "k"], "quantising weights", unit="tensors", name=str)) == ["q", "k"]
    assert capsys.readouterr().out == "  quantising weights: done in 0 s (2/2 tensors)\n"


def test_quantize_shows_its_steps(capsys: pytest.CaptureFixture[str]) -> None:
    from hardwire.quant.quantize import quantize

    quantize(random_ir(), "mixed36", avg_bits=5.0, progress=True)
    out = capsys.readouterr().out
    for step in ("calibration text: done in", "calibration ranges: done in", "sensitivity at 3 bits: done in",
                 "quantising weights (mixed36): done in"):
        assert step in out
    assert "(15/15 positions)" in out and "(2/2 layers)" in out and "(16/16 tensors)" in out

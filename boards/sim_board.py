"""BoardCore's Verilog under cocotb + Verilator, driven only through its UART pins (boards/tb_board.py)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from amaranth.back import verilog

from ..quant.qmodel import QModel
from ..quant.reference import ReferenceDecoder
from ..sim.runner import prepare_simulator
from ..sim.tools import LINT_WAIVERS
from .core import BoardCore

TOP_NAME = "hardwire_board"


@dataclass(frozen=True)
class BoardSimResult:
    result: dict  # what the testbench recorded (tokens of both sessions, the replies to garbage)
    convert_seconds: float
    build_seconds: float
    run_seconds: float


def write_board_verilog(core: BoardCore, folder: Path) -> Path:
    """BoardCore as one Verilog file, top module `hardwire_board` (clk, rst, rx, tx, leds)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{TOP_NAME}.v"
    path.write_text(verilog.convert(core, name=TOP_NAME, emit_src=False))
    return path


def simulate_board(qm: QModel, folder: Path, *, prompt: list[int], n: int, garbage: bytes, lanes: int = 8, rows: int = 1,
                   storage: str = "rom", clk_hz: int = 8 * 115_200, baud: int = 115_200, timeout_bytes: int = 32,
                   watchdog: int = 2_000_000) -> BoardSimResult:
    """Convert, build (unoptimised C++: these runs are short) and run the UART test in `folder`;
    the testbench fails the cocotb test when tokens differ from the reference or a reply is missing."""
    if len(prompt) + n > qm.context:
        raise ValueError(f"prompt + n = {len(prompt) + n} tokens must fit the context of {qm.context}: "
                         "the device feeds the last generated token too")
    folder = Path(folder).resolve()
    start = time.time()
    core = BoardCore(qm, rows=rows, lanes=lanes, storage=storage, clk_hz=clk_hz, baud=baud, timeout_bytes=timeout_bytes)
    source = write_board_verilog(core, folder)
    converted = time.time()
    prepare_simulator("verilator", optimise=False)
    from cocotb_tools.runner import get_runner

    runner = get_runner("verilator")
    sim_build = folder / "sim_build"
    runner.build(sources=[source], hdl_toplevel=TOP_NAME, build_dir=sim_build, build_args=list(LINT_WAIVERS),
                 always=False)
    built = time.time()
    result_path = folder / "board_result.json"
    result_path.unlink(missing_ok=True)
    spec = {"divisor": core.divisor, "timeout_cycles": core.timeout, "prompt": prompt, "n": n,
            "reference": ReferenceDecoder(qm).generate(prompt, n), "garbage": list(garbage), "watchdog": watchdog,
            "result": str(result_path)}
    spec_path = folder / "board_spec.json"
    spec_path.write_text(json.dumps(spec))
    pythonpath = os.pathsep.join(p for p in sys.path if p)
    results = runner.test(test_module="hardwire.boards.tb_board", hdl_toplevel=TOP_NAME, build_dir=sim_build,
                test_dir=sim_build, extra_env={"HARDWIRE_BOARD_SPEC": str(spec_path), "PYTHONPATH": pythonpath})
    done = time.time()
    from cocotb_tools.runner import get_results

    tests, failed = get_results(results)
    if not result_path.exists():
        raise RuntimeError(f"the cocotb board test wrote no result; see the simulator output above ({sim_build})")
    if failed or not tests:
        raise AssertionError(f"the cocotb board test failed ({failed} of {tests}): {result_path.read_text()}; "
                             f"see the simulator output above ({sim_build})")
    return BoardSimResult(json.loads(result_path.read_text()), round(converted - start, 1), round(built - converted, 1),
                          round(done - built, 1))


class BoardSim:
    """One Verilator build of a BoardCore that several cocotb testcases (hardwire.boards.tb_link) run on, so that
    the host-link tests pay for one build: the model goes to the testbench as a saved QModel, the rest in a JSON spec."""

    def __init__(self, qm: QModel, folder: Path, *, lanes: int = 8, clk_hz: int = 4 * 115_200, baud: int = 115_200,
                 timeout_bytes: int = 32) -> None:
        self.folder = Path(folder).resolve()
        self.qm, self.lanes, self.clk_hz = qm, lanes, clk_hz
        self.core = BoardCore(qm, lanes=lanes, storage="rom", clk_hz=clk_hz, baud=baud, timeout_bytes=timeout_bytes)
        start = time.time()
        source = write_board_verilog(self.core, self.folder)
        qm.save(self.folder / "qmodel")
        prepare_simulator("verilator", optimise=False)
        from cocotb_tools.runner import get_runner

        self.runner = get_runner("verilator")
        self.sim_build = self.folder / "sim_build"
        self.runner.build(sources=[source], hdl_toplevel=TOP_NAME, build_dir=self.sim_build,
                          build_args=list(LINT_WAIVERS), always=False)
        self.build_seconds = round(time.time() - start, 1)

    def run(self, testcases: list[str], spec: dict) -> dict[str, dict]:
        """Run `testcases` of hardwire.boards.tb_link in one simulator process -> each one's result:
        what it wrote (figures, replies) and `passed` with `failure` (the assertion's text) from cocotb's results."""
        import xml.etree.ElementTree as ET

        results = self.folder / "results"
        results.mkdir(exist_ok=True)
        for old in results.glob("*.json"):
            old.unlink()
        full = {**spec, "qmodel": str(self.folder / "qmodel"), "divisor": self.core.divisor,
                "timeout_cycles": self.core.timeout, "lanes": self.lanes, "clk_hz": self.clk_hz,
                "results": str(results)}
        spec_path = self.folder / "link_spec.json"
        spec_path.write_text(json.dumps(full))
        pythonpath = os.pathsep.join(p for p in sys.path if p)
        xml = self.folder / "results.xml"
        xml.unlink(missing_ok=True)
        with contextlib.suppress(SystemExit):  # under pytest the runner exits when a testcase failed: read each verdict
            self.runner.test(test_module="hardwire.boards.tb_link", hdl_toplevel=TOP_NAME, build_dir=self.sim_build,
                             test_dir=self.sim_build, testcase=testcases, results_xml=str(xml),
                             extra_env={"HARDWIRE_LINK_SPEC": str(spec_path), "PYTHONPATH": pythonpath})
        if not xml.exists():
            raise RuntimeError(f"the cocotb run left no results; see the simulator output above ({self.sim_build})")
        out: dict[str, dict] = {name: {"passed": False, "failure": "did not run"} for name in testcases}
        for case in ET.parse(xml).getroot().iter("testcase"):
            name = case.get("name", "")
            if name not in out:
                continue
            failure = case.find("failure")
            path = results / f"{name}.json"
            out[name] = {**(json.loads(path.read_text()) if path.exists() else {}), "passed": failure is None,
                         "failure": None if failure is None else (failure.get("message") or failure.text or "failed")}
        return out

"""BoardCore's Verilog under cocotb + Verilator, driven only through its UART pins: one build for the board's
session test (sim/tb_board.py) and the host link's testcases (sim/tb_link.py)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

from amaranth.back import verilog

from ..boards.core import BoardCore
from ..quant.qmodel import QModel
from ..quant.reference import ReferenceDecoder
from .runner import prepare_simulator
from .tools import LINT_WAIVERS, ports_only

TOP_NAME = "hardwire_board"
BOARD_TESTCASE = "prompt_garbage_reset_prompt"  # hardwire.sim.tb_board's one testcase
BOARD_WATCHDOG = 2_000_000  # cycles one exchange of tb_board may take before it fails instead of hanging


def write_board_verilog(core: BoardCore, folder: Path) -> Path:
    """BoardCore as one Verilog file, top module `hardwire_board` (clk, rst, rx, tx, leds)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{TOP_NAME}.v"
    path.write_text(verilog.convert(core, name=TOP_NAME, emit_src=False))
    return path


class BoardSim:
    """One Verilator build of a BoardCore that several cocotb testcases (hardwire.sim.tb_board's session and
    hardwire.sim.tb_link's host-link testcases) run on, so that the board tests pay for one build: the model goes
    to the testbench as a saved QModel, the rest in a JSON spec."""

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
                          build_args=[*LINT_WAIVERS, *ports_only(source, TOP_NAME, self.sim_build)], always=False)
        self.build_seconds = round(time.time() - start, 1)

    def run(self, testcases: list[str], spec: dict) -> dict[str, dict]:
        """Run `testcases` of hardwire.sim.tb_link (and BOARD_TESTCASE, tb_board's session, first, on the fresh
        simulator: spec["board"] gives its prompt, n and garbage) in one simulator process -> each one's result:
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
        env = {"HARDWIRE_LINK_SPEC": str(spec_path), "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        if BOARD_TESTCASE in testcases:
            board = spec["board"]
            board_spec = {"divisor": self.core.divisor, "timeout_cycles": self.core.timeout, "prompt": board["prompt"],
                          "n": board["n"], "reference": ReferenceDecoder(self.qm).generate(board["prompt"], board["n"]),
                          "garbage": list(board["garbage"]), "watchdog": BOARD_WATCHDOG,
                          "result": str(results / f"{BOARD_TESTCASE}.json")}
            env["HARDWIRE_BOARD_SPEC"] = str(self.folder / "board_spec.json")
            Path(env["HARDWIRE_BOARD_SPEC"]).write_text(json.dumps(board_spec))
        xml = self.folder / "results.xml"
        xml.unlink(missing_ok=True)
        with contextlib.suppress(SystemExit):  # under pytest the runner exits when a testcase failed: read each verdict
            self.runner.test(test_module=["hardwire.sim.tb_board", "hardwire.sim.tb_link"], hdl_toplevel=TOP_NAME,
                             build_dir=self.sim_build, test_dir=self.sim_build, testcase=testcases, results_xml=str(xml),
                             extra_env=env)
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

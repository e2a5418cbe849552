"""`hardwire demo` (what `make demo` runs): by default it stops after the token-exact simulation with an
estimated speed, in minutes; the bitstream is the explicit `--board` step (`make bitstream`).

A small character model stands in for the bundled one so that the real path (import, quantise, Verilog,
cocotb + Verilator) runs in about a minute; the place and route of `--board` is replaced by a stand-in
(tests/test_boards_build.py runs the real one)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from exports import example_model

from hardwire.cli import build_parser, main
from hardwire.examples.tiny_llama import export_onnx

VOCAB = list("abcdefghijklmnopqrstuvwxyzROME .,:;!?\n'-")  # the example model's 40 tokens
ARGS = ["--quant", "int8", "--lanes", "8", "-n", "4", "--prompt", "ROMEO:"]


@pytest.fixture(scope="module")
def char_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert len(VOCAB) == 40
    path = tmp_path_factory.mktemp("demo") / "tiny.onnx"
    export_onnx(example_model(), str(path), metadata={"hardwire.vocab": json.dumps(VOCAB)})
    return path


def test_demo_defaults_to_no_board() -> None:
    parser = build_parser()
    assert parser.parse_args(["demo"]).board is None
    assert parser.parse_args(["demo", "--no-board"]).board is None  # old scripts still work
    assert parser.parse_args(["demo", "--board", "ulx3s"]).board == "ulx3s"
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    assert re.search(r"^demo: .*\n\t\$\(VENV\)/bin/hardwire demo\n", makefile, re.M)
    assert re.search(r"^bitstream: .*\n(\t@echo .*\n)+\t\$\(VENV\)/bin/hardwire demo --board ulx3s\n", makefile, re.M)


@pytest.mark.xdist_group("demo")
def test_demo_stops_after_the_simulation_with_an_estimate(char_model: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--model", str(char_model), *ARGS, "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "[4/4] simulating the Verilog" in text and "[5/" not in text
    sim = json.loads((out / "sim.json").read_text())
    assert sim["match"]
    estimate = f"{25e6 / sim['cycles_per_token']:,.0f}"
    assert re.search(rf"  tokens per second +{estimate} \(ESTIMATE: the ULX3S-85F's 25 MHz oscillator", text), text
    assert "Run `make bitstream`" in text
    assert "Fmax" not in text and not (out / "board_ulx3s").exists() and not (out / "build_ulx3s.json").exists()


@pytest.mark.xdist_group("demo")
def test_demo_with_a_board_builds_and_reports_the_clock(char_model: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from hardwire.boards import fpga
    from hardwire.sim import runner
    from hardwire.sim.runner import SimResult

    def simulate(folder: Path, prompt: list[int], n: int) -> SimResult:  # the simulation is tested above
        tokens, outputs = [1] * n, [1] * (len(prompt) - 1 + n)
        return SimResult(tokens=tokens, reference_tokens=tokens, match=True, outputs=outputs, reference_outputs=outputs,
                         cycles=[1000] * (len(prompt) + n), macs=[8000] * (len(prompt) + n), lanes=8, build_seconds=0.0,
                         run_seconds=0.0)

    built: list = []

    def build_board(folder: Path, board: str) -> dict:
        built.append((folder, board))
        return {"luts": 12_000, "ffs": 4_000, "brams": 11, "dsps": 30, "fmax_mhz": 21.5, "clock_mhz": 25.0,
                "timing_met": False, "tok_s": 25_000.0, "tok_s_at_fmax": 21_500.0,
                "bitstream": str(folder / "board_ulx3s" / "top.bit")}

    monkeypatch.setattr(runner, "simulate", simulate)
    monkeypatch.setattr(fpga, "build_board", build_board)
    out = tmp_path / "demo"
    assert main(["demo", "--model", str(char_model), *ARGS, "-o", str(out), "--board", "ulx3s"]) == 0
    text = capsys.readouterr().out
    assert built == [(out, "ulx3s")]
    assert "[5/5] building the ULX3S-85F bitstream: synthesis, place and route, packing. This is the long step" in text
    assert re.search(r"  clock +25 MHz; Fmax 21.5 MHz, timing NOT MET: the bitstream may misbehave\n", text)
    assert re.search(r"  tokens per second +25,000 at the 25 MHz clock the bitstream is built with "
                     r"\(21,500 if clocked at Fmax\)\n", text)
    assert "ESTIMATE" not in text and "make bitstream" not in text

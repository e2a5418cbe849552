"""`hardwire demo` (what `make demo` runs): by default it sizes the chip for the ULX3S-85F (the scheme of best
measured quality that fits, the `--rows auto` shape) and stops after the token-exact simulation with the speed at
the clock of a recorded routed build of that design, else an estimate, in minutes; the bitstream is the explicit
`--board` step (`make bitstream`).

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

    def simulate(folder: Path, prompt: list[int], n: int, optimise: bool = True) -> SimResult:  # the simulation is tested above
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


def _stand_in_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulation, tested above, as a stand-in: 1,000 cycles per token."""
    from hardwire.sim import runner
    from hardwire.sim.runner import SimResult

    def simulate(folder: Path, prompt: list[int], n: int, optimise: bool = True) -> SimResult:
        tokens, outputs = [1] * n, [1] * (len(prompt) - 1 + n)
        return SimResult(tokens=tokens, reference_tokens=tokens, match=True, outputs=outputs, reference_outputs=outputs,
                         cycles=[1000] * (len(prompt) + n), macs=[8000] * (len(prompt) + n), lanes=8, build_seconds=0.0,
                         run_seconds=0.0)

    monkeypatch.setattr(runner, "simulate", simulate)


# a ULX3S-85F cut to 20 DP16KD: the example model's int8 fits no shape --rows auto tries (22 blocks at 1 row x 2
# lanes), its int4 does (18 at 1 x 2)
SMALL_BRAM_BLOCKS = 20
SCHEME_WHY = ("the best measured quality that fits the ULX3S-85F (order int8 > int4 > mxfp4 > mixed36 > int3: top-1 "
              "agreement with the float model, benchmarks/quality.py, the same order on both bundled models)")


@pytest.mark.xdist_group("demo")
def test_demo_sizes_the_chip_for_the_ulx3s(char_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Without --quant and --lanes the demo builds the --rows auto shape for the ULX3S-85F in the best scheme that
    fits it (int8 for this model), and its speed line names the shape and says the clock is the oscillator's,
    estimated, when no routed build of that design is recorded."""
    from hardwire.boards.parts import ULX3S_85F, choose_plan
    from hardwire.quant.qmodel import QModel

    _stand_in_simulation(monkeypatch)
    out = tmp_path / "demo"
    assert main(["demo", "--model", str(char_model), "-n", "4", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    qm = QModel.load(out)
    plan, fit, _ = choose_plan(qm, ULX3S_85F, "rom")
    saved = json.loads((out / "report.json").read_text())
    assert (saved["rows"], saved["lanes"], saved["attention_rows"], saved["softmax_lanes"], saved["epilogue_lanes"],
            saved["dsp_rows"]) == (plan.rows, plan.lanes, plan.attention_rows, plan.softmax_lanes, plan.epilogue_lanes,
                                   plan.dsp_rows)
    assert plan.macs_per_cycle > 16  # not the 1 x 16 engine the demo built before
    assert ("[2/4] sizing the chip for the ULX3S-85F: the weight scheme of best measured quality that fits, the --rows "
            "auto engine shape ...\n      quantising (int8) ...\n") in text
    assert f"\n      scheme int8: {SCHEME_WHY}\n      sized for the ULX3S-85F: {plan.shape} " in text
    assert re.search(rf"\n  quantisation +int8, [0-9.]+ bits/weight, [0-9,]+ code bits: {re.escape(SCHEME_WHY)}\n", text)
    assert f"\n  engine                {plan.shape}, {plan.macs_per_cycle} MACs/cycle: the --rows auto shape for the " \
           f"ULX3S-85F; {fit.summary()}\n" in text
    assert (f"\n  tokens per second     25,000 (ESTIMATE: the ULX3S-85F's 25 MHz oscillator, the clock its bitstream "
            f"runs at by default, / simulated cycles per token of {plan.shape}, int8; no routed build of this shape and "
            f"scheme that met timing is recorded in benchmarks/results/routed_builds.json, so no place and route has "
            f"checked a clock for it)\n") in text


@pytest.mark.xdist_group("demo")
def test_demo_picks_the_next_scheme_when_int8_does_not_fit(char_model: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """On a part whose block RAM int8 overflows, the demo takes int4 and says why; --quant and --lanes given build
    as given, as before."""
    from dataclasses import replace

    from hardwire.boards import parts
    from hardwire.boards.parts import ULX3S_85F, choose_plan
    from hardwire.quant.qmodel import QModel

    _stand_in_simulation(monkeypatch)
    small = replace(ULX3S_85F, bram_blocks=SMALL_BRAM_BLOCKS)
    monkeypatch.setitem(parts.PARTS, "ulx3s", small)
    out = tmp_path / "demo"
    assert main(["demo", "--model", str(char_model), "-n", "4", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    qm = QModel.load(out)
    assert qm.scheme == "int4"
    plan, _, _ = choose_plan(qm, small, "rom")
    bars = r"(?:  [a-z].*: done in .*\n)+"  # the quantiser's progress: plain lines, captured stdout is no terminal
    assert re.search(rf"\n      quantising \(int8\) \.\.\.\n{bars}        int8 does not fit the ULX3S-85F: no engine shape "
                     rf"fits: ", text)
    assert re.search(rf"\n      quantising \(int4\) \.\.\.\n{bars}      scheme int4: {re.escape(SCHEME_WHY)}; int8 does "
                     rf"not fit\n", text)
    assert re.search(rf"\n  quantisation +int4, [0-9.]+ bits/weight, [0-9,]+ code bits: {re.escape(SCHEME_WHY)}; int8 "
                     rf"does not fit\n", text)
    assert f"\n  engine                {plan.shape}, {plan.macs_per_cycle} MACs/cycle: the --rows auto shape" in text

    assert main(["demo", "--model", str(char_model), "-n", "4", "--quant", "int8", "--lanes", "8", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "[2/4] quantising (int8) ...\n" in text and "sizing" not in text  # no fit check, as before
    assert "\n  engine                1 row x 8 lanes, 8 MACs/cycle: as given (--lanes 8)\n" in text
    assert re.search(r"\n  quantisation +int8, [0-9.]+ bits/weight, [0-9,]+ code bits: as given \(--quant\)\n", text)


@pytest.mark.xdist_group("demo")
def test_demo_quotes_the_clock_of_a_routed_build_of_its_design(char_model: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """With a routed build of the very design recorded (board, model file, scheme, context, storage, shape), the
    speed is at that build's clock, with its date; a build of another shape is not quoted."""
    import hashlib

    from hardwire import demo
    from hardwire.boards.parts import ULX3S_85F, choose_plan
    from hardwire.quant.qmodel import QModel

    _stand_in_simulation(monkeypatch)
    out = tmp_path / "demo"
    assert main(["demo", "--model", str(char_model), "-n", "4", "-o", str(out)]) == 0  # to learn its shape
    capsys.readouterr()
    qm = QModel.load(out)
    plan, _, _ = choose_plan(qm, ULX3S_85F, "rom")
    record = {"board": "ulx3s", "model_sha256": hashlib.sha256(char_model.read_bytes()).hexdigest(), "scheme": "int8",
              "context": qm.context, "storage": "rom", "rows": plan.rows, "lanes": plan.lanes,
              "attention_rows": plan.attn_rows(qm.config.head_dim), "softmax_lanes": plan.softmax_lanes,
              "epilogue_lanes": plan.epilogue_lanes, "dsp_rows": plan.rows - plan.shift_add_rows, "clock_mhz": 46.875,
              "fmax_mhz": 55.6, "timing_met": True, "date": "2026-12-07"}
    older = dict(record, date="2026-12-06", clock_mhz=40.0, fmax_mhz=49.5)  # the same design, routed before
    other = dict(record, date="2026-12-08", lanes=plan.lanes // 2, clock_mhz=60.0)  # another shape: not this chip
    builds = tmp_path / "routed_builds.json"
    builds.write_text(json.dumps({"builds": [older, record, other]}))
    monkeypatch.setattr(demo, "ROUTED_BUILDS", builds)
    assert main(["demo", "--model", str(char_model), "-n", "4", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert (f"\n  tokens per second     46,875 at 46.875 MHz, the clock of the routed build of {plan.shape}, int8 on "
            f"the ULX3S-85F of 2026-12-07 (timing met, Fmax 55.6 MHz; benchmarks/results/routed_builds.json), / "
            f"simulated cycles per token\n") in text
    assert "ESTIMATE" not in text


def test_the_recorded_routed_builds_are_the_bundled_4_x_16_engine() -> None:
    """benchmarks/results/routed_builds.json names the bundled model by its file's hash and the shape of the first
    routed bitstream: the demo quotes its clock for exactly that design (mixed36, 4 x 16, attention on 2, softmax
    on 8), the newest build first, and only a build that met timing (int4 4 x 16 was routed at 60 MHz and missed)."""
    from types import SimpleNamespace

    from hardwire.cli import BUNDLED_MODEL
    from hardwire.demo import routed_build
    from hardwire.rtl.plan import HardwarePlan

    qm = SimpleNamespace(scheme="mixed36", context=128, config=SimpleNamespace(head_dim=32))
    plan = HardwarePlan(rows=4, lanes=16, attention_rows=2, softmax_lanes=8)
    build = routed_build(BUNDLED_MODEL, qm, plan, "ulx3s")
    assert (build["date"], build["clock_mhz"], build["fmax_mhz"], build["timing_met"]) == \
        ("2026-12-07", 46.875, 55.6, True)
    assert routed_build(BUNDLED_MODEL, SimpleNamespace(scheme="int4", context=128, config=qm.config), plan,
                        "ulx3s") is None
    assert routed_build(BUNDLED_MODEL, qm, HardwarePlan(rows=4, lanes=32, attention_rows=4, softmax_lanes=8),
                        "ulx3s") is None
    # the --rows auto engine was built at 37.5 MHz and, with the reset on a global network, at 45 MHz the same day:
    # the one recorded last is quoted
    auto = HardwarePlan(rows=4, lanes=32, attention_rows=1, softmax_lanes=8, dsp_rows=3)
    build = routed_build(BUNDLED_MODEL, SimpleNamespace(scheme="int4", context=128, config=qm.config), auto, "ulx3s")
    assert (build["date"], build["clock_mhz"], build["fmax_mhz"]) == ("2026-12-07", 45.0, 48.32)

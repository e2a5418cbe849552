"""The board flow for real: one ULX3S-85F bitstream of a tiny model, the fit check's refusals,
the PLL dividers against the vendor-neutral calculators, and the ASIC gate count.

The one place-and-route run (about 2 minutes here) is shared by the tests through a
module fixture; everything else is seconds. Timings are printed (pytest -s shows them).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from amaranth.hdl import Fragment, Instance
from random_ir import random_ir

from hardwire.boards.asic import build_asic
from hardwire.boards.fpga import build_board, tool_command
from hardwire.boards.memories import live_bits
from hardwire.boards.parts import ICEBREAKER, ULX3S_85F, FitError, check_fit, check_synthesis
from hardwire.boards.plls import ecp5_pll, ice40_pll
from hardwire.boards.top import BoardTop
from hardwire.cli import main
from hardwire.quant.quantize import quantize
from hardwire.rtl.build import compile_to

TINY = {"vocab": 32, "d": 16, "layers": 1, "heads": 2, "kv_heads": 1, "ffn": 32, "context": 16}
# For the runs of the real tools (place and route, ASIC synthesis): their time follows the logic, which is mostly the
# decoder's fixed units (norm and its rescalers, softmax, FSM) and shrinks with the lanes; one lane and a model of
# width 8 cut the ULX3S place and route from about 280 s of CPU to 110 s and the ASIC synthesis from 57 s to 38 s,
# and still use block RAM, DSPs and the PLL (ULX3S) or NAND gates and SRAM (ASIC)
TOOL_RUN = {"vocab": 16, "d": 8, "layers": 1, "heads": 2, "kv_heads": 1, "ffn": 16, "context": 8}


def _tiny(folder: Path, storage: str, lanes: int = 4, model: dict = TINY) -> Path:
    """The smallest decoder worth building: one layer of 16 (or `model`), int8, ROM or logic weights."""
    qm = quantize(random_ir(**model), "int8", context=model["context"])
    compile_to(qm, folder, lanes=lanes, storage=storage, progress=False)
    return folder


@pytest.fixture(scope="module")
def ulx3s_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    folder = _tiny(tmp_path_factory.mktemp("boards") / "tiny_rom", "rom", lanes=1, model=TOOL_RUN)
    start = time.time()
    result = build_board(folder, "ulx3s", clock_mhz=40.0, progress=True)  # through the PLL: 25 MHz in, 40 out
    print(f"\n[timing] ULX3S-85F bitstream of the tiny model at 40 MHz: {time.time() - start:.0f} s "
          f"(tools: {result['tool_seconds']})")
    return folder, result


@pytest.mark.xdist_group("ulx3s_build")
def test_ulx3s_bitstream_and_report(ulx3s_build: tuple[Path, dict]) -> None:
    folder, result = ulx3s_build
    assert result == json.loads((folder / "build_ulx3s.json").read_text())
    assert 0 < result["luts"] < result["luts_available"] == 83_640
    assert result["ffs"] > 0 and result["dsps"] > 0
    # weight ROMs (embedding, MLP, head) and the rsqrt/exp tables land in DP16KD: the fit check predicted them
    assert result["brams"] > 0
    assert result["brams"] == result["brams_estimated"], result  # the memory-by-memory estimate is exact here
    assert result["fmax_mhz"] > 0 and result["clock_mhz"] == 40.0
    assert result["timing_met"] == (result["fmax_mhz"] >= 40.0)
    assert result["utilisation"]["EHXPLLL"] == 1  # the PLL made it through place and route, constrained at 40 MHz
    assert result["utilisation"]["DCCA"] == 2  # the clock and the core's reset, each on a global network
    lpf = (folder / "board_ulx3s" / "top.lpf").read_text()
    assert re.search(r'FREQUENCY NET "[^"]*clk" 40000000(\.0)? HZ', lpf), lpf
    report = json.loads((folder / "report.json").read_text())
    assert result["cycles_per_token"] == report["cycles_per_token_estimate"]
    assert result["tok_s_source"].startswith("report.json cycles_per_token_estimate")
    # tok_s: what the bitstream does at the clock it is built with (the PLL's 40 MHz), not at nextpnr's Fmax
    assert result["tok_s"] == round(40.0 * 1e6 / report["cycles_per_token_estimate"], 1)
    assert result["tok_s_at_fmax"] == round(result["fmax_mhz"] * 1e6 / report["cycles_per_token_estimate"], 1)
    bit = Path(result["bitstream"])
    assert bit == folder / "board_ulx3s" / "top.bit" and bit.stat().st_size > 100_000  # an LFE5U-85F image
    assert result["seconds"] > 0


@pytest.mark.xdist_group("ulx3s_build")
def test_tok_s_prefers_the_simulated_cycle_count(ulx3s_build: tuple[Path, dict]) -> None:
    from hardwire.boards.fpga import cycles_per_token

    folder, _ = ulx3s_build
    (folder / "sim.json").write_text(json.dumps({"cycles_per_token": 1234.5}))
    try:
        assert cycles_per_token(folder) == (1234.5, "sim.json cycles_per_token (measured in simulation)")
    finally:
        (folder / "sim.json").unlink()


def _fake_builds(monkeypatch: pytest.MonkeyPatch, fmax_at: dict) -> list:
    """Stand in for one synthesis + place and route: Fmax by clock (None: the oscillator); a file in
    board_ulx3s/ says which build it is. Returns the clocks asked for, in order."""
    from hardwire.boards import fpga

    asked: list = []

    def once(folder: Path, board: str, *, clock_mhz, baud: int, progress: bool) -> dict:
        asked.append(clock_mhz)
        clock = 25.0 if clock_mhz is None else round(ecp5_pll(25.0, clock_mhz).f_out_mhz, 4)
        out = folder / f"board_{board}"
        shutil.rmtree(out, ignore_errors=True)  # as the real build deletes an earlier build's products
        out.mkdir(parents=True)
        (out / "top.bit").write_text(f"{clock}")
        fmax = fmax_at[clock_mhz]
        result = {"board": board, "fmax_mhz": fmax, "clock_mhz": clock, "timing_met": fmax >= clock,
                  "cycles_per_token": 1000.0, "tok_s": clock * 1e3, "tok_s_at_fmax": fmax * 1e3, "seconds": 1.0}
        (folder / f"build_{board}.json").write_text(json.dumps(result))
        return result

    monkeypatch.setattr(fpga, "_build_once", once)
    return asked


def test_auto_clock_picks_the_pll_just_below_fmax() -> None:
    from hardwire.boards.fpga import auto_clock_mhz

    # 90% of Fmax, in 0.1 MHz asks, the PLL's output never above it: 47.9 MHz -> ask 43.1, the PLL makes 42.86
    assert auto_clock_mhz("ulx3s", 47.9) == 43.1 and ecp5_pll(25.0, 43.1).f_out_mhz <= 0.9 * 47.9
    assert auto_clock_mhz("ulx3s", 32.8) == 29.5 and ecp5_pll(25.0, 29.5).f_out_mhz <= 0.9 * 32.8
    assert auto_clock_mhz("ulx3s", 28.0) is None  # 25.2 MHz: not 5% above the 25 MHz oscillator
    assert auto_clock_mhz("ulx3s", 1000.0) == 400.0  # the PLL's top
    assert auto_clock_mhz("icebreaker", 17.0) is None  # 15.3 MHz: below the 16 MHz the iCE40 PLL starts at


def test_auto_clock_rebuilds_once_and_keeps_what_meets_timing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "tiny"
    asked = _fake_builds(monkeypatch, {None: 47.9, 43.1: 44.5})  # the real tiny build's figures
    result = build_board(folder, "ulx3s", clock_mhz="auto")
    out = capsys.readouterr()
    assert asked == [None, 43.1]
    assert "REBUILDING once with the PLL at 43.1 MHz" in out.out and "timing met at 42.8571 MHz" in out.out
    assert out.err == ""
    assert result == json.loads((folder / "build_ulx3s.json").read_text())
    assert result["clock_mhz"] == 42.8571 and result["timing_met"]
    assert result["clock_auto"] == {"default_clock_mhz": 25.0, "default_fmax_mhz": 47.9, "default_seconds": 1.0,
                                    "rebuilt": True, "kept": "pll", "pll_fmax_mhz": 44.5}
    assert (folder / "board_ulx3s" / "top.bit").read_text() == "42.8571"
    assert not (folder / "board_ulx3s.default").exists()

    # the rebuild misses timing: the oscillator's bitstream and report are put back, with no warning
    asked = _fake_builds(monkeypatch, {None: 47.9, 43.1: 41.0})
    result = build_board(folder, "ulx3s", clock_mhz="auto")
    out = capsys.readouterr()
    assert asked == [None, 43.1]
    assert "missed timing (Fmax 41.0 MHz); kept the 25 MHz bitstream" in out.out and out.err == ""
    assert result == json.loads((folder / "build_ulx3s.json").read_text())
    assert result["clock_mhz"] == 25.0 and result["timing_met"] and result["clock_auto"]["kept"] == "default"
    assert (folder / "board_ulx3s" / "top.bit").read_text() == "25.0"
    assert not (folder / "board_ulx3s.default").exists()

    # no headroom: one build only
    asked = _fake_builds(monkeypatch, {None: 27.0})
    result = build_board(folder, "ulx3s", clock_mhz="auto")
    assert asked == [None] and not result["clock_auto"]["rebuilt"]
    assert "no worthwhile headroom" in capsys.readouterr().out


def test_timing_not_met_is_said_in_the_report_and_on_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    _fake_builds(monkeypatch, {50.0: 44.5, None: 20.0})
    result = build_board(tmp_path / "tiny", "ulx3s", clock_mhz=50.0)
    assert not result["timing_met"]
    assert capsys.readouterr().err == (
        "WARNING: timing is NOT met: Fmax 44.5 MHz is below the 50 MHz clock; the bitstream was written anyway but "
        "may misbehave on the board; rebuild with --clock-mhz 44 or lower (or --clock-mhz auto)\n")
    result = build_board(tmp_path / "tiny", "ulx3s", clock_mhz="auto")  # auto never rebuilds faster than a miss
    assert not result["timing_met"] and not result["clock_auto"]["rebuilt"]
    assert "WARNING: timing is NOT met: Fmax 20.0 MHz is below the 25 MHz clock" in capsys.readouterr().err


def test_build_passes_clock_mhz_auto(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    from hardwire.boards import fpga

    calls: list = []
    monkeypatch.setattr(fpga, "build_board", lambda folder, board, **kw: calls.append((folder, board, kw)))
    assert main(["build", str(tmp_path), "--board", "ulx3s", "--clock-mhz", "auto"]) == 0
    assert main(["build", str(tmp_path), "--board", "ulx3s", "--clock-mhz", "40"]) == 0
    assert [kw["clock_mhz"] for _, _, kw in calls] == ["auto", 40.0]
    with pytest.raises(SystemExit) as exit_:
        main(["build", str(tmp_path), "--board", "ulx3s", "--clock-mhz", "fast"])
    assert exit_.value.code == 2
    assert "argument --clock-mhz: expected a frequency in MHz or auto, got 'fast'" in capsys.readouterr().err


def _too_big_for_ulx3s(folder: Path) -> Path:
    """Half a million int8 weights: the bundled model's size, quantised in two seconds, without Verilog."""
    qm = quantize(random_ir(vocab=64, d=128, layers=2, heads=4, kv_heads=2, ffn=512, context=64), "int8", context=64)
    qm.save(folder)
    (folder / "report.json").write_text(json.dumps({"rows": 1, "lanes": 8, "storage": "rom", "scheme": "int8",
                                                         "context": 64}))
    return folder


def test_fit_check_refuses_int8_on_the_ulx3s(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _too_big_for_ulx3s(tmp_path / "big")
    expected = ("big (int8, 1 row x 8 lanes, context 64) needs 4,829,184 block-RAM bits (262 DP16KD of 18,432 bits for "
                "4,317,560 bits of memories: weights 4,063,232 (the embedding and head's codes 131,072), tables 75,648, "
                "kv 131,072, lora 28,672, buffers 18,936), "
                "the ULX3S-85F has 3,833,856 (208 DP16KD); try --quant mixed36 or mxfp4")
    with pytest.raises(FitError) as err:
        check_fit(folder, "ulx3s")
    assert str(err.value) == expected
    start = time.time()
    assert main(["build", str(folder), "--board", "ulx3s"]) == 2
    assert capsys.readouterr().err == f"hardwire: error: {expected}\n"
    assert time.time() - start < 30 and not (folder / "board_ulx3s").exists()  # refused before any tool ran


def test_fit_check_refuses_the_icebreaker(tmp_path: Path) -> None:
    folder = _tiny(tmp_path / "tiny", "rom")
    expected = ("tiny (int8, 1 row x 4 lanes, context 16) needs at least 18,500 LUT4s (the smallest decoder measured), "
                "the iCEBreaker has 5,280; tiny (int8, 1 row x 4 lanes, context 16) needs 151,552 block-RAM bits (37 "
                "SB_RAM40_4K of 4,096 bits for 70,680 bits of memories: weights 26,624 (the embedding and head's codes "
                "8,192), tables 30,976, kv 2,048, lora "
                "1,792, buffers 9,240), the iCEBreaker has 122,880 (30 SB_RAM40_4K); the iCEBreaker holds only very "
                "small models; try --board ulx3s")
    with pytest.raises(FitError) as err:
        build_board(folder, "icebreaker", progress=False)
    assert str(err.value) == expected
    assert not (folder / "board_icebreaker").exists()


def test_live_bits_counts_the_columns_that_vary() -> None:
    assert live_bits([0b1010, 0b1000, 0b1110], 4) == 2  # bits 1 and 2 vary; bit 3 is always 1, bit 0 always 0
    assert live_bits([-1, 0], 8) == 8  # two's complement: every column differs
    assert live_bits([5, 5, 5], 8) == 1  # a constant table still keeps one column


def test_synthesis_check_names_each_resource_over() -> None:
    """After yosys, before nextpnr: the cell counts against the part, every shortfall in one message."""
    cells = {"SB_LUT4": 18_512, "SB_DFFESR": 3_000, "SB_DFF": 1_000, "SB_RAM40_4K": 28, "SB_MAC16": 8}
    with pytest.raises(FitError) as err:
        check_synthesis(ICEBREAKER, cells, "tiny (int8, 8 lanes, context 8)")
    assert str(err.value) == ("tiny (int8, 8 lanes, context 8) needs after synthesis 18,512 LUT4s (the iCEBreaker has "
                              "5,280); the iCEBreaker holds only very small models; try --board ulx3s")
    check_synthesis(ULX3S_85F, {"LUT4": 10_000, "CCU2C": 500, "TRELLIS_FF": 4_000, "DP16KD": 13}, "tiny")  # fits


def test_build_needs_a_board_folder_and_a_board(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", str(tmp_path), "--board", "ulx3s"]) == 2
    assert capsys.readouterr().err == (f"hardwire: error: {tmp_path} is not a build folder (no qmodel.json, qmodel.npz, "
                                       f"report.json); make one with `hardwire compile MODEL.onnx -o {tmp_path}`\n")
    assert main(["build", str(tmp_path)]) == 2
    assert capsys.readouterr().err == ("hardwire: error: an FPGA build needs --board (one of ulx3s, ulx3s_12f, "
                                       "ulx3s_25f, ulx3s_45f, colorlight_5a75b, orangecrab_25f, orangecrab_85f, "
                                       "tang_nano_20k, tang_primer_25k, tang_console_60k, tang_mega_138k, icebreaker)\n")


def test_build_refuses_bad_clock_and_option_mixes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _tiny(tmp_path / "tiny", "rom")
    assert main(["build", str(folder), "--board", "ulx3s", "--clock-mhz", "500"]) == 2
    assert capsys.readouterr().err == "hardwire: error: the ECP5 PLL makes 10 to 400 MHz, not 500 MHz\n"
    assert main(["build", str(folder), "--board", "ulx3s", "--clock-mhz", "-5"]) == 2
    assert capsys.readouterr().err == "hardwire: error: clock_mhz must be positive, got -5.0\n"
    assert not (folder / "board_ulx3s").exists()
    assert main(["build", str(folder), "--target", "asic", "--board", "ulx3s"]) == 2
    assert capsys.readouterr().err == ("hardwire: error: --board is for --target fpga; --target asic takes none of "
                                       "--board, --clock-mhz, --baud\n")
    # --baud has a default for boards, but given with --target asic it is refused, not ignored
    assert main(["build", str(folder), "--target", "asic", "--baud", "9600"]) == 2
    assert capsys.readouterr().err == ("hardwire: error: --baud is for --target fpga; --target asic takes none of "
                                       "--board, --clock-mhz, --baud\n")
    assert main(["build", str(folder), "--target", "asic", "--clock-mhz", "30", "--baud", "115200"]) == 2
    assert capsys.readouterr().err == ("hardwire: error: --clock-mhz, --baud are for --target fpga; --target asic "
                                       "takes none of --board, --clock-mhz, --baud\n")
    assert not (folder / "build_asic.json").exists()


def _tool_lines(tool: str, *args: str) -> str:
    proc = subprocess.run([tool_command(tool), *args], capture_output=True, text=True, check=False)
    return proc.stdout + proc.stderr


@pytest.mark.parametrize("mhz", [50.0, 40.0, 33.3, 48.0])
def test_ecp5_pll_matches_ecppll(mhz: float) -> None:
    out = _tool_lines("ecppll", "-i", "25", "-o", str(mhz))
    expect = {key: int(re.search(rf"{label}: (\d+)", out).group(1))
              for key, label in (("clki_div", "Refclk divisor"), ("clkfb_div", "Feedback divisor"),
                                 ("clkop_div", "clkout0 divisor"))}
    pll = ecp5_pll(25.0, mhz)
    assert {key: getattr(pll, key) for key in expect} == expect
    assert pll.f_out_mhz == pytest.approx(25.0 / pll.clki_div * pll.clkfb_div)
    assert 400 <= pll.f_vco_mhz <= 800


@pytest.mark.parametrize("mhz", [24.0, 30.0, 48.0])
def test_ice40_pll_matches_icepll(mhz: float) -> None:
    out = _tool_lines("icepll", "-i", "12", "-o", str(mhz))
    expect = {key: int(re.search(rf"{key.upper()}:\s+(\d+)", out).group(1))
              for key in ("divr", "divf", "divq", "filter_range")}
    pll = ice40_pll(12.0, mhz)
    assert {key: getattr(pll, key) for key in expect} == expect


def test_pll_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"^the ECP5 PLL makes 10 to 400 MHz, not 500 MHz$"):
        ecp5_pll(25.0, 500.0)
    with pytest.raises(ValueError, match=r"^the iCE40 PLL makes 16 to 275 MHz, not 8 MHz$"):
        ice40_pll(12.0, 8.0)


def _instances(fragment: Fragment) -> list[Instance]:
    found = [fragment] if isinstance(fragment, Instance) else []
    for sub, *_ in fragment.subfragments:
        found += _instances(sub)
    return found


@pytest.mark.parametrize("board, mhz, primitive, params", [
    ("ulx3s", 40.0, "EHXPLLL", {"CLKI_DIV": 5, "CLKFB_DIV": 8, "CLKOP_DIV": 15, "FEEDBK_PATH": "CLKOP"}),
    ("icebreaker", 24.0, "SB_PLL40_PAD", {"DIVR": 0, "DIVF": 63, "DIVQ": 5, "FILTER_RANGE": 1}),
])
def test_board_top_with_a_pll(tmp_path: Path, board: str, mhz: float, primitive: str, params: dict) -> None:
    """The board design holds the PLL with ecppll's / icepll's dividers, and the UART divisor follows its clock."""
    from hardwire.quant.qmodel import QModel

    folder = _tiny(tmp_path / "tiny", "rom")
    top = BoardTop(QModel.load(folder), lanes=4, storage="rom", board=board, clock_mhz=mhz)
    assert top.clk_hz == round(mhz * 1e6) and top.core.divisor == round(mhz * 1e6 / 115200)
    plls = [inst for inst in _instances(Fragment.get(top, top.platform)) if inst.type == primitive]
    assert len(plls) == 1
    assert {key: plls[0].parameters[key] for key in params} == params
    # without --clock-mhz the platform's own clock domain runs the design straight from the oscillator
    plain = BoardTop(QModel.load(folder), lanes=4, storage="rom", board=board)
    assert plain.pll is None and plain.clock_mhz == (25.0 if board == "ulx3s" else 12.0)
    assert not [inst for inst in _instances(Fragment.get(plain, plain.platform)) if inst.type == primitive]


def test_asic_gates_and_transistors(tmp_path: Path) -> None:
    # the standard-cell mapping itself is tested in tests/test_boards_asic.py; here the report's totals add up
    folder = _tiny(tmp_path / "tiny_logic", "logic", lanes=1, model=TOOL_RUN)
    start = time.time()
    result = build_asic(folder, progress=True)
    print(f"\n[timing] ASIC synthesis of the tiny logic-storage model: {time.time() - start:.0f} s")
    assert result == json.loads((folder / "build_asic.json").read_text())
    assert result["cell_count"] == sum(result["cells"].values()) > 0
    assert result["flip_flops"] > 0 and result["cells"]["sky130_fd_sc_hd__nand2_1"] > 0
    assert result["sram_bits"] > 0 and result["rom_bits"] == 0  # the KV cache and buffers stay SRAM; no ROM
    logic = sum(count * result["transistors_per_cell"][name] for name, count in result["cells"].items())
    assert result["logic_transistors"] == logic
    assert result["transistors"] == logic + result["sram_transistors"]
    assert result["sram_transistors"] >= 6 * result["sram_bits"]  # 6T cells, plus the periphery


def test_asic_refuses_what_is_not_a_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "empty"
    folder.mkdir()
    expected = (f"{folder} is not a build folder (no decoder.v or report.json); make one with `hardwire compile "
                f"MODEL.onnx --weights logic|rom -o {folder}`")
    with pytest.raises(FileNotFoundError) as err:
        build_asic(folder)
    assert str(err.value) == expected
    assert main(["build", str(folder), "--target", "asic"]) == 2
    assert capsys.readouterr().err == f"hardwire: error: {expected}\n"

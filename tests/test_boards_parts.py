"""The boards beyond the ULX3S-85F and the iCEBreaker (issue 33): their fit checks, names, pins, flash commands,
and one real Gowin place and route (the Tang Nano 20K, the tiny model of tests/test_boards_build.py's TOOL_RUN)."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from random_ir import random_ir
from test_boards_build import TOOL_RUN, _tiny
from test_boards_flash import _fake_loader

from hardwire.boards.parts import (
    PARTS,
    FitError,
    board_name,
    check_fit,
    check_synthesis,
    estimate_model,
    part,
    utilisation_from_cells,
)
from hardwire.boards.plls import gowin_rpll
from hardwire.boards.sizing import size_for_board
from hardwire.boards.top import BoardTop
from hardwire.cli import main
from hardwire.quant.qmodel import QModel
from hardwire.quant.quantize import quantize
from hardwire.rtl.plan import HardwarePlan

NEW_BOARDS = ("ulx3s_12f", "ulx3s_25f", "ulx3s_45f", "colorlight_5a75b", "orangecrab_25f", "orangecrab_85f",
              "tang_nano_20k", "tang_primer_25k", "tang_console_60k", "tang_mega_138k")
# a model bigger than the largest new part's block RAM (the Tang Mega 138K's 340 x 18 Kbit = 6.3 Mbit): about 9 Mbit
# of int8 weights
BIG = {"vocab": 1024, "d": 128, "layers": 6, "heads": 4, "kv_heads": 4, "ffn": 256, "context": 64}


@pytest.fixture(scope="module")
def big_model() -> QModel:
    return quantize(random_ir(**BIG), "int8", context=BIG["context"])


@pytest.fixture(scope="module")
def tiny_model() -> QModel:
    return quantize(random_ir(**TOOL_RUN), "int8", context=TOOL_RUN["context"])


@pytest.mark.parametrize("board", NEW_BOARDS)
def test_fit_check_refuses_a_big_model_with_numbers(big_model: QModel, board: str) -> None:
    target = PARTS[board]
    fit = estimate_model(big_model, target, HardwarePlan(storage="rom", lanes=4), label="big (int8)")
    with pytest.raises(FitError) as err:
        fit.check()
    message = str(err.value)
    assert f"big (int8) needs {fit.block_bits:,} block-RAM bits ({fit.blocks:,} {target.bram_name} of 18,432 bits" \
        in message
    assert f"the {target.title} has {target.bram_bits:,} ({target.bram_blocks} {target.bram_name})" in message
    assert fit.blocks > target.bram_blocks


@pytest.mark.parametrize("board", [b for b in NEW_BOARDS if b != "ulx3s_12f"])
def test_fit_check_accepts_a_small_model(tiny_model: QModel, board: str) -> None:
    target = PARTS[board]
    fit = estimate_model(tiny_model, target, HardwarePlan(storage="rom", lanes=1), label="tiny")
    assert fit.problems() == [] and 0 < fit.blocks <= target.bram_blocks


def test_the_12f_is_too_small_for_any_decoder(tiny_model: QModel) -> None:
    """Its 28 multipliers are fewer than the decoder's fixed units take, so its products are LUTs (-nodsp), and the
    smallest decoder measured so needs more LUT4s than the 12F has."""
    fit = estimate_model(tiny_model, PARTS["ulx3s_12f"], HardwarePlan(storage="rom", lanes=1), label="tiny")
    assert fit.problems() == ["tiny needs at least 19,659 LUT4s (the smallest decoder measured), the ULX3S-12F has "
                              "12,000"]


def test_the_12f_is_refused_before_any_quantisation() -> None:
    """Sizing for a part under the LUT floor stops at once (it used to quantise every scheme first: two minutes)."""
    def quantise(scheme: str) -> QModel:
        raise AssertionError(f"quantised {scheme} for a part no decoder fits")

    with pytest.raises(FitError, match=r"^no model fits the ULX3S-12F: the decoder needs at least 19,659 LUT4s \(the "
                                       r"smallest decoder measured\), the ULX3S-12F has 12,000$"):
        size_for_board(quantise, PARTS["ulx3s_12f"], scheme=None, plan=None)


def test_routable_limits_follow_the_part() -> None:
    """The limits were measured on the LFE5U-85F: the OrangeCrab 85F carries the same part, the smaller ECP5s none."""
    limits = {name: (p.routable_macs, p.routable_input_bits, p.routable_attention_rows) for name, p in PARTS.items()}
    assert limits["orangecrab_85f"] == limits["ulx3s"] == (128, 640, 2)
    assert limits["ulx3s_45f"] == limits["orangecrab_25f"] == (None, None, None)


def test_parts_table_figures() -> None:
    """The counts each part is checked against (sources in boards/parts.py: data sheets, nextpnr's reports)."""
    figures = {name: (p.luts, p.bram_blocks, p.dsps, p.clock_mhz, p.family) for name, p in PARTS.items()}
    assert figures["ulx3s"] == (83_640, 208, 156, 25.0, "ecp5")
    assert figures["ulx3s_12f"] == (12_000, 32, 28, 25.0, "ecp5")
    assert figures["ulx3s_25f"] == figures["colorlight_5a75b"] == (24_288, 56, 28, 25.0, "ecp5")
    assert figures["ulx3s_45f"] == (43_848, 108, 72, 25.0, "ecp5")
    assert figures["orangecrab_25f"] == (24_288, 56, 28, 48.0, "ecp5")
    assert figures["orangecrab_85f"] == (83_640, 208, 156, 48.0, "ecp5")
    assert figures["tang_nano_20k"] == (20_736, 46, 48, 27.0, "gowin")
    # the GW5A's multipliers counted as MULT12X12, two per DSP block (boards/gowin_dsp.py maps the products onto them)
    assert figures["tang_primer_25k"] == (23_040, 56, 56, 50.0, "gowin")
    assert figures["tang_console_60k"] == (59_904, 118, 236, 50.0, "gowin")
    assert figures["tang_mega_138k"] == (138_240, 340, 596, 50.0, "gowin")
    # multipliers used only where there are more than the decoder's fixed units take
    assert [name for name, p in PARTS.items() if not p.infers_dsps] == [
        "ulx3s_12f", "ulx3s_25f", "colorlight_5a75b", "orangecrab_25f", "tang_primer_25k", "tang_console_60k",
        "icebreaker"]
    assert PARTS["ulx3s"].other_dsps == 60
    nano = PARTS["tang_nano_20k"]  # 18 + 3 per norm lane, measured at 1 x 4 and 1 x 8 (34 and 50 with their lanes)
    assert [nano.fixed_dsps_at(HardwarePlan(storage="rom", rows=1, lanes=lanes)) + lanes for lanes in (4, 8)] == \
        [34, 50]
    assert all(p.sources for p in PARTS.values())


def test_board_names() -> None:
    assert board_name("Tang-Nano-20K") == "tang_nano_20k"
    assert board_name("ulx3s-85f") == board_name("ULX3S_85F") == "ulx3s"  # the 85F keeps its old name
    assert part("ulx3s-25f") is PARTS["ulx3s_25f"]
    with pytest.raises(ValueError, match="unknown board 'tang_nano_9k'; known boards: ulx3s, ulx3s_12f"):
        part("tang_nano_9k")


def test_cli_takes_the_new_board_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from hardwire.boards import fpga

    calls = []
    monkeypatch.setattr(fpga, "build_board", lambda folder, board, **kw: calls.append(board))
    for name in (*NEW_BOARDS, "tang-mega-138k", "ulx3s-85f"):
        assert main(["build", str(tmp_path), "--board", name]) == 0
    assert calls == [*NEW_BOARDS, "tang_mega_138k", "ulx3s"]
    with pytest.raises(SystemExit) as exit_:
        main(["build", str(tmp_path), "--board", "tang_nano_9k"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --board: invalid choice: 'tang_nano_9k' (choose from 'ulx3s', 'ulx3s_12f'" in err
    assert "'tang_mega_138k', 'icebreaker')" in err


def test_tang_console_is_refused_at_build_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _tiny(tmp_path / "tiny", "rom", lanes=1, model=TOOL_RUN)
    assert main(["build", str(folder), "--board", "tang_console_60k"]) == 2
    err = capsys.readouterr().err
    assert "the fit check passes" in err and "no chip database for the GW5AT-60" in err
    assert not (folder / "board_tang_console_60k").exists()
    check_fit(folder, "tang_console_60k")  # the fit check itself runs and passes


@pytest.mark.parametrize("board", [b for b in NEW_BOARDS if PARTS[b].platform])
def test_board_top_requests_the_boards_pins(tmp_path_factory: pytest.TempPathFactory, tiny_model: QModel,
                                            board: str) -> None:
    """Each new board's design elaborates on its platform: UART, LEDs and clock found, constraints written."""
    top = BoardTop(tiny_model, lanes=1, storage="rom", board=board)
    out = tmp_path_factory.mktemp(board)
    top.platform.prepare(top, name="top").extract(str(out))
    constraints = (out / ("top.cst" if PARTS[board].family == "gowin" else "top.lpf")).read_text()
    uart = top.platform.lookup("uart", 0)
    pins = {sub.name: sub.ios[0].names[0] for sub in uart.ios}
    for name in ("tx", "rx"):  # on the board's pins
        assert f'SITE "{pins[name]}"' in constraints or f" {pins[name]};" in constraints, (name, pins[name])
    commands = json.loads((out / "build_top.json").read_text())["commands"]
    if PARTS[board].family == "gowin":
        assert [c[0] for c in commands] == ["yosys", "nextpnr-himbaechel-gowin", "gowin_pack"]


def test_gw5a_boards_refuse_a_pll_clock(tiny_model: QModel) -> None:
    with pytest.raises(ValueError, match=r"^the Tang Primer 25K runs at its 50 MHz oscillator: hardwire sets up the "
                                         r"GW2A's rPLL, not the GW5A's PLLA yet \(leave out --clock-mhz\)$"):
        BoardTop(tiny_model, lanes=1, storage="rom", board="tang_primer_25k", clock_mhz=40.0)


@pytest.mark.parametrize("mhz, exact", [(54.0, True), (45.0, True), (40.0, False), (81.0, True), (33.75, True)])
def test_gw2a_rpll_dividers(mhz: float, exact: bool) -> None:
    """f_out = 27 * (FBDIV_SEL + 1) / (IDIV_SEL + 1) with the PFD, VCO and ODIV_SEL in the GW2A's ranges; exact where
    the ratio allows it (40 MHz needs a PFD of 1 MHz: the nearest legal setting instead)."""
    pll = gowin_rpll(27.0, mhz)
    assert pll.f_out_mhz == 27.0 * (pll.fbdiv_sel + 1) / (pll.idiv_sel + 1)
    assert 27.0 / (pll.idiv_sel + 1) >= 3.0 and 500.0 <= pll.f_vco_mhz == pll.f_out_mhz * pll.odiv_sel <= 1250.0
    assert pll.odiv_sel in (2, 4, 8, 16, 32, 48, 64, 80, 96, 112, 128) and 0 <= pll.idiv_sel < 64 > pll.fbdiv_sel
    assert (pll.f_out_mhz == mhz) == exact and abs(pll.f_out_mhz - mhz) < 0.7
    with pytest.raises(ValueError, match=r"the GW2A PLL makes 3\.90625 to 625 MHz, not 700 MHz"):
        gowin_rpll(27.0, 700.0)


def test_tang_nano_20k_clock_from_its_rpll(tmp_path: Path, tiny_model: QModel) -> None:
    """--clock-mhz on the Nano: an rPLL from the 27 MHz pin, the core held in reset until it locks."""
    top = BoardTop(tiny_model, lanes=1, storage="rom", board="tang_nano_20k", clock_mhz=54.0)
    assert top.clock_mhz == 54.0 and top.pll == gowin_rpll(27.0, 54.0)
    top.platform.prepare(top, name="top").extract(str(tmp_path))
    rtlil = (tmp_path / "top.il").read_text()
    assert "cell \\rPLL " in rtlil and "parameter \\FCLKIN \"27\"" in rtlil
    assert f"parameter \\FBDIV_SEL {top.pll.fbdiv_sel}" in rtlil and "LOCK" in rtlil


@pytest.mark.parametrize("board, args, file", [
    ("tang_nano_20k", ["-b", "tangnano20k"], "top.fs"),
    ("tang_primer_25k", ["-b", "tangprimer25k"], "top.fs"),
    ("tang_mega_138k", ["-b", "tangmega138k"], "top.fs"),
    ("ulx3s_25f", ["-b", "ulx3s"], "top.bit"),
    ("colorlight_5a75b", ["-b", "colorlight"], "top.bit"),
    ("orangecrab_85f", ["-b", "orangecrab"], "top.bit"),
])
def test_flash_the_new_boards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, board: str, args: list[str],
                              file: str) -> None:
    folder = tmp_path / "build"
    (folder / f"board_{board}").mkdir(parents=True)
    (folder / f"board_{board}" / file).write_bytes(b"\xff\x00bitstream")
    bindir = _fake_loader(tmp_path, code=0, output="Done")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("OPENFPGALOADER", raising=False)
    assert main(["flash", str(folder), "--board", board]) == 0
    bit = str(folder / f"board_{board}" / file)
    assert (tmp_path / "args.txt").read_text().split() == [*args, bit]
    assert main(["flash", str(folder), "--board", board, "--flash"]) == 0
    flash_flag = [] if board.startswith("orangecrab") else ["-f"]  # the OrangeCrab's DFU always writes its flash
    assert (tmp_path / "args.txt").read_text().split() == [*args, *flash_flag, bit]


@pytest.mark.xdist_group("gowin_build")
def test_tang_nano_20k_bitstream(tmp_path: Path) -> None:
    """The Gowin flow for real: yosys synth_gowin, nextpnr-himbaechel, gowin_pack on the tiny model (GW2A-18C)."""
    folder = _tiny(tmp_path / "tiny_rom", "rom", lanes=1, model=TOOL_RUN)
    start = time.time()
    from hardwire.boards.fpga import build_board

    result = build_board(folder, "tang_nano_20k", progress=True)
    print(f"\n[timing] Tang Nano 20K bitstream of the tiny model: {time.time() - start:.0f} s "
          f"(tools: {result['tool_seconds']})")
    assert result == json.loads((folder / "build_tang_nano_20k.json").read_text())
    assert 0 < result["luts"] < result["luts_available"] == 20_736 and result["ffs"] > 0
    assert 0 < result["brams"] == result["brams_estimated"], result  # B-SRAM as boards/memories.py counts it
    assert 0 < result["dsps"] <= 48  # MULT18X18 (a MULT9X9 counted as half)
    assert result["clock_mhz"] == 27.0 and result["fmax_mhz"] > 0
    assert result["timing_met"] == (result["fmax_mhz"] >= 27.0)
    bit = Path(result["bitstream"])
    assert bit == folder / "board_tang_nano_20k" / "top.fs" and bit.stat().st_size > 100_000


def test_gw5a_products_on_mult12x12() -> None:
    """synth_gowin infers no GW5A multiplier: the Mega 138K's products are cut into MULT12X12 before it runs
    (boards/gowin_dsp.py), counted in MULT12X12, two per MAC lane; the Primer 25K's 56 are fewer than the fixed units
    take, so its products stay in LUTs (-nodsp), as on the ECP5-25F."""
    from hardwire.boards import gowin_dsp
    from hardwire.boards.fpga import _synthesis_script

    mega, primer = PARTS["tang_mega_138k"], PARTS["tang_primer_25k"]
    script = _synthesis_script(mega)
    assert script["script_after_read"] == gowin_dsp.SCRIPT and "-nodsp" not in script["synth_opts"]
    assert "DSP_NAME=$__MUL12X12" in gowin_dsp.SCRIPT and gowin_dsp.MAP_FILE in gowin_dsp.SCRIPT
    assert "MULT12X12 __TECHMAP_REPLACE__" in gowin_dsp.MULT12X12_MAP
    assert "script_after_read" not in _synthesis_script(primer) and "-nodsp" in _synthesis_script(primer)["synth_opts"]
    assert utilisation_from_cells(mega, {"MULT12X12": 511, "MULTADDALU12X12": 2})["dsps"] == 515
    assert utilisation_from_cells(PARTS["tang_nano_20k"], {"MULT18X18": 33, "MULT9X9": 9})["dsps"] == 38
    plan = HardwarePlan(storage="rom", rows=4, lanes=32, attention_rows=2, softmax_lanes=8)
    fixed = mega.fixed_dsps_at(plan)
    assert fixed == 255 and mega.dsps_per_mac_lane == 2  # 511 MULT12X12 measured at this shape: 256 + 255
    too_many = HardwarePlan(storage="rom", rows=8, lanes=32, attention_rows=2, softmax_lanes=8)
    assert mega.fixed_dsps_at(too_many) + 2 * 256 > mega.dsps  # 8 x 32 on DSPs would need 767 of 596


def test_the_nano_refuses_after_synthesis_what_it_cannot_place() -> None:
    """The small model at int4 2 x 4 without LoRA synthesised to 16,504 LUT4 + ALU, which nextpnr packed into 19,775
    sites (95%) and could not place: the synthesis check scales by the measured 1.2 and holds to 90%, so that build
    is refused in a minute instead of after eight of placement; a design a third smaller passes."""
    nano = PARTS["tang_nano_20k"]
    cells = {"LUT4": 13_508, "ALU": 2_996, "DFF": 8_681, "SDPB": 44, "MULT18X18": 27, "MULT9X9": 9}
    with pytest.raises(FitError, match=re.escape(
            "r2l4n needs after synthesis 19,805 LUT4 sites in placement (16,504 in synthesis x 1.2, measured), more "
            "than the 90% of its LUT4s a placement was measured to find room in (the Tang Nano 20K has 18,662); ")):
        check_synthesis(nano, cells, "r2l4n")
    check_synthesis(nano, {**cells, "LUT4": 9_000, "ALU": 2_000}, "smaller")
    with pytest.raises(FitError, match=re.escape(  # with LoRA and LUT RAM: 22,241 sites in nextpnr's packing
            "r2l4 needs after synthesis 22,208 LUT4 sites in placement (15,307 in synthesis x 1.2 and 384 LUT RAM x 10, "
            "measured), more than")):
        check_synthesis(nano, {**cells, "LUT4": 12_311, "RAM16SDP4": 384}, "r2l4")
    check_synthesis(PARTS["ulx3s"], {"LUT4": 80_000, "TRELLIS_FF": 10}, "the 85F counts synthesis LUTs as they are")

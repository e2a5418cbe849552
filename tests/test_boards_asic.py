"""The ASIC target on a real standard-cell library (sky130_fd_sc_hd), and the mask-ROM / SRAM macro model.

Two syntheses of the smallest tool-run model (one `--weights logic`, one `--weights rom`, about 40 s each here) are
shared by the tests through module fixtures; the model arithmetic and the timing of a hand-made netlist take
milliseconds.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import subprocess
import time
from pathlib import Path

import pytest
from random_ir import random_ir

from hardwire.boards.asic import LIBRARIES, build_asic, readmem_inits
from hardwire.boards.fpga import tool_command
from hardwire.boards.liberty import parse_library, read_text, static_timing
from hardwire.boards.rom_macro import SKY130, macro, organise
from hardwire.cli import main
from hardwire.quant.quantize import quantize
from hardwire.rtl.build import TOP_NAME, compile_to

TOOL_RUN = {"vocab": 16, "d": 8, "layers": 1, "heads": 2, "kv_heads": 1, "ffn": 16, "context": 8}
LIBERTY = LIBRARIES["sky130hd"].liberty


def _build(folder: Path, storage: str) -> Path:
    qm = quantize(random_ir(**TOOL_RUN), "int8", context=TOOL_RUN["context"])
    compile_to(qm, folder, lanes=1, storage=storage, progress=False)
    return folder


def _liberty_areas() -> dict[str, float]:
    """Cell -> area read straight from the liberty text (not through boards/liberty.py)."""
    text = gzip.decompress(LIBERTY.read_bytes()).decode()
    found = re.findall(r'^\s*cell\s*\(\s*"([^"]+)"\s*\)\s*\{(?:(?!^\s*cell\s*\().)*?^\s*area\s*:\s*([0-9.eE+-]+)',
                       text, re.M | re.S)
    return {name: float(area) for name, area in found}


@pytest.fixture(scope="module")
def areas() -> dict[str, float]:
    return _liberty_areas()


def _timed_asic_build(tmp_path_factory: pytest.TempPathFactory, storage: str) -> tuple[Path, dict]:
    """The tiny model compiled with `storage` weights and synthesised to sky130hd, with its time printed."""
    folder = _build(tmp_path_factory.mktemp("asic") / storage, storage)
    start = time.time()
    result = build_asic(folder, progress=True)
    print(f"\n[timing] sky130hd synthesis of the tiny {storage}-storage model: {time.time() - start:.0f} s")
    return folder, result


@pytest.fixture(scope="module")
def logic_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    return _timed_asic_build(tmp_path_factory, "logic")


@pytest.fixture(scope="module")
def rom_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    return _timed_asic_build(tmp_path_factory, "rom")


@pytest.mark.xdist_group("asic_logic")
def test_cells_are_the_library_s_and_areas_add_up(logic_build: tuple[Path, dict], areas: dict[str, float]) -> None:
    folder, result = logic_build
    assert len(areas) == 428  # the whole sky130_fd_sc_hd library, one corner
    assert result == json.loads((folder / "build_asic.json").read_text())
    # every cell of the netlist is a library cell: no yosys generic gate ($_NAND_, $_DFF_P_, ...) is left
    netlist = json.loads((folder / "asic" / "asic_netlist.json").read_text())["modules"][TOP_NAME]
    types = {cell["type"] for cell in netlist["cells"].values()} - {"$scopeinfo", "$mem_v2"}
    assert types and types <= set(areas)
    assert set(result["cells"]) == types
    assert result["cells"]["sky130_fd_sc_hd__dfxtp_1"] > 0 and result["flip_flops"] >= result["cells"][
        "sky130_fd_sc_hd__dfxtp_1"]
    # the area is the liberty's areas times the counts, and yosys's own `stat -liberty` agrees
    expected = sum(count * areas[name] for name, count in result["cells"].items())
    assert expected > 0
    assert result["logic_area_um2"] == pytest.approx(expected, rel=1e-6)
    assert result["yosys_logic_area_um2"] == pytest.approx(expected, rel=1e-6)
    assert result["cell_area_um2"] == {name: areas[name] for name in result["cells"]}
    # a logic build has no ROM: its weights and tables are cells; the KV cache and buffers are SRAM macros
    assert result["rom_bits"] == 0 and result["rom"] == [] and result["sram_bits"] > 0
    assert result["area_um2"] == pytest.approx(result["logic_area_um2"] + result["sram_area_um2"], abs=1e-2)
    # transistors from the library's SPICE netlists: a NAND2 has 4, the plain D flip-flop 24
    assert result["transistors_per_cell"]["sky130_fd_sc_hd__nand2_1"] == 4
    assert result["transistors_per_cell"]["sky130_fd_sc_hd__dfxtp_1"] == 24


@pytest.mark.xdist_group("asic_logic")
def test_clock_figure(logic_build: tuple[Path, dict]) -> None:
    _, result = logic_build
    assert result["library"] == "sky130hd" and "130 nm" in result["node"] and "tt_025C_1v80" in result["corner"]
    assert 1.0 < result["critical_path_ns"] < 100.0
    assert result["logic_max_clock_mhz"] == round(1000.0 / result["critical_path_ns"], 1)
    assert result["critical_path_depth"] >= 5
    assert all(c.startswith("sky130_fd_sc_hd__") for c in result["critical_path_cells"][1:])
    assert result["clock_mhz"] == min(result["clock_limits_mhz"].values())
    assert result["clock_limits_mhz"]["sram"] == SKY130.cycle_mhz


@pytest.mark.xdist_group("asic_rom")
def test_rom_build_reports_logic_rom_and_sram(rom_build: tuple[Path, dict], areas: dict[str, float]) -> None:
    folder, result = rom_build
    report = json.loads((folder / "report.json").read_text())
    for key in ("library", "node", "corner", "cells", "flip_flops", "logic_area_um2", "rom_area_um2",
                "sram_area_um2", "area_um2", "transistors", "transistors_per_parameter", "critical_path_ns",
                "clock_mhz", "clock_limited_by", "memory_model", "weight_rom_bits"):
        assert key in result, key
    assert set(result["cells"]) <= set(areas)
    assert result["logic_area_um2"] == pytest.approx(sum(n * areas[c] for c, n in result["cells"].items()), rel=1e-6)
    # the weights are mask-ROM macros: their bits are the build's weight bits, at about one transistor a bit
    assert result["weight_rom_bits"] == report["weight_storage_bits"]
    assert result["rom_bits"] == sum(m["bits"] * m["copies"] for m in result["rom"]) >= result["weight_rom_bits"]
    assert all(m["kind"] == "rom" for m in result["rom"]) and all(m["kind"] == "sram" for m in result["sram"])
    assert result["rom_area_um2"] == pytest.approx(sum(m["area_um2"] for m in result["rom"]), abs=1e-2)
    assert result["area_um2"] == pytest.approx(result["logic_area_um2"] + result["rom_area_um2"]
                                               + result["sram_area_um2"], abs=1e-2)
    assert result["transistors"] == result["logic_transistors"] + result["rom_transistors"] + result[
        "sram_transistors"]
    assert result["weight_rom_transistors"] >= result["weight_rom_bits"]  # one a bit, plus the periphery
    # one transistor a bit (8-bit codes: 8 a parameter) plus the periphery, which small macros make a large share of
    assert result["weight_rom_transistors"] < 1.5 * result["weight_rom_bits"]
    assert result["weight_rom_transistors_per_parameter"] == round(result["weight_rom_transistors"] / report["params"],
                                                                   2)
    assert result["clock_limits_mhz"]["rom_read"] == SKY130.cycle_mhz
    assert result["clock_mhz"] == min(result["clock_limits_mhz"].values())


@pytest.mark.xdist_group("asic_rom")
def test_a_second_run_gives_the_same_report(rom_build: tuple[Path, dict]) -> None:
    folder, first = rom_build
    second = build_asic(folder, progress=False)
    assert {k: v for k, v in second.items() if k != "seconds"} == {k: v for k, v in first.items() if k != "seconds"}


def test_rom_model_on_known_examples() -> None:
    # 1024 x 32: four words a row make a 256 x 128 array (the squarest: 512 x 64 and 128 x 256 are further off
    # square or tie later)
    assert organise(1024, 32) == (256, 128, 4)
    assert organise(24, 14) == (24, 14, 1)
    rom = macro("rom", 1024, 32, SKY130)
    assert rom["bits"] == 32768
    assert rom["array_um2"] == pytest.approx(32768 * 0.36 * 0.69, rel=1e-3)  # 8,139.6 um^2 of NAND-ROM cells
    assert rom["area_um2"] == pytest.approx(32768 * 0.2484 / 0.2423, rel=1e-3)  # 33,593 um^2 with the periphery
    assert rom["transistors"] == 32768 + 256 * 8 + 128 * 6 + 32 * 10 == 35904
    # the SRAM of the same shape is the published OpenRAM sky130 1024 x 32 macro the model is calibrated on
    sram = macro("sram", 1024, 32, SKY130)
    assert sram["area_um2"] == pytest.approx(534277, rel=1e-3)
    assert sram["transistors"] == 6 * 32768 + 256 * 8 + 128 * 6 + 32 * 10
    # copies (one a read port) multiply everything
    two = macro("rom", 1024, 32, SKY130, copies=2)
    assert two["area_um2"] == pytest.approx(2 * rom["area_um2"], abs=1e-2) and two["transistors"] == 2 * 35904
    with pytest.raises(ValueError):
        macro("flash", 16, 8, SKY130)


def test_static_timing_of_a_hand_made_netlist() -> None:
    """flop -> inverter x n -> flop: the path grows by one inverter's delay at a time and starts with clock-to-Q."""
    lib = parse_library(read_text(LIBERTY), {"sky130_fd_sc_hd__dfxtp_1", "sky130_fd_sc_hd__inv_1"})

    def chain(n: int) -> dict:
        cells = {"ff0": {"type": "sky130_fd_sc_hd__dfxtp_1", "connections": {"CLK": [2], "D": [3], "Q": [10]}},
                 "ff1": {"type": "sky130_fd_sc_hd__dfxtp_1", "connections": {"CLK": [2], "D": [10 + n], "Q": [3]}}}
        for k in range(n):
            cells[f"inv{k}"] = {"type": "sky130_fd_sc_hd__inv_1", "connections": {"A": [10 + k], "Y": [11 + k]}}
        return {"ports": {"clk": {"direction": "input", "bits": [2]}}, "cells": cells}

    paths = [static_timing(chain(n), lib) for n in (0, 1, 2, 8)]
    assert [p["path_depth"] for p in paths] == [0, 1, 2, 8]  # logic cells between the flops
    assert all(p["endpoint"] == "ff1.D" for p in paths[1:])  # (with no inverter both flops' D pins tie)
    assert all(p["combinational_loops"] == 0 for p in paths)
    delays = [p["critical_path_ns"] for p in paths]
    assert delays == sorted(delays) and len(set(delays)) == 4
    q = lib.cells["sky130_fd_sc_hd__dfxtp_1"]
    clk_to_q = max(t.lookup(lib.default_slew, q.inputs["D"]) for arc in q.outputs["Q"] for t in arc.delay)
    assert 0.1 < clk_to_q < delays[0] < 1.0  # clock-to-Q + setup: a few hundred ps in sky130
    assert 0.01 < delays[2] - delays[1] < 0.2  # one more inverter, loaded by an inverter: tens of ps
    assert not math.isclose(delays[3], delays[2])
    # the one-inverter path by hand: clock-to-Q into the inverter's input, the inverter at the Q slew into the flop's
    # D pin, and the setup at the inverter's output slew
    inv = lib.cells["sky130_fd_sc_hd__inv_1"]
    s0 = lib.default_slew
    q_delay = max(t.lookup(s0, inv.inputs["A"]) for arc in q.outputs["Q"] for t in arc.delay)
    q_slew = max(t.lookup(s0, inv.inputs["A"]) for arc in q.outputs["Q"] for t in arc.slew)
    inv_delay = max(t.lookup(q_slew, q.inputs["D"]) for arc in inv.outputs["Y"] for t in arc.delay)
    inv_slew = max(t.lookup(q_slew, q.inputs["D"]) for arc in inv.outputs["Y"] for t in arc.slew)
    setup = max(t.lookup(s0, inv_slew) for arc in q.constraints["D"] for t in arc.delay)
    assert delays[1] == pytest.approx(q_delay + inv_delay + setup, abs=1e-4)


def test_unknown_library_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "any"
    folder.mkdir()
    expected = "unknown --library 'nangate99': the ASIC target knows sky130hd"
    with pytest.raises(ValueError) as err:
        build_asic(folder, library="nangate99")
    assert str(err.value) == expected
    assert main(["build", str(folder), "--target", "asic", "--library", "nangate99"]) == 2
    assert capsys.readouterr().err == f"hardwire: error: {expected}\n"
    assert not (folder / "asic").exists() and not (folder / "build_asic.json").exists()


def test_memory_inits_become_readmemh_with_the_same_words(tmp_path: Path) -> None:
    """build_asic hands yosys `$readmemh` files for the initial blocks of memories over 1,024 words (yosys reads
    thousands of `mem[i] = ...` assignments in time quadratic in their number): the words, gaps, decimal words and
    escaped names are kept, smaller blocks and any block of another form are left alone."""
    verilog = "\n".join([
        "module m (clk);",
        "  reg [7:0] mem [5:0];",
        "  initial begin",
        "    mem[0] = 8'hff;",
        "    mem[1] = 8'h0a;",
        "    mem[4] = 8'd17;",
        "  end",
        "  reg [3:0] \\buf  [1:0];",
        "  initial begin",
        "    \\buf [0] = 4'h3;",
        "    \\buf [1] = 4'h0;",
        "  end",
        "  reg [3:0] r;",
        "  initial begin",
        "    r[0] = 1'h1;",
        "  end",
        "endmodule",
    ])
    assert readmem_inits(verilog, tmp_path) == verilog and not list(tmp_path.iterdir())  # small blocks: as written
    out = readmem_inits(verilog, tmp_path, min_words=1)
    assert 'initial $readmemh("init0.hex", mem);' in out and 'initial $readmemh("init1.hex", \\buf );' in out
    assert (tmp_path / "init0.hex").read_text() == "@0\nff\n0a\n@4\n11\n"
    assert (tmp_path / "init1.hex").read_text() == "@0\n3\n0\n"
    assert "r[0] = 1'h1;" in out and not (tmp_path / "init2.hex").exists()  # not a memory: kept as written


def _memory_inits(folder: Path, source: str) -> dict:
    (folder / "m.ys").write_text(f"read_verilog {source}\nhierarchy -top {TOP_NAME}\nproc\nflatten\nmemory_collect\n"
                                 f"write_json m.json\n")
    subprocess.run([tool_command("yosys"), "-q", "m.ys"], cwd=folder, check=True, capture_output=True)
    cells = json.loads((folder / "m.json").read_text())["modules"][TOP_NAME]["cells"].values()
    mems = [(c["parameters"]["MEMID"], c["parameters"]["INIT"]) for c in cells if c["type"] == "$mem_v2"]
    # the ROMs yosys makes of case statements are numbered as it goes: compared by their contents
    return {"named": {k: v for k, v in mems if "$auto$" not in k}, "auto": sorted(v for k, v in mems if "$auto$" in k)}


def test_readmemh_gives_yosys_the_same_memories(tmp_path: Path) -> None:
    """The tiny ROM build's memories (weights, tables, KV cache) read by yosys from the rewritten Verilog have the
    INIT of the Verilog as compiled, bit for bit."""
    folder = _build(tmp_path / "rom", "rom")
    (folder / "new.v").write_text(readmem_inits((folder / "decoder.v").read_text(), folder, min_words=1))
    assert list(folder.glob("init*.hex"))
    original = _memory_inits(folder, "decoder.v")
    assert len(original["named"]) > 10 and _memory_inits(folder, "new.v") == original

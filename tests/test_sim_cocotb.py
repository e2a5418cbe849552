"""The generated Verilog under cocotb + Verilator decodes exactly the reference's tokens.

Each parametrised case compiles into its own build folder; the Verilated C++ is built
unoptimised (quick to build, and these simulations are short). The testbench itself
checks every generated token against quant.reference and fails the cocotb test otherwise;
the assertions here check what it recorded.

A Verilator build takes most of a minute (weights as logic: two to four), so each case here is
one that no other case covers: the Hugging Face Llama with grouped-query attention, each family
of docs/frontend.md in int8 and a 4-bit scheme (GPT-Neo's block is GPT-2's; Qwen3's q/k norm and BLOOM's ALiBi
each in a test of its own), the bundled model,
several engine shapes (weights as logic: tests/test_rtl_decoder.py; storage and scheme are
independent in the weight store, whose every word test_rtl_weight_store.py reads in both
storages for every format); the tests that can share a build (xdist_group) share it.

Every case compares the output after every token fed, the prompt's predictions included, and
proves itself first (tests/break_check.py): its reference outputs vary, and every deliberate
break of quant/mutations.py that applies to its model (attention, values, queries, the MLP, each
layer, the score scale, RoPE or the positions, and the family's own features) changes at least
one of them, so that a chip with that bug fails here.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch
from break_check import assert_case_catches
from random_ir import random_adapters, random_ir, scheme_options

from hardwire.cli import main
from hardwire.frontend import load
from hardwire.quant.mutations import breaks
from hardwire.quant.qmodel import QModel
from hardwire.quant.quantize import quantize
from hardwire.quant.reference import ReferenceDecoder, forward
from hardwire.rtl.build import compile_to
from hardwire.sim.runner import Feed, Generate, LoadLora, run_steps, simulate

pytestmark = pytest.mark.verilator  # fails, never skips, without Verilator (tests/conftest.py)

_IRS: dict[str, object] = {}


def _hf_ir(exported, name: str):
    if name not in _IRS:
        _IRS[name] = load(exported(name)[1])
    return _IRS[name]


def test_hf_llama_gqa_token_exact(exported, tmp_path):
    """The Llama family, int8 from ROM. mixed36 (int3 and int6 words): the Phi and OPT family cases and the cycle
    tests; weights as logic: tests/test_rtl_decoder.py (int8 and mixed36 words); MXFP4 with grouped-query
    attention: the Gemma case. GPT-2's block (LayerNorm, learned positions, GELU-tanh, biases, tied head) decodes in
    the GPT-Neo case, the same block after import (tests/test_frontend_import.py proves GPT-2's import)."""
    ir = _hf_ir(exported, "llama-gqa-untied")
    assert ir.config.n_kv_heads < ir.config.n_heads  # grouped-query attention
    qm = quantize(ir, "int8", context=16)
    assert {"kv_heads_rolled", "rope_off"} <= set(breaks(qm))
    want = assert_case_catches(qm, LLAMA_PROMPT, 8)
    compile_to(qm, tmp_path, lanes=8, storage="rom", progress=False)
    result = simulate(tmp_path, LLAMA_PROMPT, 8, seed=1, idle=0.2, stall=0.3, optimise=False, progress=False)
    assert result.match and result.outputs == want and len(result.tokens) == 8
    assert 0.5 < result.lane_utilisation <= 1.0


LLAMA_PROMPT = [5, 17, 3]
# per family: a prompt whose outputs vary and change under every break (found by trying a few), and the family
# features its breaks must include
FAMILY_CASES = {
    "neox": ([5, 17, 3], {"parallel_block_sequential", "partial_rotary_ignored", "rope_off"}),
    "phi": ([81, 61, 49], {"parallel_block_sequential", "partial_rotary_ignored", "rope_off"}),
    "gemma": ([5, 17, 3], {"rope_off", "scores_scaled"}),
    "opt": ([0, 11, 0], {"positions_zero", "positions_shifted"}),
    "gpt-neo": ([5, 61, 2], {"positions_zero", "positions_shifted", "scores_scaled"}),
}


@pytest.mark.parametrize("family,scheme", [
    ("neox", "int8"), ("neox", "mxfp4"), ("phi", "int8"), ("phi", "mixed36"), ("gemma", "int8"), ("gemma", "mxfp4"),
    ("opt", "int8"), ("opt", "mixed36"), ("gpt-neo", "int8"), ("gpt-neo", "mxfp4")])
def test_hf_family_token_exact(exported, tmp_path, family, scheme):
    """Each family of docs/frontend.md, int8 and a 4-bit scheme: GPT-NeoX's parallel block with two norms and a
    quarter of each head rotated, Phi's with one norm and half rotated, Gemma's GELU-tanh gate, single kv head and
    heads of 24 (4 x 24 = 96 over a residual of 64), OPT's ReLU table, GPT-Neo's q folded with its score scale (its
    window of 40 lies past this context: the small build's windowed layer decodes past a window). Each case's
    breaks include its family's features (FAMILY_CASES): rotating every dim of a partial-rotary head, running a
    parallel block sequentially, the learned positions zeroed or off by one (OPT's offset), the softmax's scale
    (GPT-Neo's folded into q)."""
    prompt, features = FAMILY_CASES[family]
    qm = quantize(_hf_ir(exported, family), scheme, context=16)
    assert features <= set(breaks(qm))
    want = assert_case_catches(qm, prompt, 8)
    compile_to(qm, tmp_path, lanes=8, storage="rom", progress=False)
    result = simulate(tmp_path, prompt, 8, seed=6, idle=0.2, stall=0.2, optimise=False, progress=False)
    assert result.match and result.outputs == want and len(result.tokens) == 8


QWEN3_PROMPT = [3, 9, 27, 40, 2, 77]  # its outputs vary and change under every break, the q/k norm skipped included


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_qwen3_per_head_qk_norm_token_exact(exported, tmp_path, scheme):
    """Qwen3's per-head q/k norm on the chip: raw q (then raw k) normalised head by head in place by a head-wide norm
    unit before RoPE reads it (numerics §6), token for token with the reference in int8 and int4, the int8 case with
    every token's cycles equal to the plan's (its qk_norm phases), the int4 case under idle input and backpressure.
    The case catches every break, the norm skipped (q and k into RoPE as projected) among them."""
    from hardwire.rtl.plan import HardwarePlan, cycles_per_token_estimate

    ir = _hf_ir(exported, "qwen3")
    assert ir.config.qk_norm
    qm = quantize(ir, scheme, context=24)
    assert "qk_norm_skipped" in breaks(qm)
    want = assert_case_catches(qm, QWEN3_PROMPT, 8)
    compile_to(qm, tmp_path, lanes=8, storage="rom", progress=False)
    timed = scheme == "int8"
    result = simulate(tmp_path, QWEN3_PROMPT, 8, seed=4, idle=0.0 if timed else 0.2, stall=0.0 if timed else 0.2,
                      optimise=False, progress=False)
    assert result.match and result.outputs == want and len(result.tokens) == 8
    if timed:
        plan = HardwarePlan(lanes=8)
        assert result.cycles == [cycles_per_token_estimate(qm, plan, p) for p in range(len(result.cycles))]


BLOOM_PROMPT = [60, 7, 33, 90, 12, 48, 3, 71]  # its outputs vary and change under every break, ALiBi's included


@pytest.mark.parametrize("scheme,rows", [("int8", 1), ("int4", 4)])
def test_bloom_alibi_token_exact(exported, tmp_path, scheme, rows):
    """BLOOM's ALiBi on the chip: each score of head h plus alibi[h] times its key's position (numerics §6), a running
    sum per beat in the epilogue, token for token with the reference over 20 positions, in int8 (one epilogue lane,
    every token's cycles equal to the plan's: the bias costs none) and int4 (4 x 8 with attention, the epilogue and
    the softmax on 4: scores pass in beats of 4, so that lanes 1-3 add their own multiple of the slope; under idle
    input and backpressure). The case catches every break, ALiBi dropped and each head given the next head's slope
    among them."""

    ir = _hf_ir(exported, "bloom")
    assert ir.config.positions == "alibi"
    qm = quantize(ir, scheme, context=24)
    assert {"alibi_dropped", "alibi_heads_rolled"} <= set(breaks(qm))
    want = assert_case_catches(qm, BLOOM_PROMPT, 12)
    compile_to(qm, tmp_path, lanes=8, rows=rows, attention_rows=rows, epilogue_lanes=rows, softmax_lanes=rows,
               storage="rom", progress=False)
    timed = scheme == "int8"
    result = simulate(tmp_path, BLOOM_PROMPT, 12, seed=5, idle=0.0 if timed else 0.2, stall=0.0 if timed else 0.2,
                      optimise=False, progress=False)
    assert result.match and result.outputs == want and len(result.tokens) == 12


GEMMA2_PROMPTS = {  # per scheme: varied outputs, and every break changes one
    "int8": [12, 93, 9, 87, 42, 60, 71, 12, 45, 55, 40, 78], "int4": [49, 53, 5, 33, 65, 62, 51, 38, 61, 45, 74, 27]}


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_gemma2_token_exact(exported, tmp_path, scheme):
    """Gemma 2 on the chip: its post-sublayer norms (O and DOWN load the model's norm unit with their own site, whose
    int16 output is then added to the residual an element a cycle: numerics §5), its attention soft-cap (the scores
    rescaled into the cap's units and read through the odd tanh table on their way into the softmax: §6; a cap of 4
    on scores reaching 12, so that it bites), its logits' cap taken as the argmax before it (§8) and its local layer
    (a window of 16) then a global one. Token for token with the reference in int8 and int4 past the window (a
    prompt of 12 and 8 generated at context 24); the int8 case with every token's cycles equal to the plan's, the
    int4 case under idle input and backpressure. The case catches every break, the post norms skipped and the cap
    skipped among them."""
    from hardwire.rtl.plan import HardwarePlan, cycles_per_token_estimate

    ir = _hf_ir(exported, "gemma2-cap4")
    cfg = ir.config
    assert cfg.post_norms and (cfg.attn_softcap, cfg.logit_softcap, cfg.attn_windows) == (4.0, 30.0, (16, None))
    qm = quantize(ir, scheme, context=24)
    assert {"post_norm_skipped", "attention_cap_skipped", "window_ignored"} <= set(breaks(qm))
    prompt = GEMMA2_PROMPTS[scheme]
    want = assert_case_catches(qm, prompt, 8)
    compile_to(qm, tmp_path, lanes=8, storage="rom", progress=False)
    timed = scheme == "int8"
    result = simulate(tmp_path, prompt, 8, seed=5, idle=0.0 if timed else 0.2, stall=0.0 if timed else 0.2,
                      optimise=False, progress=False)
    assert result.match and result.outputs == want and len(result.tokens) == 8
    if timed:
        plan = HardwarePlan(lanes=8)
        assert result.cycles == [cycles_per_token_estimate(qm, plan, p) for p in range(len(result.cycles))]


@pytest.mark.xdist_group("bundled_int8")
def test_bundled_model_generates_16_tokens(bundled_int8, tmp_path):
    """16 tokens keep the suite within 15 minutes; the reference's own golden test runs 32, `make demo` simulates 32."""
    ir, qm = bundled_int8
    compile_to(qm, tmp_path, lanes=32, storage="rom", vocab=ir.vocab, progress=False)  # 32 lanes: half the cycles
    prompt = [ir.vocab.index(c) for c in "ROMEO:"]
    want = assert_case_catches(qm, prompt, 16)  # every break of its three layers changes an output
    result = simulate(tmp_path, prompt, 16, seed=3, stall=0.2, optimise=False, progress=False)
    assert result.tokens == ReferenceDecoder(qm).generate(prompt, 16) == result.reference_tokens
    assert result.match and result.outputs == want and len(result.tokens) == 16


@pytest.fixture(scope="module")
def small_build(tmp_path_factory):
    """One small Llama build shared by the sequence, flag, window and LoRA cases (each its own simulation); its
    first layer attends to the last 3 keys only (a ring of 3 slots), its second to all of them. Seed 2: its outputs
    on SMALL_PROMPT vary and change under every break (test_small_build_case_catches_every_break)."""
    qm = quantize(random_ir(d=16, heads=2, kv_heads=1, ffn=24, vocab=20, context=8, layers=2, windows=(3, None),
                            seed=2), "int8", context=8)
    path = tmp_path_factory.mktemp("small_build")
    compile_to(qm, path, lanes=4, storage="rom", progress=False)
    return qm, path


SMALL_PROMPT = [3, 7, 1]


@pytest.mark.xdist_group("small_build")
def test_small_build_case_catches_every_break(small_build):
    """The sequences of the small build's tests (SMALL_PROMPT and 5 tokens) would fail on a chip with any break of
    quant/mutations.py that applies: attention, values, queries, the MLP, either layer, the score scale, RoPE,
    attention to the current key only, and the window ignored."""
    qm, _ = small_build
    assert "window_ignored" in breaks(qm)
    assert_case_catches(qm, SMALL_PROMPT, 5)


@pytest.mark.xdist_group("small_build")
def test_new_sequence_resets_the_kv_cache(small_build):
    _, path = small_build
    records, _, _ = run_steps(path, [Generate(SMALL_PROMPT, 5), Generate([11, 2, 9], 5), Generate(SMALL_PROMPT, 5)],
                              seed=4, idle=0.2, stall=0.2, optimise=False, progress=False)
    assert [r["match"] for r in records] == [True, True, True]
    assert records[0]["tokens"] == records[2]["tokens"]  # the second sequence left nothing behind


@pytest.mark.xdist_group("small_build")
def test_full_context_and_bad_token_raise_flags_without_output(small_build):
    qm, path = small_build
    first = ReferenceDecoder(qm).generate([4], 1)[0]
    steps = [Generate([3, 7, 1], 6),  # 3 + 5 tokens fed: all 8 positions used
             Feed(5), Feed(first),  # no room: consumed, context_full, no output
             Feed(4, new_seq=True),  # a new sequence clears the flag and decodes again
             Feed(31), Feed(20),  # ids past the vocabulary of 20: bad_token, no output
             Feed(4, new_seq=True)]
    records, _, _ = run_steps(path, steps, seed=5, idle=0.1, stall=0.3, optimise=False, progress=False)
    generate, full1, full2, fresh, bad1, bad2, again = records
    assert generate["match"]
    assert (full1["output"], full1["context_full"], full1["position"]) == (None, 1, 8)
    assert (full2["output"], full2["context_full"]) == (None, 1)
    assert (fresh["output"], fresh["context_full"], fresh["bad_token"], fresh["position"]) == (first, 0, 0, 1)
    assert (bad1["output"], bad1["bad_token"], bad1["context_full"]) == (None, 1, 0)
    assert (bad2["output"], bad2["bad_token"]) == (None, 1)
    assert (again["output"], again["bad_token"], again["position"]) == (first, 0, 1)
    assert again["tokens"] == fresh["tokens"] + 1  # only real outputs are counted


@pytest.mark.xdist_group("small_build")
def test_windowed_layer_token_exact_past_its_window(small_build):
    """Every position's token, fed one at a time, is the reference's: twice past the window of 3 (the ring wraps
    twice), in a second sequence that starts with the ring mid-way (new_seq resets it). The window changes the
    token at position 5, so a chip that attended to every key would fail here."""
    qm, path = small_build
    ids = [3, 7, 1, 11, 2, 9, 4, 5]
    want = forward(qm, torch.tensor([ids]))[0].argmax(-1).tolist()
    causal = dataclasses.replace(qm, config=dataclasses.replace(qm.config, attn_windows=None))
    assert want != forward(causal, torch.tensor([ids]))[0].argmax(-1).tolist()
    steps = [Feed(3, new_seq=True), Feed(7), *(Feed(t, new_seq=i == 0) for i, t in enumerate(ids))]
    records, _, _ = run_steps(path, steps, seed=7, idle=0.2, stall=0.2, optimise=False, progress=False)
    assert [r["output"] for r in records[2:]] == want


@pytest.mark.xdist_group("small_build")
def test_lora_through_the_host_port(small_build):
    qm, path = small_build
    prompt = [3, 7, 1]
    adapters = random_adapters(qm, 6)
    with_adapter = ReferenceDecoder(qm, lora=adapters).generate(prompt, 5)
    base = ReferenceDecoder(qm).generate(prompt, 5)
    assert with_adapter != base  # the adapter changes the tokens
    steps = [LoadLora(random_adapters(qm, 0, zero=True)), Generate(prompt, 5),
             LoadLora(adapters), Generate(prompt, 5),
             LoadLora(random_adapters(qm, 0, zero=True)), Generate(prompt, 5)]
    records, _, _ = run_steps(path, steps, seed=6, idle=0.3, stall=0.2, optimise=False, progress=False)
    loads, runs = records[0::2], records[1::2]
    assert all(r["written"] > 0 for r in loads)
    assert [r["tokens"] for r in runs] == [base, with_adapter, base]
    assert all(r["match"] for r in runs)


@pytest.fixture(scope="module")
def cli_build(tmp_path_factory):
    """One small GPT-2 build for `hardwire sim` (which builds optimised C++, in its own sim_build folder)."""
    qm = quantize(random_ir(family="gpt2", d=16, heads=2, kv_heads=2, ffn=24, context=8, layers=2), "int8", context=8)
    path = tmp_path_factory.mktemp("cli_build")
    compile_to(qm, path, lanes=2, storage="rom", progress=False)
    return path


@pytest.mark.xdist_group("cli_build")
def test_cli_sim_writes_sim_json(cli_build, capsys):
    want = assert_case_catches(QModel.load(cli_build), [1, 2, 3], 4)  # GPT-2's block: every break changes an output
    assert main(["sim", str(cli_build), "--prompt-ids", "1,2,3", "-n", "4"]) == 0
    out = capsys.readouterr().out
    assert "PASS: every token equals the integer reference" in out and "cycles per token:" in out
    assert "MAC-lane utilisation:" in out
    saved = json.loads((cli_build / "sim.json").read_text())
    assert saved["match"] and saved["tokens"] == saved["reference_tokens"] and saved["cycles_per_token"] > 0
    assert saved["outputs"] == saved["reference_outputs"] == want
    assert len(saved["cycles"]) == len(saved["macs"]) == 3 + 4 - 1 and 0 < saved["lane_utilisation"] <= 1


def test_cli_sim_writes_a_waveform(tmp_path, capsys):
    qm = quantize(random_ir(d=16, heads=2, kv_heads=1, ffn=24, context=8, layers=2), "int8", context=8)
    compile_to(qm, tmp_path, lanes=4, storage="rom", progress=False)
    assert main(["sim", str(tmp_path), "--prompt-ids", "3", "-n", "2", "--wave", str(tmp_path / "run.vcd")]) == 0
    assert "$enddefinitions" in (tmp_path / "run.vcd").read_text()
    assert "PASS" in capsys.readouterr().out
    assert main(["sim", str(tmp_path), "--prompt-ids", "3", "--wave", str(tmp_path / "run.fst")]) == 2
    assert "FST waveforms are not supported" in capsys.readouterr().err


def test_cli_sim_refuses_a_folder_that_is_not_a_build(tmp_path, capsys):
    assert main(["sim", str(tmp_path), "--prompt-ids", "3"]) == 2
    assert capsys.readouterr().err == (f"hardwire: error: {tmp_path} is not a build folder (no decoder.v, qmodel.json, "
                                       f"qmodel.npz, report.json); make one with `hardwire compile MODEL.onnx -o "
                                       f"{tmp_path}`\n")


@pytest.mark.xdist_group("cli_build")
def test_a_verilog_that_disagrees_with_the_reference_fails(cli_build, capsys):
    """The comparison can fail: the reference's head rows rolled by one, the Verilog's left as built. The build
    folder is tampered with in place (a copy elsewhere would rebuild the Verilated model) and restored after."""
    npz = cli_build / "qmodel.npz"
    original = npz.read_bytes()
    arrays = dict(np.load(npz))
    heads = [name for name in arrays if name.startswith("head.")]
    assert "head.codes" in heads
    try:
        np.savez(npz, **{k: np.roll(v, 1, axis=0) if k in heads else v for k, v in arrays.items()})
        assert main(["sim", str(cli_build), "--prompt-ids", "3,7", "-n", "4"]) == 1
    finally:
        npz.write_bytes(original)
    out = capsys.readouterr().out
    assert "FAIL: reference decodes [" in out
    record = json.loads((cli_build / "sim.json").read_text())
    assert record["match"] is False and record["tokens"] != record["reference_tokens"]


@pytest.mark.xdist_group("small_build")
def test_a_verilog_that_does_not_build_says_so_with_the_log_tail(small_build, tmp_path):
    _, path = small_build
    broken = tmp_path / "broken"
    shutil.copytree(path, broken, ignore=shutil.ignore_patterns("sim_build*"))
    verilog = broken / "decoder.v"
    verilog.write_text(verilog.read_text() + "\nmodule broken(; endmodule\n")
    with pytest.raises(RuntimeError) as failure:
        simulate(broken, [3], 1, optimise=False, progress=False)
    message = str(failure.value)
    assert message.startswith("the verilator build failed (Command failed with return code: ")
    assert f"the last lines of {broken / 'sim_build_verilator_quick' / 'build.log'}:" in message
    assert "decoder.v" in message.split(":\n", 1)[1]  # the tail names the file with the error


@pytest.mark.xdist_group("small_build")
@pytest.mark.skipif(shutil.which("iverilog") is not None, reason="Icarus Verilog is installed")
def test_icarus_asked_for_but_absent_is_a_clear_error(small_build, capsys):
    _, path = small_build
    assert main(["sim", str(path), "--prompt-ids", "3", "--simulator", "icarus"]) == 2
    assert capsys.readouterr().err == ("hardwire: error: Icarus Verilog is not installed (iverilog and vvp not on PATH); "
                                       "install it (Debian: apt install iverilog) or use the default simulator, "
                                       "verilator\n")


@pytest.mark.xdist_group("small_build")
@pytest.mark.skipif(shutil.which("iverilog") is None, reason="Icarus Verilog is not installed")
def test_icarus_decodes_the_reference_tokens(small_build):
    _, path = small_build
    result = simulate(path, SMALL_PROMPT, 5, simulator="icarus", progress=False)  # the case every break changes
    assert result.match and result.tokens == result.reference_tokens


@pytest.mark.parametrize("family,block,scheme,rows,lanes,options,windows", [
    ("llama", "shared", "mixed36", 4, 4, {}, None),
    ("gpt2", "parallel", "mxfp4", 8, 8, {"attention_rows": 2, "softmax_lanes": 4, "dsp_rows": 5}, (None, 6)),
    ("llama", "sequential", "int8", 16, 2, {"epilogue_lanes": 2, "attention_rows": 2, "softmax_lanes": 2}, (5, None)),
])
def test_cycle_estimate_equals_the_simulated_cycles(tmp_path, family, block, scheme, rows, lanes, options, windows):
    """The schedule (rtl/plan.py) predicts every token's cycles exactly, at every position, for several shapes
    of the engine: attention on all 4 rows (4 divides the head width 8), on 2 of 8, on 2 of 16; 8 rows over 4
    chunks make the engine wait for the epilogue; a softmax on 4 lanes; the last 3 of those 8 rows multiply 5-bit
    MXFP4 codes by shift-add; the 16 rows hand their sums on two per cycle (the 40 logits, the residual, the GLU
    and the scores into the softmax in beats of two), in the Verilog that Verilator runs. The blocks: Phi's (one
    norm, parallel sublayers, half of each head rotated), GPT-NeoX's (two norms, the attention's from the residual
    memory) and the sequential one. The last two have a windowed layer (6 and 5 keys: scores and weighted sums stop
    growing there), decoded past it token-exact."""
    from hardwire.rtl.plan import HardwarePlan, cycles_per_token_estimate

    ir = random_ir(family=family, d=32, heads=4, kv_heads=2 if family == "llama" else 4, ffn=48, vocab=40, context=24,
                   block=block, rotary_dims=4 if block == "shared" else None, windows=windows)
    qm = quantize(ir, scheme, context=24, **scheme_options(scheme))
    assert_case_catches(qm, [3, 9, 27], 14)  # the token check can fail: every break changes an output
    compile_to(qm, tmp_path, rows=rows, lanes=lanes, storage="rom", progress=False, **options)
    result = simulate(tmp_path, [3, 9, 27], 14, seed=5, idle=0.0, stall=0.0, optimise=False, progress=False)
    assert result.match
    plan = HardwarePlan(rows=rows, lanes=lanes, **options)
    assert result.cycles == [cycles_per_token_estimate(qm, plan, p) for p in range(len(result.cycles))]

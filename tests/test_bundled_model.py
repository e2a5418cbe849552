"""The committed example model imports, proves, and is small enough for the boards it targets."""

from __future__ import annotations

import json

from hardwire.cli import BUNDLED_MODEL, main
from hardwire.frontend import load
from hardwire.frontend.vocab import decode, encode


def test_bundled_model_imports_and_proves():
    ir = load(BUNDLED_MODEL)
    cfg = ir.config
    assert (cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.ffn, cfg.context) == (65, 128, 3, 4, 224, 128)
    assert (cfg.norm, cfg.activation, cfg.positions, cfg.tied_head) == ("rms", "silu_glu", "rope", True)
    assert ir.n_params <= 500_000  # ~4 bits a weight must fit a ULX3S-85F's 3.7 Mbit of block RAM with room
    assert ir.vocab == tuple(json.loads(BUNDLED_MODEL.with_suffix(".vocab.json").read_text()))
    assert ir.proof.passed


def test_word_piece_model_imports_proves_and_encodes_the_corpus():
    """The second bundled model: llama2.c's 260K shape, 512 word pieces learned on the training split."""
    model = BUNDLED_MODEL.parent / "tinyshakespeare_pieces.onnx"
    ir = load(model)
    cfg = ir.config
    assert (cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.ffn, cfg.context) == (512, 64, 4, 4, 172, 128)
    assert ir.proof.passed and ir.vocab == tuple(json.loads(model.with_suffix(".vocab.json").read_text()))
    text = "ROMEO:\nWhat say you, my lord?\n"
    ids = encode(text, ir.vocab)
    assert decode(ids, ir.vocab) == text and len(ids) < len(text) / 2  # pieces, not characters
    trained = json.loads(model.with_suffix(".train.json").read_text())
    assert trained["val_loss_per_char"] < 2.0 and trained["config"]["vocab_size"] == 512


def test_small_model_imports_proves_and_fits_the_small_boards():
    """The third bundled model, for the boards neither other fits: characters (the character model's vocabulary),
    2 layers x 48, context 64. The fit estimate of the engines `hardwire compile --board` chose for it (int4 on the
    Tang Nano 20K, int8 on the ULX3S-25F; docs/boards.md), and int8 refused on the Nano."""
    from hardwire.boards.parts import PARTS, estimate_model
    from hardwire.quant.quantize import quantize
    from hardwire.rtl.plan import HardwarePlan

    model = BUNDLED_MODEL.parent / "tinyshakespeare_small.onnx"
    ir = load(model)
    cfg = ir.config
    assert (cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.ffn, cfg.context) == (65, 48, 2, 3, 128, 64)
    assert ir.proof.passed and ir.vocab == tuple(json.loads(BUNDLED_MODEL.with_suffix(".vocab.json").read_text()))
    assert model.stat().st_size < 1_000_000
    trained = json.loads(model.with_suffix(".train.json").read_text())
    assert trained["parameters"] == ir.n_params == 58_656 and trained["val_loss_per_char"] < 1.7
    nano, ulx3s_25f = PARTS["tang_nano_20k"], PARTS["ulx3s_25f"]
    int4, int8 = quantize(ir, "int4"), quantize(ir, "int8")
    plan = HardwarePlan(rows=2, lanes=4, attention_rows=2)  # 38 MULT18X18 measured in synthesis (with LoRA)
    assert not estimate_model(int4, nano, plan, label="int4").problems()
    assert estimate_model(int8, nano, HardwarePlan(lanes=1), label="int8").problems()
    plan = HardwarePlan(rows=2, lanes=8, attention_rows=2, softmax_lanes=4, dsp_rows=0)
    assert not estimate_model(int8, ulx3s_25f, plan, label="int8").problems()


def test_inspect_prints_config_and_proof(capsys):
    assert main(["inspect", str(BUNDLED_MODEL)]) == 0
    out = capsys.readouterr().out
    assert "  d_model    128\n" in out and "  n_layers   3\n" in out and "  positions  rope\n" in out
    assert "parameters 463,872\n" in out
    assert "proof      PASS: max |IR - onnxruntime|" in out


def test_inspect_reports_bad_input_without_a_trace(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "missing.onnx")]) == 2
    assert capsys.readouterr().err == f"hardwire: error: {tmp_path / 'missing.onnx'}: model file not found\n"

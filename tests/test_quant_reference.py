"""The integer reference decoder: cache against recompute, widths, errors, LoRA, persistence."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from random_ir import random_ir, scheme_options

from hardwire.frontend import float_forward, load
from hardwire.frontend.ir import Linear
from hardwire.quant import reference
from hardwire.quant.fixedpoint import WidthError
from hardwire.quant.lora import quantize_lora
from hardwire.quant.qmodel import LoraSpec, QModel
from hardwire.quant.quantize import quantize
from hardwire.quant.reference import DecodeError, ReferenceDecoder
from hardwire.quant.weights import QuantizationError

_IR: dict[str, object] = {}
_QM: dict[tuple[str, str], QModel] = {}


def ir_of(exported, name):
    if name not in _IR:
        _IR[name] = load(exported(name)[1])
    return _IR[name]


def qmodel(exported, name, scheme):
    if (name, scheme) not in _QM:
        _QM[name, scheme] = quantize(ir_of(exported, name), scheme, context=32, **scheme_options(scheme))
    return _QM[name, scheme]


@pytest.mark.parametrize("name,scheme", [("llama-gqa-untied", "int8"), ("llama-gqa-untied", "mixed36"),
                                         ("llama-gqa-untied", "mxfp4"), ("gpt2", "int8"), ("gpt2", "mxfp4"),
                                         ("example-dynamo", "int4")])
def test_incremental_decoding_equals_full_recompute(exported, name, scheme):
    qm = qmodel(exported, name, scheme)
    decoder = ReferenceDecoder(qm)
    prompt = [3, 17, 5, 38, 11]
    stepped = [decoder.step(t) for t in prompt]
    tokens: list[int] = []
    logits = stepped[-1]
    for _ in range(20):
        tokens.append(int(reference.blocks.argmax(logits)))
        logits = decoder.step(tokens[-1])
        stepped.append(logits)
    full = reference.forward(qm, torch.tensor([prompt + tokens]))[0]  # (positions, vocab)
    assert torch.equal(torch.stack(stepped), full)


def test_windowed_attention_sees_the_last_w_keys():
    """A local layer (window 4) before a global one: the KV-cached decoder equals the whole-prefix forward past the
    window. In a one-layer local model a changed token at position 2 moves the logits at positions 2..5 and no
    others; in the same model read as causal it moves later ones too (the window is what keeps them)."""
    ids = torch.randint(0, 20, (1, 16), generator=torch.Generator().manual_seed(1))
    two = quantize(random_ir(family="gpt2", d=16, heads=2, kv_heads=2, ffn=24, vocab=20, context=16,
                             windows=(4, None)), "int8", context=16)
    decoder = ReferenceDecoder(two)
    assert torch.equal(torch.stack([decoder.step(int(t)) for t in ids[0]]), reference.forward(two, ids)[0])
    one = quantize(random_ir(family="gpt2", d=16, heads=2, kv_heads=2, ffn=24, vocab=20, context=16, layers=1,
                             windows=(4,)), "int8", context=16)
    causal = dataclasses.replace(one, config=dataclasses.replace(one.config, attn_windows=None))
    edited = ids.clone()
    edited[0, 2] = (ids[0, 2] + 1) % 20

    def moved(qm: QModel) -> list[bool]:
        """Per position: the logits differ between ids and edited."""
        return (reference.forward(qm, ids)[0] != reference.forward(qm, edited)[0]).any(-1).tolist()

    assert moved(one) == [False, False] + [True] * 4 + [False] * 10
    assert any(moved(causal)[6:])


def test_generate_matches_stepping_and_reset_starts_over(exported):
    qm = qmodel(exported, "llama-gqa-untied", "int8")
    decoder = ReferenceDecoder(qm)
    first = decoder.generate([1, 2, 3], 10)
    again = decoder.generate([1, 2, 3], 4)  # continues the same sequence: different context
    decoder.reset()
    assert decoder.generate([1, 2, 3], 10) == first
    assert len(again) == 4


def test_errors_the_hardware_flags(exported):
    qm = qmodel(exported, "gpt2", "int8")
    decoder = ReferenceDecoder(qm)
    with pytest.raises(DecodeError, match=r"^token id 96 is out of range; accepted: 0..95$"):
        decoder.step(96)
    for t in range(qm.context):
        decoder.step(t % 7)
    with pytest.raises(DecodeError, match=r"^context full: all 32 positions are used; start a new sequence$"):
        decoder.step(1)
    with pytest.raises(DecodeError, match="the prompt is empty"):
        ReferenceDecoder(qm).generate([], 3)


def test_accumulator_wider_than_declared_raises(exported):
    qm = qmodel(exported, "llama-gqa-untied", "int8")
    narrow = dataclasses.replace(qm.layers[0].q, acc_bits=10)
    broken = dataclasses.replace(qm, layers=(dataclasses.replace(qm.layers[0], q=narrow), *qm.layers[1:]))
    with pytest.raises(WidthError, match=r"^layers.0.q accumulator: value -?\d+ does not fit its declared int10 "):
        ReferenceDecoder(broken).step(5)


def test_declared_accumulator_widths_hold_the_worst_case(exported):
    qm = qmodel(exported, "llama-gqa-untied", "mxfp4")
    for name, lin in qm.linears():
        worst = int(lin.weight.abs().sum(1).max()) * (1 << (lin.in_bits - 1)) + int(lin.bias.abs().max())
        assert worst < 1 << (lin.acc_bits - 1), name


def test_save_and_load_give_the_same_tokens(exported, tmp_path):
    qm = qmodel(exported, "gpt2", "mxfp4")
    qm.save(tmp_path)
    loaded = QModel.load(tmp_path)
    assert loaded.config == qm.config and loaded.scales == qm.scales and loaded.lora == qm.lora
    assert torch.equal(loaded.layers[1].v.codes, qm.layers[1].v.codes)
    assert ReferenceDecoder(loaded).generate([4, 8, 15], 12) == ReferenceDecoder(qm).generate([4, 8, 15], 12)
    assert not any(p.suffix == ".pkl" for p in tmp_path.iterdir())


def test_a_qmodel_saved_before_norm_out_bits_loads_with_int8_norms(exported, tmp_path):
    """qmodel.json written before QNorm.out_bits existed: every norm is int8 again (the final one was then)."""
    qm = qmodel(exported, "gpt2", "int8")
    qm.save(tmp_path)
    tree = json.loads((tmp_path / "qmodel.json").read_text())

    def strip(node: object) -> int:
        if isinstance(node, dict):
            found = int("eps_q" in node and node.pop("out_bits", None) is not None)
            return found + sum(strip(v) for v in node.values())
        return sum(strip(v) for v in node) if isinstance(node, list) else 0

    assert strip(tree) == 2 * qm.config.n_layers + 1
    (tmp_path / "qmodel.json").write_text(json.dumps(tree))
    loaded = QModel.load(tmp_path)
    assert qm.final_norm.out_bits == 12 and loaded.final_norm.out_bits == 8
    assert all(layer.attn_norm.out_bits == 8 for layer in loaded.layers)


def test_mixed36_stays_within_its_budget_and_mixes(exported):
    qm = qmodel(exported, "llama-gqa-untied", "mixed36")
    assert qm.avg_weight_bits <= scheme_options("mixed36")["avg_bits"]
    scales = qm.scale_bits  # 21 bits per row and 3 per group of 32 columns, counted in avg_weight_bits
    assert scales == sum(21 * t.codes.shape[0] + 3 * t.codes.shape[0] * -(-t.codes.shape[1] // 32)
                         for _, t in qm.weight_tensors())
    assert qm.avg_weight_bits == (qm.weight_bits + scales) / qm.n_weights
    widths = {t.bits for _, t in qm.weight_tensors()}
    assert widths == {3, 6}
    with pytest.raises(QuantizationError, match=r"^avg_bits 3\.2 leaves less than 3 bits per weight for the codes: the "
                       r"scales take \d\.\d{3} bits per weight; accepted: avg_bits >= \d\.\d{3}$"):
        quantize(ir_of(exported, "llama-gqa-untied"), "mixed36", avg_bits=3.2, context=32)


def test_unknown_scheme_and_bad_lora_site(exported):
    ir = ir_of(exported, "gpt2")
    with pytest.raises(QuantizationError, match=r"^unknown scheme 'int5'; accepted: int8, int4, int3, mixed36, mxfp4$"):
        quantize(ir, "int5")
    with pytest.raises(QuantizationError, match=r"^LoRA sites \['gate'\] are not projections of this model; accepted: "
                                                r"q, k, v, o, up, down$"):
        quantize(ir, "int8", lora=LoraSpec(4, ("gate",)))


def _adapters(qm, rng, scale):
    cfg = qm.config
    out = {}
    floats = {}
    for layer in range(cfg.n_layers):
        for site in qm.lora.sites:
            rows, cols = getattr(qm.layers[layer], site).codes.shape
            a = rng.normal(size=(qm.lora.rank, cols)) * scale
            b = rng.normal(size=(rows, qm.lora.rank)) * scale
            out[layer, site] = quantize_lora(qm, layer, site, a, b, alpha=8.0)
            floats[layer, site] = (a, b)
    return out, floats


def test_zero_lora_leaves_tokens_unchanged(exported):
    qm = qmodel(exported, "llama-gqa-untied", "int8")
    cfg = qm.config
    zero = {(i, s): quantize_lora(qm, i, s, np.zeros((4, cfg.d_model)),
                                  np.zeros((getattr(qm.layers[i], s).codes.shape[0], 4)), 8.0)
            for i in range(cfg.n_layers) for s in qm.lora.sites}
    ids = torch.tensor([[5, 9, 2, 7, 7, 30, 1]])
    assert torch.equal(reference.forward(qm, ids, zero), reference.forward(qm, ids))


def test_lora_applies_the_float_adapter(exported):
    """The integer adapter moves the logits the way the float merged model says it should."""
    ir = ir_of(exported, "llama-gqa-untied")
    qm = qmodel(exported, "llama-gqa-untied", "int8")
    adapters, floats = _adapters(qm, np.random.default_rng(3), 0.15)  # weights of 1/sqrt(64): an adapter of this size matters
    layers = list(ir.layers)
    for (i, site), (a, b) in floats.items():
        lin = getattr(layers[i], site)
        merged = lin.weight + (8.0 / 4) * (b @ a).astype(np.float32)
        layers[i] = dataclasses.replace(layers[i], **{site: Linear(merged, lin.bias)})
    merged_ir = dataclasses.replace(ir, layers=tuple(layers))
    ids = torch.randint(0, 96, (4, 32), generator=torch.Generator().manual_seed(0))
    target = float_forward(merged_ir, ids).argmax(-1)
    with_adapter = reference.forward(qm, ids, adapters).argmax(-1)
    without = reference.forward(qm, ids).argmax(-1)
    agree_with = float((with_adapter == target).double().mean())
    agree_without = float((without == target).double().mean())
    assert agree_without < 0.5 and agree_with > 0.85  # the adapter matters, and integer LoRA follows it


def test_lora_shape_and_slot_errors(exported):
    qm = qmodel(exported, "llama-gqa-untied", "int8")
    with pytest.raises(QuantizationError, match=r"^no LoRA slot at layer 0, projection 'o'; this build has slots on "
                                                r"q, v of layers 0..1$"):
        quantize_lora(qm, 0, "o", np.zeros((4, 64)), np.zeros((64, 4)), 1.0)
    with pytest.raises(QuantizationError, match=r"^LoRA for layers.1.v must be A \(4, 64\) and B \(32, 4\); "
                                                r"got A \(4, 63\) and B \(32, 4\)$"):
        quantize_lora(qm, 1, "v", np.zeros((4, 63)), np.zeros((32, 4)), 1.0)


# The pinned model: the bundled one, its int8 build, and the exact greedy tokens it decodes.
GOLDEN_PROMPT = "ROMEO:"
GOLDEN_INT8 = [0, 21, 1, 61, 47, 50, 50, 1, 52, 53, 58, 1, 57, 54, 43, 39, 49, 1, 58, 53, 1, 58, 46, 43, 1, 54, 43, 53,
               54, 50, 43, 1]  # "\nI will not speak to the people ", what the float model writes too


@pytest.mark.xdist_group("bundled_int8")
def test_bundled_model_golden_tokens(bundled_int8):
    ir, qm = bundled_int8
    stoi = {c: i for i, c in enumerate(ir.vocab)}
    tokens = ReferenceDecoder(qm).generate([stoi[c] for c in GOLDEN_PROMPT], 32)
    assert tokens == GOLDEN_INT8, "".join(ir.vocab[t] for t in tokens)

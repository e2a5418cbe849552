"""The frontend reads real exports and places every weight where the source model has it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from hardwire.frontend import ModelImportError, load


def _same(array: np.ndarray, tensor: torch.Tensor) -> bool:
    return np.array_equal(array, tensor.detach().numpy())


@pytest.mark.parametrize("name", ["example-dynamo", "example-torchscript"])
def test_example_model(exported, name):
    model, path = exported(name)
    ir = load(path)
    cfg = model.cfg
    assert (ir.config.vocab_size, ir.config.d_model, ir.config.n_layers, ir.config.n_heads, ir.config.ffn) == \
        (cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.ffn)
    assert ir.config.context == cfg.context  # from the export's metadata
    assert (ir.config.norm, ir.config.activation, ir.config.positions) == ("rms", "silu_glu", "rope")
    assert ir.config.rope_theta == cfg.rope_theta and ir.config.norm_eps == cfg.norm_eps and ir.config.tied_head
    block = model.layers[1]
    assert _same(ir.layers[1].q.weight, block.self_attn.q_proj.weight)
    assert _same(ir.layers[1].v.weight, block.self_attn.v_proj.weight)
    assert _same(ir.layers[1].gate.weight, block.mlp.gate_proj.weight)
    assert _same(ir.layers[1].mlp_norm.weight, block.post_attention_layernorm.weight)
    assert ir.proof.passed and ir.proof.max_abs_diff <= 1e-4 * ir.proof.max_abs_logit


@pytest.mark.parametrize("name,kv_heads,tied", [("llama-mha-tied", 4, True), ("llama-gqa-untied", 2, False)])
def test_hf_llama(exported, name, kv_heads, tied):
    model, path = exported(name)
    assert path.with_name("model.onnx.data").exists()  # the dynamo exporter writes weights beside the model
    assert any(t.data_location == onnx.TensorProto.EXTERNAL
               for t in onnx.load(path, load_external_data=False).graph.initializer)
    ir = load(path)
    cfg = ir.config
    assert (cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn) == \
        (96, 64, 2, 4, kv_heads, 16, 96)
    assert (cfg.norm, cfg.norm_eps, cfg.activation, cfg.positions, cfg.rope_theta, cfg.tied_head) == \
        ("rms", 1e-6, "silu_glu", "rope", 5000.0, tied)
    assert cfg.context is None  # RoPE graphs do not state a context length
    hf = model.model.layers[0]
    assert _same(ir.layers[0].q.weight, hf.self_attn.q_proj.weight)
    assert _same(ir.layers[0].k.weight, hf.self_attn.k_proj.weight)
    assert _same(ir.layers[0].v.weight, hf.self_attn.v_proj.weight)
    assert _same(ir.layers[0].o.weight, hf.self_attn.o_proj.weight)
    assert _same(ir.layers[0].up.weight, hf.mlp.up_proj.weight)
    assert _same(ir.layers[0].down.weight, hf.mlp.down_proj.weight)
    assert _same(ir.layers[0].attn_norm.weight, hf.input_layernorm.weight)
    assert _same(ir.final_norm.weight, model.model.norm.weight)
    assert _same(ir.head.weight, model.lm_head.weight)
    assert ir.n_params == sum(p.numel() for p in model.parameters())  # tied weights counted once
    assert ir.proof.passed


def test_hf_gpt2(exported):
    model, path = exported("gpt2")
    ir = load(path)
    cfg = ir.config
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.ffn, cfg.context) == (64, 2, 4, 4, 256, 64)
    assert (cfg.norm, cfg.norm_eps, cfg.activation, cfg.positions, cfg.tied_head) == \
        ("layer", 1e-5, "gelu_tanh", "learned", True)
    block = model.transformer.h[1]
    c_attn_w, c_attn_b = block.attn.c_attn.weight, block.attn.c_attn.bias  # Conv1D: (in, out)
    assert _same(ir.layers[1].q.weight, c_attn_w[:, :64].T)
    assert _same(ir.layers[1].k.weight, c_attn_w[:, 64:128].T)
    assert _same(ir.layers[1].v.bias, c_attn_b[128:])
    assert _same(ir.layers[1].down.weight, block.mlp.c_proj.weight.T)
    assert _same(ir.layers[1].down.bias, block.mlp.c_proj.bias)
    assert _same(ir.layers[1].attn_norm.bias, block.ln_1.bias)
    assert _same(ir.pos_embed, model.transformer.wpe.weight)
    assert ir.n_params == sum(p.numel() for p in model.parameters())
    assert ir.proof.passed


def _with_score_mul(path, tmp_path, value: np.ndarray, name: str):
    """The example export with the first scalar Mul of the attention scale followed by a Mul by VALUE."""
    proto = onnx.load(path)
    scale = next(n for n in proto.graph.node if n.op_type == "Mul" and n.name.startswith("node_Mul"))
    doubled = onnx.helper.make_node("Mul", [scale.output[0], "extra"], ["doubled"], name="extra_scale")
    for node in proto.graph.node:
        node.input[:] = ["doubled" if i == scale.output[0] else i for i in node.input]
    proto.graph.node.insert(list(proto.graph.node).index(scale) + 1, doubled)
    proto.graph.initializer.append(onnx.numpy_helper.from_array(value.astype(np.float32), "extra"))
    out = tmp_path / name
    onnx.save(proto, out)
    return out


def test_a_scalar_score_scale_is_read_and_folded_into_q(exported, tmp_path):
    """A score scale other than 1/sqrt(head_dim) (GPT-Neo has none) is read from the graph and folded into q."""
    _, path = exported("example-dynamo")
    plain = load(path, verify=False)
    ir = load(_with_score_mul(path, tmp_path, np.array(2.0), "scaled.onnx"))
    assert ir.proof.passed
    assert ir.config.folded == ("score scale 0.5 instead of 1/sqrt(head_dim) in layer 0 (q's weights times 2)",)
    assert np.allclose(ir.layers[0].q.weight, 2 * plain.layers[0].q.weight, rtol=1e-6)
    assert np.array_equal(ir.layers[0].k.weight, plain.layers[0].k.weight)
    assert np.array_equal(ir.layers[1].q.weight, plain.layers[1].q.weight)


def test_proof_refuses_a_model_it_misreads(exported, tmp_path):
    """A per-head score scale is no scalar the recovery folds: it recovers to the wrong IR; the proof must catch it."""
    _, path = exported("example-dynamo")
    bad = _with_score_mul(path, tmp_path, np.array([2.0, 1.0]).reshape(1, 2, 1, 1), "perhead.onnx")
    with pytest.raises(ModelImportError, match=r"^.*perhead.onnx: the recovered model does not reproduce "
                                               r"onnxruntime's logits: FAIL: max \|IR - onnxruntime\|"):
        load(bad)

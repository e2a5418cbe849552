"""The families of issue 35: RoPE of any frequency schedule (Llama 3.1's `llama3` scaling,
YaRN with its attention factor), interleaved RoPE (GPT-J, Cohere), fused projections cut by slicing (Phi-3's qkv and
gate/up) and scalar multipliers (Granite's embedding, residual, attention and logits multipliers; Cohere's logit
scale), which need no new hardware; Qwen3's per-head q/k norm and BLOOM's and MPT's ALiBi, which do
(tests/test_sim_cocotb.py decodes Qwen3 and BLOOM);
Gemma 2's logit soft-capping (the chip takes the argmax before the cap), Gemma 2's and 3's post-sublayer norms (through
the chip's norm unit) and Gemma 2's attention soft-capping (a table in the scores' integer domain), which
tests/test_sim_cocotb.py decodes; and the refusals, by name, of what the chip does not compute (a q norm without a k
norm, a post norm of one sublayer only, a decreasing cap).

Each tiny random model (transformers, from a config) is exported with the dynamo exporter, recovered by data flow and
proven against onnxruntime; the checks below compare the IR with the Hugging Face model's own parameters, so that a
wrong reading which the proof happened to accept would still fail. The integer reference decodes each of them in
tests/test_frontend_families.py::test_decode_in_the_reference.
"""

from __future__ import annotations

import math
import re

import numpy as np
import onnx
import pytest
import torch

from hardwire.frontend import ModelImportError, float_forward, load
from hardwire.quant.quantize import quantize
from hardwire.quant.tables import ROPE_BITS, rope_tables

SCALED_ROPE = "RoPE schedule from the graph (frequencies not base^(-2i/d): scaled RoPE)"
INTERLEAVED = "interleaved RoPE (pairs (2i, 2i + 1): q and k's rows reordered to rotate-half)"
QK_NORM = "per-head q/k norm (RMSNorm of each head of q and k before RoPE)"
ALIBI = "ALiBi (a linear bias per head on the scores, slopes 0.25, 0.0625, 0.015625, 0.00390625)"


def _np(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().double().numpy()


def _proven(exported, name: str):
    model, path = exported(name)
    ir = load(path)
    assert ir.proof.passed, ir.proof.summary()
    return model, ir


def _same_logits_as_hf(model, ir, length: int = 64) -> None:
    """The IR's float forward equals the Hugging Face model itself, past the proof's lengths (the export's 64)."""
    ids = torch.randint(0, 96, (1, length), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits
    got = float_forward(ir, ids)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()


def test_llama3_rope_schedule(exported):
    """Llama 3.1's `llama3` scaling keeps short wavelengths, stretches long ones 8x and smooths between: no base gives
    it. The frequencies are read from the graph (exactly its inv_freq constant), and the chip's Q14 tables (one source
    for the reference and the RTL) are made from them."""
    model, ir = _proven(exported, "llama3-rope")
    cfg = ir.config
    inv_freq = _np(model.model.rotary_emb.inv_freq)
    assert cfg.features == (SCALED_ROPE,) and cfg.folded == ()
    assert np.array_equal(np.array(cfg.rope_freqs), inv_freq)
    plain = 10000.0 ** (-np.arange(0, 16, 2) / 16)
    assert not np.allclose(inv_freq, plain, rtol=1e-3)  # the schedule is not the base's
    _same_logits_as_hf(model, ir)
    qm = quantize(ir, "int8", context=48)
    p, i = 47, 5
    assert int(qm.rope_cos[p, i]) == math.floor(math.cos(p * inv_freq[i]) * (1 << ROPE_BITS) + 0.5)
    assert torch.equal(qm.rope_sin, rope_tables(16, 10000.0, 48, None, inv_freq)[1])
    assert not torch.equal(qm.rope_cos, rope_tables(16, 10000.0, 48)[0])


def test_yarn_attention_factor_is_folded_into_q_and_k(exported):
    """YaRN scales cos and sin by its attention factor: rotating g x is g times rotating x, so q's and k's rows are
    scaled by g (the tables stay unit rotations), and the frequencies are read as for any schedule."""
    model, ir = _proven(exported, "yarn-rope")
    cfg = ir.config
    rotary = model.model.rotary_emb
    gain = float(rotary.attention_scaling)
    assert gain == pytest.approx(0.1 * math.log(4.0) + 1)
    assert cfg.features == (SCALED_ROPE,)
    assert cfg.folded == (f"RoPE attention factor {gain:.6g} (cos and sin times it: q and k's rotated rows times it)",)
    assert np.array_equal(np.array(cfg.rope_freqs), _np(rotary.inv_freq))
    attn = model.model.layers[1].self_attn
    assert np.allclose(ir.layers[1].q.weight, gain * _np(attn.q_proj.weight), rtol=1e-6, atol=1e-7)
    assert np.allclose(ir.layers[1].k.weight, gain * _np(attn.k_proj.weight), rtol=1e-6, atol=1e-7)
    assert np.array_equal(ir.layers[1].v.weight, attn.v_proj.weight.detach().numpy())
    _same_logits_as_hf(model, ir)


def _interleaved_rows(heads: int, head_dim: int, rotary_dims: int) -> np.ndarray:
    within = np.concatenate((np.arange(0, rotary_dims, 2), np.arange(1, rotary_dims, 2),
                             np.arange(rotary_dims, head_dim)))
    return np.concatenate([h * head_dim + within for h in range(heads)])


def test_gptj_interleaved_partial_rotary(exported):
    """GPT-J rotates pairs (2i, 2i + 1) of each head's first 8 dims: q's and k's rows are reordered so that those pairs
    are rotate-half's (i, i + 4), which leaves every score unchanged; then it is GPT-NeoX's partial rotary."""
    model, ir = _proven(exported, "gptj")
    cfg = ir.config
    assert (cfg.n_heads, cfg.head_dim, cfg.rotary_dims, cfg.rope_theta, cfg.rope_freqs) == (4, 16, 8, 10000.0, None)
    assert cfg.features == ("parallel residual", "shared norm", "partial rotary: 8 of 16 dims")
    assert cfg.folded == (INTERLEAVED,)
    attn = model.transformer.h[0].attn
    rows = _interleaved_rows(4, 16, 8)
    assert np.array_equal(ir.layers[0].q.weight, attn.q_proj.weight.detach().numpy()[rows])
    assert np.array_equal(ir.layers[0].k.weight, attn.k_proj.weight.detach().numpy()[rows])
    assert np.array_equal(ir.layers[0].v.weight, attn.v_proj.weight.detach().numpy())
    _same_logits_as_hf(model, ir)


def test_cohere_interleaved_and_logit_scale(exported):
    """Cohere: interleaved RoPE on every dim, a parallel block written as (x + attn) + mlp (two Adds, one shared
    LayerNorm without a bias) and logits times 0.5, folded into the head (which is then untied)."""
    model, ir = _proven(exported, "cohere")
    cfg = ir.config
    assert (cfg.parallel_residual, cfg.shared_norm, cfg.rotary_dims, cfg.tied_head) == (True, True, None, False)
    assert cfg.folded == ("logits scale 0.5 (the head's weights times it)", INTERLEAVED)
    attn = model.model.layers[1].self_attn
    assert np.array_equal(ir.layers[1].q.weight, attn.q_proj.weight.detach().numpy()[_interleaved_rows(4, 16, 16)])
    assert np.array_equal(ir.layers[1].k.weight, attn.k_proj.weight.detach().numpy()[_interleaved_rows(2, 16, 16)])
    assert ir.layers[1].attn_norm.bias is None
    table = _np(model.model.embed_tokens.weight)
    assert np.array_equal(ir.embed, table.astype(np.float32)) and np.allclose(ir.head.weight, 0.5 * table)
    _same_logits_as_hf(model, ir)


def test_phi3_projections_cut_by_slices(exported):
    """Phi-3 slices its fused qkv (q | k | v, GQA 4/2) and chunks its fused gate/up: each piece's rows are found by
    carrying element indices through the Slices, as through a Split."""
    model, ir = _proven(exported, "phi3")
    cfg = ir.config
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.activation, cfg.features, cfg.folded) == (4, 2, "silu_glu", (), ())
    layer = model.model.layers[1]
    qkv = layer.self_attn.qkv_proj.weight.detach().numpy()
    assert np.array_equal(ir.layers[1].q.weight, qkv[:64])
    assert np.array_equal(ir.layers[1].k.weight, qkv[64:96])
    assert np.array_equal(ir.layers[1].v.weight, qkv[96:])
    gate_up = layer.mlp.gate_up_proj.weight.detach().numpy()
    assert np.array_equal(ir.layers[1].gate.weight, gate_up[:96])
    assert np.array_equal(ir.layers[1].up.weight, gate_up[96:])
    _same_logits_as_hf(model, ir)


def test_granite_multipliers_are_folded(exported):
    """Granite's four multipliers, each folded where the IR already has a place: the embedding's into the table, the
    residual's into o and down, the attention's (instead of 1/sqrt(head_dim)) into q, the logits' into the head."""
    model, ir = _proven(exported, "granite")
    cfg = ir.config
    assert cfg.features == () and not cfg.tied_head
    assert cfg.folded == ("embedding scale 12 (into the table)", "logits scale 0.125 (the head's weights times it)",
                          "residual multiplier 0.22 (o's and down's weights times it)",
                          "score scale 0.2 instead of 1/sqrt(head_dim) (q's weights times 0.8)")
    layer, table = model.model.layers[0], _np(model.model.embed_tokens.weight)
    assert np.allclose(ir.embed, 12 * table, rtol=1e-6)
    assert np.allclose(ir.head.weight, table / 8, rtol=1e-6)
    assert np.allclose(ir.layers[0].o.weight, 0.22 * _np(layer.self_attn.o_proj.weight), rtol=1e-6)
    assert np.allclose(ir.layers[0].down.weight, 0.22 * _np(layer.mlp.down_proj.weight), rtol=1e-6)
    assert np.allclose(ir.layers[0].q.weight, 0.8 * _np(layer.self_attn.q_proj.weight), rtol=1e-6)
    _same_logits_as_hf(model, ir)


def _refused(path, pattern: str) -> None:
    with pytest.raises(ModelImportError) as info:
        load(path)
    assert re.fullmatch(pattern, str(info.value)), str(info.value)


def test_qwen3_per_head_qk_norm(exported):
    """Qwen3 normalises each head of q and k (RMSNorm over head_dim, its own gain) before RoPE: recovered by data
    flow into Layer.q_norm / k_norm, proven, and equal to the Hugging Face model's gains and logits."""
    model, ir = _proven(exported, "qwen3")
    cfg = ir.config
    assert cfg.qk_norm and cfg.features == (QK_NORM,) and cfg.folded == ()
    assert cfg.head_dim == 16 and cfg.norm_eps == model.config.rms_norm_eps
    for layer, hf in zip(ir.layers, model.model.layers, strict=True):
        assert np.array_equal(layer.q_norm.weight, _np(hf.self_attn.q_norm.weight).astype(np.float32))
        assert np.array_equal(layer.k_norm.weight, _np(hf.self_attn.k_norm.weight).astype(np.float32))
        assert layer.q_norm.bias is None and layer.k_norm.bias is None
        assert not np.allclose(layer.q_norm.weight, 1.0)  # perturbed: a gain left out would show
    _same_logits_as_hf(model, ir)


def test_gemma3_qk_norm_takes_the_score_scale(exported):
    """Gemma 3's per-head q/k norms ((1 + w) gains) behind a score scale of 24^-0.5 for heads of 16: the scale goes
    into q's norm gain (into q's rows the norm would undo it), proven, equal to Hugging Face's logits. Its post-sublayer
    norms are identities in this export (test_gemma3_post_sublayer_norms reads them)."""
    model, ir = _proven(exported, "gemma3-prenorm")
    cfg = ir.config
    assert cfg.qk_norm and cfg.attn_windows == (16, 16)
    factor = math.sqrt(16 / 24)
    assert cfg.folded == ("embedding scale 8 (into the table)",
                          f"score scale {1 / math.sqrt(24):g} instead of 1/sqrt(head_dim) (q's norm gain times "
                          f"{float(np.float32(factor)):g})")
    for layer, hf in zip(ir.layers, model.model.layers, strict=True):
        gain = 1 + _np(hf.self_attn.q_norm.weight)
        assert np.allclose(layer.q_norm.weight, factor * gain, rtol=1e-6)
        assert np.allclose(layer.k_norm.weight, 1 + _np(hf.self_attn.k_norm.weight), rtol=1e-6)
        assert np.array_equal(layer.q.weight, _np(hf.self_attn.q_proj.weight).astype(np.float32))  # q's rows as they are
    _same_logits_as_hf(model, ir)


POST_NORMS = "post-sublayer norms (RMSNorm of the attention's and the MLP's outputs before the residual Adds)"


def _same_post_norms(ir, model) -> None:
    """The IR's post-sublayer norm gains are Hugging Face's (1 + w), read from the graph's constants."""
    for layer, hf in zip(ir.layers, model.model.layers, strict=True):
        for mine, theirs in ((layer.post_attn_norm, hf.post_attention_layernorm),
                             (layer.post_mlp_norm, hf.post_feedforward_layernorm)):
            assert mine.bias is None and np.allclose(mine.weight, 1 + _np(theirs.weight), rtol=1e-6)
            assert not np.allclose(mine.weight, 1.0)  # perturbed: a gain left out would show


def test_gemma3_post_sublayer_norms(exported):
    """Gemma 3 norms the attention's and the MLP's outputs before each residual Add (the "sandwich" norms): read as
    Layer.post_attn_norm / post_mlp_norm with (1 + w) gains, beside its q/k norms and windows, proven and equal to
    Hugging Face's logits."""
    model, ir = _proven(exported, "gemma3")
    cfg = ir.config
    assert cfg.post_norms and cfg.qk_norm and cfg.attn_windows == (16, 16) and cfg.norm_eps == model.config.rms_norm_eps
    assert cfg.features == (QK_NORM, "windowed attention (layer 0: 16, layer 1: 16)", POST_NORMS)
    _same_post_norms(ir, model)
    _same_logits_as_hf(model, ir)


def test_a_post_norm_of_one_sublayer_only_is_refused_by_name(exported):
    """Gemma 3 with its MLP's post norm made an identity: the chip's post norms come in pairs, so one alone is refused
    naming the attention's softmax, before any proof."""
    _, path = exported("gemma3-attention-post-norm-only")
    _refused(path, re.escape(f"{path}: could not place Softmax node '") + r"[^']+" + re.escape(
        "': a norm of one sublayer's output without one of the other's, or in a parallel block, is not supported; "
        "supported: post-sublayer norms of both sublayers of a sequential block (Gemma 2, Gemma 3)"))


def test_gemma2_attention_soft_capping(exported):
    """Gemma 2 as configured (attention cap 50, logit cap 30, post-sublayer norms, a local layer of 16 then a global
    one, query_pre_attn_scalar 256 folded into q): the scores' cap c * tanh(s / c) read between the score product and
    the softmax (the scalars before the Tanh are the score scale over c, those after it c), proven, equal to Hugging
    Face's (capped) logits; the
    float forward without it differs from onnxruntime by more than the proof's bound on the model whose scores reach
    12 against a cap of 4 (the test model of tests/test_sim_cocotb.py), so the proof sees the cap."""
    import dataclasses

    model, ir = _proven(exported, "gemma2")
    cfg = ir.config
    assert (cfg.attn_softcap, cfg.logit_softcap, cfg.post_norms, cfg.attn_windows) == (50.0, 30.0, True, (16, None))
    assert cfg.features == ("windowed attention (layer 0: 16)", POST_NORMS, ATTN_CAP.format(50),
                            LOGIT_CAP.replace("0.25", "30"))
    assert cfg.folded == ("embedding scale 8 (into the table)",
                          "score scale 0.0625 instead of 1/sqrt(head_dim) (q's weights times 0.25)")
    _same_post_norms(ir, model)
    _same_logits_as_hf(model, ir)
    model, ir = _proven(exported, "gemma2-cap4")
    assert ir.config.attn_softcap == 4.0
    _same_logits_as_hf(model, ir)
    uncapped = dataclasses.replace(ir, config=dataclasses.replace(ir.config, attn_softcap=None))
    ids = torch.randint(0, 96, (1, 32), generator=torch.Generator().manual_seed(2))
    want = float_forward(ir, ids)
    assert (float_forward(uncapped, ids) - want).abs().max() > 1e-2 * want.abs().max()


def test_a_decreasing_attention_cap_is_refused_by_name(exported, tmp_path):
    """Gemma 2's graph with the factor after each scores' Tanh negated (-50): softmax(-c tanh(s / c)) prefers the
    lowest scores, which no increasing table gives; refused naming the Tanh, before any proof."""
    _, path = exported("gemma2")
    proto = onnx.load(path)
    nodes = list(proto.graph.node)
    tanh = next(n for n in nodes if n.op_type == "Tanh")
    after = next(n for n in nodes if n.op_type == "Mul" and tanh.output[0] in n.input)
    proto.graph.initializer.append(onnx.numpy_helper.from_array(np.array(-50.0, np.float32), "negative_cap"))
    after.input[next(i for i, name in enumerate(after.input) if name != tanh.output[0])] = "negative_cap"
    bad = tmp_path / "decreasing.onnx"
    onnx.save(proto, bad)
    _refused(bad, re.escape(f"{bad}: could not place Tanh node '{tanh.name}': an attention soft-cap c * tanh(b * q.k) "
                            "with b = 0.00125, c = -50 is not supported; supported: b and c positive (then it is "
                            "increasing)"))


def test_bloom_alibi(exported):
    """BLOOM: ALiBi's slopes read off the bias added to the scores (by data flow: no node name), exactly Hugging
    Face's; its embedding LayerNorm folded into the table (the tied head keeps the unnormed one); the fused qkv,
    laid out [q_h, k_h, v_h] per head and cut by Gathers, gives each head its rows. Proven, and equal to the Hugging
    Face model's logits to 64 positions; without the bias the float forward is far from them."""
    import dataclasses

    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    model, ir = _proven(exported, "bloom")
    cfg = ir.config
    slopes = tuple(float(s) for s in _get_alibi_slopes(4, torch.device("cpu")))
    assert cfg.positions == "alibi" and cfg.alibi_slopes == slopes and ir.pos_embed is None
    assert cfg.features == (ALIBI,)
    assert cfg.folded == ("LayerNorm of the embedding (into the table; the head keeps the unnormed table)",)
    assert cfg.norm == "layer" and cfg.activation == "gelu_tanh" and not cfg.tied_head
    table = model.transformer.word_embeddings_layernorm(model.transformer.word_embeddings.weight)
    assert np.allclose(ir.embed, _np(table), atol=1e-5)
    assert np.array_equal(ir.head.weight, _np(model.lm_head.weight).astype(np.float32))
    for layer, hf in zip(ir.layers, model.transformer.h, strict=True):
        fused = _np(hf.self_attention.query_key_value.weight).reshape(4, 3, 16, 64)  # (head, q/k/v, dim, in)
        for part, i in (("q", 0), ("k", 1), ("v", 2)):
            assert np.array_equal(getattr(layer, part).weight, fused[:, i].reshape(64, 64).astype(np.float32))
    _same_logits_as_hf(model, ir)
    ids = torch.randint(0, 96, (1, 64), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits
    flat = dataclasses.replace(ir, config=dataclasses.replace(cfg, alibi_slopes=None))
    assert (float_forward(flat, ids) - want).abs().max() > 0.1 * want.abs().max()


def test_mpt_alibi(exported):
    """MPT builds ALiBi as slope_h * (key - last position), negative, from a table sliced to the sequence: read off
    its graph as BLOOM's, equal to Hugging Face's slopes and logits to 64 positions."""
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    model, ir = _proven(exported, "mpt")
    cfg = ir.config
    bias = build_mpt_alibi_tensor(4, 2)  # (heads, 1, 2): -slope_h, 0
    assert cfg.positions == "alibi" and cfg.alibi_slopes == tuple((-bias[:, 0, 0]).tolist())
    assert cfg.features == (ALIBI,)
    assert cfg.norm == "layer" and cfg.activation == "gelu" and cfg.tied_head and cfg.folded == ()
    _same_logits_as_hf(model, ir)


def test_a_bias_on_the_scores_that_is_not_alibi_is_refused_by_name(exported, tmp_path):
    """BLOOM's graph with its ALiBi bias squared before it reaches the scores: a bias that does not grow linearly
    with the key position is refused naming the Add, before any proof."""
    _, path = exported("bloom")
    proto = onnx.load(path)
    nodes = list(proto.graph.node)
    tile = next(n for n in nodes if n.op_type == "Tile")
    for node in nodes:
        node.input[:] = ["squared" if i == tile.output[0] else i for i in node.input]
    proto.graph.node.insert(nodes.index(tile) + 1, onnx.helper.make_node(
        "Mul", [tile.output[0], tile.output[0]], ["squared"], name="square"))
    bad = tmp_path / "squared.onnx"
    onnx.save(proto, bad)
    _refused(bad, re.escape(f"{bad}: could not place Add node '") + r"[^']+" + re.escape(
        "': a bias on the scores that does not grow linearly with the key position (one slope per head, the same for "
        "every query) is not supported; supported: ALiBi (BLOOM, MPT)"))


def test_alibi_with_windows_is_refused_by_the_quantiser(exported):
    """The chip keeps a windowed layer's keys in a ring of slots, whose positions it does not hold: BLOOM as if its
    layers were windowed is refused by name before any work, not compiled wrongly."""
    import dataclasses

    from hardwire.quant.weights import QuantizationError

    _, path = exported("bloom")
    ir = load(path, verify=False)
    windowed = dataclasses.replace(ir, config=dataclasses.replace(ir.config, attn_windows=(8, None)))
    with pytest.raises(QuantizationError, match=re.escape(
            "the integer decoder does not implement ALiBi with windowed attention (the chip's ring of keys does not "
            "hold their positions) yet")):
        quantize(windowed, "int8", context=24)


ATTN_CAP = "attention soft-capping {:g} (scores cap * tanh(s / cap) before the softmax)"


def _capped_granite(exported, tmp_path, cap: float = 0.25):
    """Granite's graph with its logits capped as Gemma 2 caps them (tanh(x / cap) * cap after the head and Granite's
    own logits multiplier; Gemma 2's cap is 30, 0.25 bites on this random model's logits of about 0.3): -> (Granite's
    path, the capped model's path)."""
    _, path = exported("granite")
    proto = onnx.load(path)
    logits = proto.graph.output[0].name
    last = next(n for n in proto.graph.node if logits in n.output)
    last.output[0] = "uncapped"
    proto.graph.initializer.append(onnx.numpy_helper.from_array(np.array(cap, np.float32), "cap"))
    proto.graph.node.extend([onnx.helper.make_node("Div", ["uncapped", "cap"], ["scaled"], name="cap_div"),
                             onnx.helper.make_node("Tanh", ["scaled"], ["capped"], name="cap_tanh"),
                             onnx.helper.make_node("Mul", ["capped", "cap"], [logits], name="cap_mul")])
    capped = tmp_path / "capped.onnx"
    onnx.save(proto, capped)
    return path, capped


LOGIT_CAP = "logit soft-capping 0.25 (cap * tanh(logits / cap): the argmax of the uncapped logits is the same token)"


def test_logit_soft_capping_is_imported(exported, tmp_path):
    """Gemma 2's cap * tanh(z / cap) of the logits: read as ModelConfig.logit_softcap (the scalars around the Tanh,
    Granite's multiplier among them, folded into the head as before), proven against onnxruntime. The head gives z,
    the float forward caps it; the chip takes the argmax of z, which the increasing cap keeps (numerics §8), so the
    integer decoder is the uncapped model's: with one calibration text, the same QModel logits."""
    from hardwire.quant.reference import ReferenceDecoder, forward

    plain_path, path = _capped_granite(exported, tmp_path)
    ir, plain = load(path), load(plain_path, verify=False)
    assert ir.proof.passed, ir.proof.summary()
    cfg = ir.config
    assert cfg.logit_softcap == 0.25 and cfg.features == (LOGIT_CAP,) and cfg.folded == plain.config.folded
    assert np.array_equal(ir.head.weight, plain.head.weight)
    ids = torch.randint(0, 96, (2, 24), generator=torch.Generator().manual_seed(4))
    z = float_forward(ir, ids, capped=False)
    assert torch.equal(z, float_forward(plain, ids))
    assert torch.allclose(float_forward(ir, ids), 0.25 * torch.tanh(z / 0.25), rtol=1e-6, atol=1e-6)
    assert (float_forward(ir, ids) - z).abs().max() > 0.02  # the cap bites on these logits
    calib = ids[:, :16]
    qm, qplain = quantize(ir, "int8", context=24, calib_ids=calib), quantize(plain, "int8", context=24, calib_ids=calib)
    assert torch.equal(forward(qm, ids), forward(qplain, ids))
    agree = (forward(qm, ids).argmax(-1) == float_forward(ir, ids).argmax(-1)).double().mean()
    assert agree >= 0.9, agree
    assert ReferenceDecoder(qm).generate([5, 17, 3], 8) == ReferenceDecoder(qplain).generate([5, 17, 3], 8)


def test_float_greedy_takes_the_argmax_before_the_cap():
    """float32's tanh rounds to 1 past about 9: capped logits of 400 and 500 under a cap of 30 tie at 30, and the
    capped argmax would take the lower id, where the uncapped logits (the chip's, numerics §8) order them. The
    float side's greedy decoding and comparisons therefore read the uncapped logits too."""
    from hardwire.frontend.float_model import soft_cap

    z = torch.tensor([400.0, 500.0, -3.0])
    assert soft_cap(z, 30.0)[0] == soft_cap(z, 30.0)[1] == 30.0
    assert int(soft_cap(z, 30.0).argmax()) == 0 and int(z.argmax()) == 1
    assert torch.equal(soft_cap(z, None), z)


def test_a_decreasing_logit_cap_is_refused_by_name(exported, tmp_path):
    """A cap of -0.25 makes the logits decreasing in the head's output: its argmax would be the chip's argmin."""
    _, bad = _capped_granite(exported, tmp_path, cap=-0.25)
    _refused(bad, re.escape(f"{bad}: could not place Tanh node 'cap_tanh': a logit soft-cap c * tanh(b * z) with "
                            "b = -0.5, c = -0.25 is not supported; supported: b and c positive (then it is "
                            "increasing in z)"))


@pytest.mark.parametrize("name,scheme,context", [
    ("llama3-rope", "int8", 48), ("yarn-rope", "int8", 48),  # past the schedules' original 32 and 16 positions
    ("gptj", "int8", 24), ("gptj", "mxfp4", 24), ("cohere", "int8", 24), ("phi3", "int8", 24), ("granite", "int8", 24),
    ("qwen3", "int8", 24), ("gemma3-prenorm", "int8", 24), ("gemma3", "int8", 24), ("gemma3", "int4", 24),
    ("gemma2", "int8", 24), ("gemma2-cap4", "int8", 24), ("bloom", "int8", 32), ("mpt", "int8", 32)])
def test_decode_in_the_reference(exported, name, scheme, context):
    """Every feature here is folded into the IR's existing fields, is a table (the RoPE schedule, the attention
    soft-cap), a norm (q/k, post-sublayer) or no hardware at all (the logit cap): the integer decoder tracks the float
    model, and its KV-cached decoder agrees with the whole-prefix forward token for token."""
    from hardwire.quant.reference import ReferenceDecoder, forward

    _, path = exported(name)
    ir = load(path, verify=False)
    qm = quantize(ir, scheme, context=context)
    ids = torch.randint(0, 96, (1, context), generator=torch.Generator().manual_seed(3))
    got = forward(qm, ids).double() * qm.scales["logits"]
    want = float_forward(ir, ids, capped=False).double()  # a logit soft-cap keeps the argmax: the chip's (numerics §8)
    # as in test_frontend_families.py: random models' logits lie close, and MXFP4 flips more greedy choices (measured
    # 2026-12-07: agreement 0.92-0.96 in int8, 0.75 for GPT-J in MXFP4; error 0.03-0.074 in int8, 0.34 in MXFP4; the
    # other families' 4-bit schemes agree 0.54-0.58 on these random models, below any useful bound)
    agree, error = (0.9, 0.08) if scheme == "int8" else (0.7, 0.35)
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= agree
    assert (got - want).abs().max() <= error * want.abs().max()
    tokens = ReferenceDecoder(qm).generate([5, 17, 3], 8)
    seq = torch.tensor([[5, 17, 3, *tokens[:-1]]])
    assert tokens == forward(qm, seq)[0, 2:].argmax(-1).tolist()


def _signed(norm):
    """A norm with every third gain negated and gain 5 zero: the signs and the zero the chip's multipliers must carry."""
    from hardwire.frontend.ir import Norm

    w = norm.weight.copy()
    w[::3] *= -1
    w[5] = 0.0
    return Norm(w)


def _signed_qk_gains(exported):
    """Qwen3's IR with every third q/k norm gain negated and gain 5 zero."""
    import dataclasses

    ir = load(exported("qwen3")[1], verify=False)
    return dataclasses.replace(ir, layers=tuple(dataclasses.replace(layer, q_norm=_signed(layer.q_norm),
                                                                    k_norm=_signed(layer.k_norm)) for layer in ir.layers))


def test_qk_norm_gains_of_any_sign(exported):
    """The chip's q/k norm multipliers hold magnitudes: a negative gain's sign goes into its row of each head of the
    projection (fold_qk_signs), and a zero gain gets a vanishing multiplier. Qwen3 with every third gain negated and
    one zero decodes in the integer reference as closely as the model itself does, and the projection's output steps
    (what the host's LoRA reads) carry the signs."""
    from hardwire.quant.reference import forward

    ir = _signed_qk_gains(exported)
    qm = quantize(ir, "int8", context=24)
    assert int(qm.layers[0].q_norm.shift[5]) == 62 and int(qm.layers[0].q_norm.mult[5]) == 1  # a zero gain: 0 out
    out_steps = np.array(qm.steps["layers.0.q"][1])
    assert (np.sign(out_steps) == np.tile(np.where(ir.layers[0].q_norm.weight < 0, -1, 1), 4)).all()
    ids = torch.randint(0, 96, (1, 24), generator=torch.Generator().manual_seed(3))
    got = forward(qm, ids).double() * qm.scales["logits"]
    want = float_forward(ir, ids).double()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9
    assert (got - want).abs().max() <= 0.08 * want.abs().max()


def test_post_norm_gains_of_any_sign(exported):
    """The post-sublayer norms' multipliers hold magnitudes too: a negative gain's sign goes into its row of o (down)
    (fold_post_signs), a zero gain gets a vanishing multiplier. Gemma 3 with every third gain negated and one zero
    decodes in the integer reference as closely as the model itself does, and o's and down's output steps carry the
    signs (what the host's LoRA reads)."""
    import dataclasses

    from hardwire.quant.reference import forward

    ir = load(exported("gemma3")[1], verify=False)
    ir = dataclasses.replace(ir, layers=tuple(dataclasses.replace(
        layer, post_attn_norm=_signed(layer.post_attn_norm), post_mlp_norm=_signed(layer.post_mlp_norm))
        for layer in ir.layers))
    qm = quantize(ir, "int8", context=24)
    assert int(qm.layers[0].post_mlp_norm.shift[5]) == 62 and int(qm.layers[0].post_mlp_norm.mult[5]) == 1
    for part in ("o", "down"):
        out_steps = np.array(qm.steps[f"layers.1.{part}"][1])
        assert (np.sign(out_steps) == np.where(ir.layers[1].post_attn_norm.weight < 0, -1, 1)).all()
    ids = torch.randint(0, 96, (1, 24), generator=torch.Generator().manual_seed(3))
    got = forward(qm, ids).double() * qm.scales["logits"]
    want = float_forward(ir, ids).double()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9
    assert (got - want).abs().max() <= 0.08 * want.abs().max()


def test_lora_on_q_before_signed_qk_norm_gains(exported):
    """A host LoRA adapter on q (before its norm) moves the integer decoder as the float merged model says, the rows
    whose gain's sign the chip holds in q's rows included: quantize_lora reads their negative output steps."""
    import dataclasses

    from hardwire.frontend.ir import Linear
    from hardwire.quant.lora import quantize_lora
    from hardwire.quant.qmodel import LoraSpec
    from hardwire.quant.reference import forward

    ir = _signed_qk_gains(exported)
    qm = quantize(ir, "int8", context=32, lora=LoraSpec(4, ("q",)))
    rng = np.random.default_rng(3)
    adapters, layers = {}, list(ir.layers)
    for i, layer in enumerate(ir.layers):
        a, b = rng.normal(size=(4, 64)) * 0.15, rng.normal(size=(64, 4)) * 0.15  # larger: q saturates its int12
        adapters[i, "q"] = quantize_lora(qm, i, "q", a, b, alpha=8.0)
        layers[i] = dataclasses.replace(layer, q=Linear(layer.q.weight + (8.0 / 4) * (b @ a).astype(np.float32)))
    merged = dataclasses.replace(ir, layers=tuple(layers))
    ids = torch.randint(0, 96, (4, 32), generator=torch.Generator().manual_seed(0))
    target = float_forward(merged, ids).argmax(-1)
    agree_with = float((forward(qm, ids, adapters).argmax(-1) == target).double().mean())
    agree_without = float((forward(qm, ids).argmax(-1) == target).double().mean())
    assert agree_without < 0.6 and agree_with > 0.85, (agree_without, agree_with)


def test_float_decoder_has_the_schedule(exported):
    """The KV-cached float decoder (demo, chat) reads the same frequencies as the float forward."""
    from hardwire.frontend.float_decoder import FloatDecoder

    ir = load(exported("llama3-rope")[1], verify=False)
    ids = torch.randint(0, 96, (1, 48), generator=torch.Generator().manual_seed(5))
    decoder = FloatDecoder(ir, capacity=64)
    cached = torch.cat([decoder.feed(ids[0, :30].tolist()), decoder.feed(ids[0, 30:].tolist())])
    assert torch.allclose(cached, float_forward(ir, ids)[0], atol=1e-5)


def test_slices_that_do_not_take_each_row_once_are_refused(exported, tmp_path):
    """Phi-3's k slice moved 8 rows back (rows 56..87: q's last 8 again, and rows 88..95 in no piece): refused naming
    the fused projection, before any proof."""
    _, path = exported("phi3")
    proto = onnx.load(path)
    nodes = list(proto.graph.node)
    fused = next(n for n in nodes if n.op_type == "MatMul")  # the first layer's qkv_proj
    k_slice = [n for n in nodes if n.op_type == "Slice" and n.input[0] == fused.output[0]][1]
    proto.graph.initializer.extend([onnx.numpy_helper.from_array(np.array([56], np.int64), "k_start"),
                                    onnx.numpy_helper.from_array(np.array([88], np.int64), "k_end")])
    k_slice.input[1], k_slice.input[2] = "k_start", "k_end"
    bad = tmp_path / "overlap.onnx"
    onnx.save(proto, bad)
    _refused(bad, re.escape(f"{bad}: could not place MatMul node '{fused.name}': the pieces cut from a fused "
                            "projection do not take each of its rows once"))

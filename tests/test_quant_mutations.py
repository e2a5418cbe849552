"""The deliberate breaks (quant/mutations.py) do what they say, and the check built on them can fail."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from break_check import assert_breaks_change_outputs, assert_case_catches, assert_varied
from random_ir import random_ir

from hardwire.quant import blocks
from hardwire.quant.mutations import breaks, outputs_at_every_position, teacher_forced, undetected
from hardwire.quant.quantize import quantize
from hardwire.quant.reference import ReferenceDecoder, forward
from hardwire.quant.tables import rope_tables

_QM: dict[str, object] = {}


def _qm(kind: str):
    if kind not in _QM:
        options = {
            "llama": dict(d=16, heads=2, kv_heads=1, ffn=24, vocab=20, context=8, layers=2, seed=2),
            "gqa": dict(d=16, heads=4, kv_heads=2, ffn=24, vocab=20, context=8, layers=1, windows=(3,)),
            "gpt2": dict(family="gpt2", d=16, heads=2, kv_heads=2, ffn=24, vocab=20, context=8, layers=2),
            "phi": dict(d=16, heads=2, kv_heads=2, ffn=24, vocab=20, context=8, layers=1, block="shared", rotary_dims=4),
            "echo": dict(d=16, heads=2, kv_heads=1, ffn=24, vocab=20, context=8, layers=1, tied=True, gain=1.0),
        }[kind]
        _QM[kind] = quantize(random_ir(**options), "int8", context=8)
    return _QM[kind]


def _logits(qm, ids: list[int]) -> torch.Tensor:
    return forward(qm, torch.tensor([ids]))[0]


def test_each_model_gets_the_breaks_of_its_features():
    common = {"attention_output_zero", "values_zero", "queries_zero", "current_key_only", "mlp_removed",
              "scores_scaled"}
    assert set(breaks(_qm("llama"))) == common | {"drop_layer_0", "drop_layer_1", "rope_off"}
    assert set(breaks(_qm("gpt2"))) == common | {"drop_layer_0", "drop_layer_1", "positions_zero", "positions_shifted"}
    assert set(breaks(_qm("gqa"))) == common | {"drop_layer_0", "rope_off", "window_ignored", "kv_heads_rolled"}
    assert set(breaks(_qm("phi"))) == common | {"drop_layer_0", "rope_off", "partial_rotary_ignored",
                                                "parallel_block_sequential"}


def test_zeroed_projections_are_zero_and_nothing_else_changes():
    qm = _qm("gpt2")
    broken = breaks(qm)["values_zero"].apply(qm)
    for layer, was in zip(broken.layers, qm.layers, strict=True):
        assert not layer.v.codes.any() and not layer.v.bias.any()
        assert torch.equal(layer.q.codes, was.q.codes) and torch.equal(layer.o.bias, was.o.bias)
    assert not qm.layers[0].v.bias.eq(0).all()  # GPT-2's biases were there to remove


def test_a_dropped_layer_is_the_model_without_it():
    qm = _qm("llama")
    without = dataclasses.replace(qm, layers=qm.layers[1:], config=dataclasses.replace(qm.config, n_layers=1))
    ids = [3, 7, 1, 11, 2]
    assert torch.equal(_logits(breaks(qm)["drop_layer_0"].apply(qm), ids), _logits(without, ids))
    assert not torch.equal(_logits(qm, ids), _logits(without, ids))


def test_attention_to_the_current_key_only_ignores_earlier_tokens():
    broken = breaks(_qm("llama"))["current_key_only"].apply(_qm("llama"))
    assert torch.equal(_logits(broken, [3, 7, 1])[2], _logits(broken, [12, 0, 1])[2])
    assert not torch.equal(_logits(_qm("llama"), [3, 7, 1])[2], _logits(_qm("llama"), [12, 0, 1])[2])


def test_zero_queries_attend_uniformly_in_any_order():
    qm = _qm("gqa")  # one layer (a second's values would depend on the order), RoPE: v has no position
    broken = breaks(qm)["queries_zero"].apply(qm)
    assert torch.equal(_logits(broken, [3, 7, 1])[2], _logits(broken, [7, 3, 1])[2])
    assert not torch.equal(_logits(qm, [3, 7, 1])[2], _logits(qm, [7, 3, 1])[2])


def test_rope_off_rotates_nothing_and_partial_rotary_ignored_rotates_everything():
    qm = _qm("phi")
    x = torch.randint(-2048, 2048, (8, 2, 8))
    off = breaks(qm)["rope_off"].apply(qm)
    assert torch.equal(blocks.rope(x, off.rope_cos, off.rope_sin, 4), blocks.saturate(blocks.round_shift(x, 4), 8))
    full = breaks(qm)["partial_rotary_ignored"].apply(qm)
    cos, sin = rope_tables(qm.config.head_dim, qm.config.rope_theta, qm.context)
    assert torch.equal(full.rope_cos, cos) and torch.equal(full.rope_sin, sin)
    assert not torch.equal(qm.rope_cos, cos)  # the model's own tables pass half of each head through


def test_positions_and_config_breaks():
    qm = _qm("gpt2")
    shifted = breaks(qm)["positions_shifted"].apply(qm)
    assert torch.equal(shifted.pos.codes[:-1], qm.pos.codes[1:])
    assert not breaks(qm)["positions_zero"].apply(qm).pos.codes.any()
    gqa = _qm("gqa")
    assert breaks(gqa)["window_ignored"].apply(gqa).config.layer_windows == (None,)
    k, rolled = gqa.layers[0].k.codes, breaks(gqa)["kv_heads_rolled"].apply(gqa).layers[0].k.codes
    assert torch.equal(rolled[:4], k[4:]) and torch.equal(rolled[4:], k[:4])  # two kv heads of 4 dims, swapped
    phi = _qm("phi")
    sequential = breaks(phi)["parallel_block_sequential"].apply(phi).config
    assert not sequential.parallel_residual and not sequential.shared_norm
    scaled = breaks(qm)["scores_scaled"].apply(qm)
    assert [layer.sm_mult for layer in scaled.layers] == [round(layer.sm_mult / 8**0.5) for layer in qm.layers]


def test_outputs_at_every_position_are_the_prompt_predictions_then_the_generated_tokens():
    qm = _qm("llama")
    out = outputs_at_every_position(qm, [3, 7, 1], 5)
    assert len(out) == 2 + 5 and out[2:] == ReferenceDecoder(qm).generate([3, 7, 1], 5)
    assert out == teacher_forced(qm, [3, 7, 1, *out[2:-1]])
    assert out[:2] == blocks.argmax(_logits(qm, [3, 7])).tolist()


def test_undetected_names_the_breaks_an_echo_cannot_tell_apart():
    """A tied head on these random weights echoes its input ([17, 7, 1, 1, 1, 1, 1]): a chip without queries, MLP,
    score scale or RoPE decodes the same, and the case check fails instead of passing."""
    qm = _qm("echo")
    assert outputs_at_every_position(qm, [3, 7, 1], 5) == [17, 7, 1, 1, 1, 1, 1]
    assert undetected(qm, [3, 7, 1], 5, tuple(breaks(qm))) == ["queries_zero", "mlp_removed", "scores_scaled",
                                                               "rope_off"]
    with pytest.raises(AssertionError, match=r"^a chip with any of the breaks \['queries_zero', 'mlp_removed', "
                                             r"'scores_scaled', 'rope_off'\] decodes exactly the outputs \[17, 7, 1, 1, "
                                             r"1, 1, 1\] of prompt \[3, 7, 1\] \(\+5 generated\): this case cannot"):
        assert_breaks_change_outputs(qm, [3, 7, 1], 5, tuple(breaks(qm)))
    assert undetected(_qm("llama"), [3, 7, 1], 5, tuple(breaks(_qm("llama")))) == []
    with pytest.raises(AssertionError, match=r"^the reference's outputs \[17, 7, 1, 1, 1, 1, 1\] are not varied"):
        assert_case_catches(qm, [3, 7, 1], 5)


def test_a_break_the_model_lacks_is_an_error():
    with pytest.raises(ValueError, match=r"^breaks \['rope_off'\] do not apply to this model; those that do: \["):
        undetected(_qm("gpt2"), [3, 7, 1], 5, ("mlp_removed", "rope_off"))


def test_outputs_that_repeat_are_not_varied():
    assert_varied([1, 2, 3, 4, 5, 1, 2, 3])
    with pytest.raises(AssertionError, match=r"^the reference's outputs \[3, 3, 3, 3, 3, 3, 3, 1\] are not varied: 2 "
                                             r"distinct \(at least 4 wanted\), token 3 at 7 of 8 positions"):
        assert_varied([3, 3, 3, 3, 3, 3, 3, 1])
    with pytest.raises(AssertionError, match=r"token 1 at 5 of 8 positions \(at most half wanted\)$"):
        assert_varied([1, 1, 1, 1, 1, 2, 3, 4])

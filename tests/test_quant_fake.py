"""Fake quantisation (the error budget's instrument) against the integer blocks it imitates."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from random_ir import random_ir

from hardwire.frontend import float_forward
from hardwire.quant import blocks, reference
from hardwire.quant.calibrate import calibrate, self_generated
from hardwire.quant.fake_quant import SITE_GROUPS, integer_softmax, rounding, site_group
from hardwire.quant.fold import fold_norms
from hardwire.quant.quantize import (
    CALIBRATION_SEQUENCES,
    activation_steps,
    quantize,
    residual_and_logit_scales,
    rounded_weights,
)
from hardwire.quant.tables import EXP_STEP, PROB_BITS, exp_table


def test_integer_softmax_equals_the_integer_block_on_table_aligned_scores():
    """Probabilities whose log-gaps are whole table steps give exactly blocks.softmax's Q15 output,
    including gaps past the table's end (255) and masked keys."""
    gen = torch.Generator().manual_seed(0)
    z = torch.randint(0, 400, (64, 37), generator=gen)
    z[:, 0] = 0  # every row has its maximum
    valid = torch.rand((64, 37), generator=gen) > 0.2
    valid[:, 0] = True
    probs = torch.exp(-z.double() * EXP_STEP).masked_fill(~valid, 0)
    probs = probs / probs.sum(-1, keepdim=True)
    expected = blocks.softmax(-z, valid, 2, 1, exp_table(), "test")  # rescale by 2 / 2: z itself
    assert torch.equal(integer_softmax(probs) * 2**PROB_BITS, expected.double())


def test_site_groups_name_every_site_float_forward_rounds():
    assert site_group("layers.3.attn_norm") == "norm"
    assert site_group("final_norm") == "norm"
    assert site_group("layers.0.gate_act") == "gate"
    assert site_group("layers.1.probs") == "probs"
    assert site_group("residual") == "residual"
    seen = set()
    ir = random_ir()
    float_forward(ir, torch.zeros((1, 4), dtype=torch.int64), transform=lambda s, v: seen.add(site_group(s)) or v)
    assert seen == set(SITE_GROUPS)


def test_unknown_site_group_is_refused_with_the_accepted_names():
    ir = random_ir()
    cal = calibrate(fold_norms(ir), torch.zeros((1, 4), dtype=torch.int64))
    with pytest.raises(ValueError, match="unknown site groups \\['kv'\\]; accepted: norm, q, k"):
        rounding(ir.config, activation_steps(ir.config, cal), residual_and_logit_scales(cal), {"kv"})


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_fake_quantised_model_tracks_the_integer_decoder(family):
    """Every site rounded plus the stored weights is the integer decoder up to its table approximations
    (RSQRT, RoPE in Q14): logits within a few residual steps' worth, and the same top-1 almost always."""
    ir = random_ir(family=family, context=32, vocab=64, d=64, ffn=96)
    folded = fold_norms(ir)
    calib = self_generated(folded, sequences=CALIBRATION_SEQUENCES, length=32)
    cal = calibrate(folded, calib)
    qm = quantize(ir, "int8", calib_ids=calib)
    transform = rounding(ir.config, activation_steps(ir.config, cal), residual_and_logit_scales(cal), set(SITE_GROUPS))
    ids = torch.randint(0, 64, (8, 32), generator=torch.Generator().manual_seed(1))
    fake = float_forward(rounded_weights(folded, cal, "int8"), ids, transform=transform).double()
    real = reference.forward(qm, ids).double() * qm.scales["logits"]
    spread = float(real.std())
    assert float((fake - real).abs().mean()) < 0.05 * spread
    assert (fake.argmax(-1) == real.argmax(-1)).double().mean() > 0.9


def test_rounded_weights_are_the_stored_codes():
    """rounded_weights unfolds exactly the codes quantize stores: w * s_in = (codes << group shift) * row_scale."""
    ir = random_ir(context=16)
    folded = fold_norms(ir)
    calib = self_generated(folded, sequences=4, length=16)
    cal = calibrate(folded, calib)
    qm = quantize(ir, "int4", calib_ids=calib)
    rounded = rounded_weights(folded, cal, "int4")
    steps = np.asarray(qm.steps["layers.1.down"][0])
    w = rounded.layers[1].down.weight.astype(np.float64) * steps[None, :]
    lin = qm.layers[1].down
    codes = lin.codes.numpy()
    lanes = lin.weight.numpy()  # codes << the group's shift (int4 is int_group)
    assert lin.scheme == "int_group" and lin.block_shift.numpy().max() > 0
    ratio = w / np.where(lanes == 0, np.nan, lanes)
    row_scale = np.nanmedian(ratio, axis=1)
    assert np.allclose(w, lanes * row_scale[:, None], rtol=1e-5, atol=1e-7)
    assert codes.min() >= -8 and codes.max() <= 7

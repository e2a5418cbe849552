"""Partial rotary on the full-width RoPE unit (quant/partial_rotary.py): q and k's rows reordered, the passed dims'
table entries cos 1, sin 0. The scores must be the model's, in float and in the integer rotation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hardwire.frontend.float_model import _rotate
from hardwire.frontend.float_model import rope_tables as float_rope_tables
from hardwire.quant import blocks
from hardwire.quant.fixedpoint import round_shift, saturate
from hardwire.quant.partial_rotary import rotary_order
from hardwire.quant.tables import rope_tables


@pytest.mark.parametrize("head_dim,rotary_dims", [(16, 4), (16, 8), (8, 2), (32, 24), (16, 16)])
def test_rotary_order_is_a_permutation_pairing_the_rotated_dims(head_dim, rotary_dims):
    order = rotary_order(head_dim, rotary_dims)
    assert sorted(order.tolist()) == list(range(head_dim))
    half, r_half = head_dim // 2, rotary_dims // 2
    for j in range(r_half):  # the model's pair (j, j + r/2) sits on the unit's pair (j, j + hd/2)
        assert (order[j], order[j + half]) == (j, j + r_half)


@pytest.mark.parametrize("head_dim,rotary_dims", [(16, 4), (16, 8), (32, 24)])
def test_reordered_scores_equal_the_models_partial_rotary(head_dim, rotary_dims):
    """q·k after the model's partial rotation equals q·k after the unit's full-width rotation of the reordered dims,
    with the integer tables' angles (Q14, so to their rounding)."""
    theta, positions = 10000.0, 40
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(positions, head_dim, generator=gen), torch.randn(positions, head_dim, generator=gen)
    cos, sin = float_rope_tables(rotary_dims, theta, positions)
    want = _rotate(q, cos, sin) @ _rotate(k, cos, sin).T
    icos, isin = rope_tables(head_dim, theta, positions, rotary_dims)
    fcos, fsin = (torch.cat((t, t), dim=-1).double() / 2**14 for t in (icos, isin))
    order = torch.from_numpy(rotary_order(head_dim, rotary_dims))
    got = _rotate(q[:, order].double(), fcos, fsin) @ _rotate(k[:, order].double(), fcos, fsin).T
    assert torch.allclose(got, want.double(), atol=2e-3 * float(want.abs().max()))
    assert (icos[:, rotary_dims // 2:] == 2**14).all() and (isin[:, rotary_dims // 2:] == 0).all()


def test_a_passed_dim_is_rounded_like_any_other_on_the_integer_rotation():
    """cos 1, sin 0 in Q14: the rotation of an int12 q leaves round_shift(x, 4) saturated to int8, exactly."""
    x = torch.tensor([[[-2048, -2047, -1, 0, 1, 7, 8, 9, 2047, 1000, -1000, 24, -24, 2032, -2040, 5]]])  # (1, 1, 16)
    cos, sin = rope_tables(16, 10000.0, 3, rotary_dims=4)
    got = blocks.rope(x, cos[2], sin[2], 4)
    passed = [i for i in range(16) if i % 8 >= 2]  # the unit's pairs 2..7 are passed through
    assert torch.equal(got[..., passed], saturate(round_shift(x[..., passed], 4), 8))


def test_full_rotary_tables_are_unchanged():
    cos, sin = rope_tables(16, 500.0, 10)
    assert torch.equal(cos, rope_tables(16, 500.0, 10, 16)[0]) and torch.equal(sin, rope_tables(16, 500.0, 10, 16)[1])
    angle = 3 * 500.0 ** (-2 * 5 / 16)
    assert int(cos[3, 5]) == int(np.floor(np.cos(angle) * 2**14 + 0.5))

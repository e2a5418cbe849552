"""The GGUF writer of the CPU baseline (benchmarks/gguf_export.py): the tensor layout llama.cpp reads.

No llama.cpp here (the benchmark checks llama.cpp's logits against ours when it runs); these tests hold
the part that can be wrong silently: the q/k row order that turns our rotate-half RoPE into llama.cpp's
adjacent-pair RoPE, and the names and shapes in the file.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from random_ir import random_ir

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from gguf_export import llama_tensors, rope_permute, rope_unpermute, unsupported


def rotate_half(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """Our RoPE (frontend.float_model._rotate) on one head: dims j and j + hd/2 rotate together."""
    x1, x2 = np.split(x, 2)
    cos, sin = np.cos(angles), np.sin(angles)  # (hd/2,)
    return np.concatenate((x1 * cos - x2 * sin, x2 * cos + x1 * sin))


def rotate_pairs(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """llama.cpp's "normal" RoPE (its llama architecture) on one head: dims 2j and 2j + 1 rotate together."""
    even, odd = x[0::2], x[1::2]
    cos, sin = np.cos(angles), np.sin(angles)
    out = np.empty_like(x)
    out[0::2], out[1::2] = even * cos - odd * sin, odd * cos + even * sin
    return out


@pytest.mark.parametrize("heads, head_dim", [(4, 32), (4, 16), (2, 8)])
def test_permute_round_trips_and_matches_the_formula(heads: int, head_dim: int) -> None:
    rng = np.random.default_rng(heads * head_dim)
    w = rng.normal(size=(heads * head_dim, 24)).astype(np.float32)
    permuted = rope_permute(w, heads)
    np.testing.assert_array_equal(rope_unpermute(permuted, heads), w)
    half = head_dim // 2
    for h in range(heads):  # new row 2j of a head is old row j, new row 2j + 1 is old row j + hd/2
        for j in range(half):
            np.testing.assert_array_equal(permuted[h * head_dim + 2 * j], w[h * head_dim + j])
            np.testing.assert_array_equal(permuted[h * head_dim + 2 * j + 1], w[h * head_dim + j + half])


def test_permuted_rows_make_pair_rope_equal_to_rotate_half() -> None:
    """Projections by the permuted rows, rotated in pairs, are ours rotated by halves, in the permuted order."""
    heads, head_dim, d = 4, 16, 24
    rng = np.random.default_rng(1)
    w, x = rng.normal(size=(heads * head_dim, d)), rng.normal(size=d)
    position = 37
    angles = position / 10000.0 ** (np.arange(0, head_dim, 2) / head_dim)  # (hd/2,) as frontend.rope_tables
    ours = np.concatenate([rotate_half(q, angles) for q in np.split(w @ x, heads)])
    theirs = np.concatenate([rotate_pairs(q, angles) for q in np.split(rope_permute(w, heads) @ x, heads)])
    np.testing.assert_allclose(theirs, rope_permute(ours[:, None], heads)[:, 0], rtol=1e-12, atol=1e-12)


def test_tensor_names_shapes_and_layout() -> None:
    ir = random_ir(vocab=40, d=32, layers=2, heads=4, kv_heads=2, ffn=48)
    tensors = dict(llama_tensors(ir))
    assert list(tensors)[:3] == ["token_embd.weight", "blk.0.attn_norm.weight", "blk.0.attn_q.weight"]
    assert tensors["token_embd.weight"].shape == (40, 32)
    assert tensors["blk.1.attn_k.weight"].shape == (16, 32)  # 2 kv heads x head_dim 8
    assert tensors["blk.1.ffn_down.weight"].shape == (32, 48)
    assert tensors["output.weight"].shape == (40, 32)  # untied head
    np.testing.assert_array_equal(tensors["blk.0.attn_q.weight"], rope_permute(ir.layers[0].q.weight, 4))
    np.testing.assert_array_equal(tensors["blk.0.attn_k.weight"], rope_permute(ir.layers[0].k.weight, 2))
    np.testing.assert_array_equal(tensors["blk.0.attn_v.weight"], ir.layers[0].v.weight)  # v is not rotated
    assert "output.weight" not in dict(llama_tensors(random_ir(tied=True)))  # llama.cpp reuses token_embd


def test_models_llama_cannot_hold_are_refused_by_name() -> None:
    assert unsupported(random_ir()) == []
    gpt2 = random_ir(family="gpt2")
    problems = unsupported(gpt2)
    assert "norm 'layer' (llama has RMSNorm)" in problems
    assert "learned positions (llama has RoPE)" in problems
    with pytest.raises(ValueError, match="cannot hold this model: norm 'layer'"):
        llama_tensors(gpt2)

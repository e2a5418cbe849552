"""The KV-cached float decoder against the full-sequence float forward.

Greedy tokens must be exactly the argmax of float_forward over the same prefix at every
step; logits must agree to ATOL + RTOL·|x| (they differ only in float summation order:
one query row against cached keys instead of the whole masked square).
"""

from __future__ import annotations

import pytest
import torch
from random_ir import random_ir

from hardwire.cli import BUNDLED_MODEL
from hardwire.frontend import ModelIR, float_forward, load
from hardwire.frontend.float_decoder import DecodeError, FloatDecoder

ATOL = 1e-4  # logits reach ~30; the largest difference seen is 2e-5 (bundled model, 128 positions)
RTOL = 1e-4

MODELS = {
    "llama-gqa": lambda: random_ir(family="llama", kv_heads=2, context=24, seed=1),
    "gpt2": lambda: random_ir(family="gpt2", heads=4, kv_heads=4, context=24, seed=2),
}


@pytest.fixture(scope="module")
def bundled() -> ModelIR:
    return load(BUNDLED_MODEL)


def check_greedy(ir: ModelIR, prompt: list[int], n: int) -> None:
    decoder = FloatDecoder(ir)
    out = decoder.generate(prompt, n)
    full = float_forward(ir, torch.tensor([prompt + out[:-1]]))[0, len(prompt) - 1:]  # logits that chose each token
    assert full.argmax(-1).tolist() == out


def check_teacher_forced(ir: ModelIR, ids: list[int], prompt_len: int) -> None:
    """Prompt in one call, then one token per call: each step's logits against the full forward's row."""
    decoder = FloatDecoder(ir)
    steps = [decoder.feed(ids[:prompt_len])] + [decoder.feed([tok]) for tok in ids[prompt_len:]]
    cached = torch.cat(steps)
    full = float_forward(ir, torch.tensor([ids]))[0]
    torch.testing.assert_close(cached, full, atol=ATOL, rtol=RTOL)
    assert cached.argmax(-1).tolist() == full.argmax(-1).tolist()


@pytest.mark.parametrize("name", MODELS)
def test_random_models(name: str) -> None:
    ir = MODELS[name]()
    context = ir.config.context
    check_greedy(ir, [1, 2, 3], context - 2)  # fills the context exactly
    ids = torch.randint(0, ir.config.vocab_size, (context,), generator=torch.Generator().manual_seed(0)).tolist()
    check_teacher_forced(ir, ids, prompt_len=5)


def test_bundled_model(bundled: ModelIR) -> None:
    stoi = {c: i for i, c in enumerate(bundled.vocab)}
    check_greedy(bundled, [stoi[c] for c in "ROMEO:"], 123)  # 6 + 122 fed = 128 positions, the whole context
    ids = torch.randint(0, bundled.config.vocab_size, (128,), generator=torch.Generator().manual_seed(0)).tolist()
    check_teacher_forced(bundled, ids, prompt_len=16)


def test_limits() -> None:
    ir = MODELS["gpt2"]()
    decoder = FloatDecoder(ir)
    with pytest.raises(DecodeError, match="empty"):
        decoder.generate([], 3)
    with pytest.raises(DecodeError, match="out of range"):
        decoder.generate([ir.config.vocab_size], 3)
    with pytest.raises(DecodeError, match="context"):
        decoder.generate([1] * 20, 6)  # 20 + 5 fed > 24
    assert len(decoder.generate([1] * 20, 5)) == 5  # 20 + 4 fed = 24: fits

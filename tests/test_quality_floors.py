"""A floor on quality: the integer decoder's agreement with float on a fixed slice of validation text.

Every token-exact test proves only that the RTL equals the reference; these fail when the
quantiser gets worse. The slice is the first 16 windows of 128 characters of the validation
split (the last 10% of tinyshakespeare); the floors sit about a point under what each scheme
measured there (2026-12-06, benchmarks/quality.py has the whole split).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hardwire.cli import BUNDLED_MODEL
from hardwire.frontend import float_forward, load
from hardwire.quant import reference
from hardwire.quant.quantize import quantize

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"
WINDOWS, LENGTH = 16, 128
FLOORS = {"int8": 0.970, "int4": 0.878, "mixed36": 0.860, "mxfp4": 0.858, "int3": 0.749}  # measured - 1 point


def _slice(vocab: tuple[str, ...]) -> torch.Tensor:
    text = CORPUS.read_text(encoding="utf-8")
    val = text[int(len(text) * 0.9):][: WINDOWS * LENGTH]
    stoi = {c: i for i, c in enumerate(vocab)}
    return torch.tensor([stoi[c] for c in val], dtype=torch.int64).view(WINDOWS, LENGTH)


@pytest.mark.parametrize("scheme", list(FLOORS))
def test_agreement_with_float_stays_above_its_floor(scheme):
    ir = load(BUNDLED_MODEL)
    ids = _slice(ir.vocab)
    qm = quantize(ir, scheme)
    agreement = (reference.forward(qm, ids).argmax(-1) == float_forward(ir, ids).argmax(-1)).double().mean().item()
    print(f"{scheme}: {agreement:.2%}")
    assert agreement >= FLOORS[scheme], f"{scheme}: top-1 agreement {agreement:.2%} is below its floor {FLOORS[scheme]:.1%}"

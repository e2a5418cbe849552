"""A floor on quality: the integer decoder's agreement with float on a fixed slice of validation text.

Every token-exact test proves only that the RTL equals the reference; these fail when the
quantiser gets worse. The slice is the first 16 windows of 128 tokens of the validation
split (the last 10% of tinyshakespeare; its first 8,192 characters are in tests/data, so that
the suite needs nothing outside the repository), on both bundled models: the character model and the
word-piece model. The floors sit about a point under what each scheme measured there
(2026-12-06, after group scales, act-order GPTQ and scales counted in mixed36's budget;
benchmarks/quality.py has the whole split).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hardwire.cli import BUNDLED_MODEL
from hardwire.frontend import float_forward, load
from hardwire.frontend.vocab import encode
from hardwire.quant import reference
from hardwire.quant.quantize import quantize

VALIDATION_HEAD = Path(__file__).resolve().parent / "data" / "tinyshakespeare_validation_head.txt"
PIECES_MODEL = BUNDLED_MODEL.parent / "tinyshakespeare_pieces.onnx"
WINDOWS, LENGTH = 16, 128
FLOORS = {  # measured - 1 point
    (BUNDLED_MODEL, "int8"): 0.970, (BUNDLED_MODEL, "int4"): 0.879, (BUNDLED_MODEL, "mixed36"): 0.846,
    (BUNDLED_MODEL, "mxfp4"): 0.858, (BUNDLED_MODEL, "int3"): 0.763,
    (PIECES_MODEL, "int8"): 0.967, (PIECES_MODEL, "int4"): 0.788, (PIECES_MODEL, "mixed36"): 0.681,
    (PIECES_MODEL, "mxfp4"): 0.723,
}


def _slice(vocab: tuple[str, ...]) -> torch.Tensor:
    ids = encode(VALIDATION_HEAD.read_text(encoding="utf-8"), vocab)
    assert len(ids) >= WINDOWS * LENGTH, f"{VALIDATION_HEAD} holds {len(ids)} tokens; the slice needs {WINDOWS * LENGTH}"
    return torch.tensor(ids[: WINDOWS * LENGTH], dtype=torch.int64).view(WINDOWS, LENGTH)


SHARED = (BUNDLED_MODEL, "int8")  # quantised once per run by the session fixture bundled_int8 (conftest.py)


def _cases():
    for model, scheme in FLOORS:
        marks = [pytest.mark.xdist_group("bundled_int8")] if (model, scheme) == SHARED else []
        yield pytest.param(model, scheme, marks=marks, id=f"{model.stem}-{scheme}")


@pytest.mark.parametrize("model,scheme", list(_cases()))
def test_agreement_with_float_stays_above_its_floor(model, scheme, request):
    if (model, scheme) == SHARED:  # the same quantize(load(model), "int8") as the golden tokens' and the simulation's
        ir, qm = request.getfixturevalue("bundled_int8")
    else:
        ir = load(model)
        qm = quantize(ir, scheme)
    ids = _slice(ir.vocab)
    agreement = (reference.forward(qm, ids).argmax(-1) == float_forward(ir, ids).argmax(-1)).double().mean().item()
    print(f"{model.stem} {scheme}: {agreement:.2%}")
    floor = FLOORS[model, scheme]
    assert agreement >= floor, f"{model.stem} {scheme}: top-1 agreement {agreement:.2%} is below its floor {floor:.1%}"

"""The import proof: the IR's float forward must reproduce onnxruntime's logits.

Recovery places nodes by structure; this check is what makes the placement trustworthy.
It runs random token sequences of several lengths through both and compares logits
with a tolerance relative to the largest logit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import torch

from .float_model import float_forward
from .graph import ort_session
from .ir import ModelIR

TOLERANCE = 1e-4  # max |ir - ort| must be <= TOLERANCE * max |ort logit|


@dataclass(frozen=True)
class Proof:
    sequences: int  # random sequences compared
    lengths: tuple[int, ...]  # their lengths
    max_abs_diff: float  # largest |ir - onnxruntime| over all logits
    max_abs_logit: float  # largest |onnxruntime logit|
    tolerance: float  # relative bound that max_abs_diff must meet

    @property
    def passed(self) -> bool:
        return self.max_abs_diff <= self.tolerance * self.max_abs_logit

    def summary(self) -> str:
        ratio = self.max_abs_diff / max(self.max_abs_logit, 1e-30)
        verdict = "PASS" if self.passed else "FAIL"
        return (f"{verdict}: max |IR - onnxruntime| = {self.max_abs_diff:.3g} = {ratio:.2g} x max |logit| "
                f"({self.max_abs_logit:.3g}), bound {self.tolerance:g}, over {self.sequences} random sequences "
                f"of lengths {list(self.lengths)}")


def prove(ir: ModelIR, proto: onnx.ModelProto, input_name: str, input_dtype: type, lengths: tuple[int, ...],
          seed: int = 0) -> Proof:
    """Compare IR and onnxruntime logits on random sequences of the given lengths."""
    session = ort_session(proto)
    rng = np.random.default_rng(seed)
    worst_diff, worst_logit = 0.0, 0.0
    for length in lengths:
        ids = rng.integers(0, ir.config.vocab_size, size=(1, length))
        expected = session.run(None, {input_name: ids.astype(input_dtype)})[0]
        got = float_forward(ir, torch.from_numpy(ids)).numpy()
        worst_diff = max(worst_diff, float(np.abs(got - expected.reshape(got.shape)).max()))
        worst_logit = max(worst_logit, float(np.abs(expected).max()))
    return Proof(sequences=len(lengths), lengths=tuple(lengths), max_abs_diff=worst_diff,
                 max_abs_logit=worst_logit, tolerance=TOLERANCE)

"""The import proof: the IR's float forward must reproduce onnxruntime's logits.

Recovery places nodes by structure; this check is what makes the placement trustworthy.
It runs random token sequences of several lengths through both and compares logits
with a tolerance relative to the largest logit.

A comparison can also be vacuous: a NaN compares as no difference at all, and logits
that never vary (all zero, or one constant) agree with any reading of the graph that
also yields that constant. Such a proof is refused (`Proof.vacuous`), not passed.
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
    logit_spread: float = float("inf")  # max - min of onnxruntime's logits over all sequences and positions
    non_finite: str | None = None  # where a NaN or infinite logit first appeared (which side, which length)

    @property
    def vacuous(self) -> str | None:
        """Why this comparison cannot mean anything (non-finite or constant logits), or None when it can."""
        if self.non_finite is not None:
            return (f"the float forward does not stay finite: {self.non_finite}, although every weight is finite; "
                    "the weights are too large for float32 arithmetic (the proof compares numbers, and a NaN "
                    "equals nothing): scale the model down or export it from a checkpoint that trains to finite "
                    "activations")
        if self.logit_spread <= self.tolerance * self.max_abs_logit:
            return (f"the logits are constant ({self.max_abs_logit:.3g} in magnitude, varying by "
                    f"{self.logit_spread:.3g} over {self.sequences} random sequences of lengths "
                    f"{list(self.lengths)}): a proof against a constant is no proof, and the model predicts "
                    "nothing; import a model whose logits depend on its input")
        return None

    @property
    def passed(self) -> bool:
        return self.vacuous is None and self.max_abs_diff <= self.tolerance * self.max_abs_logit

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
    low, high = np.inf, -np.inf
    non_finite = None
    for length in lengths:
        ids = rng.integers(0, ir.config.vocab_size, size=(1, length))
        expected = session.run(None, {input_name: ids.astype(input_dtype)})[0]
        got = float_forward(ir, torch.from_numpy(ids)).numpy()
        for side, logits in (("onnxruntime", expected), ("the IR", got)):
            if non_finite is None and not np.isfinite(logits).all():
                bad = int((~np.isfinite(logits)).sum())
                non_finite = f"{side} gives {bad} of {logits.size} logits as NaN or infinite at length {length}"
        if non_finite is not None:
            continue  # max() ignores NaN: nothing below may be compared
        worst_diff = max(worst_diff, float(np.abs(got - expected.reshape(got.shape)).max()))
        worst_logit = max(worst_logit, float(np.abs(expected).max()))
        low, high = min(low, float(expected.min())), max(high, float(expected.max()))
    return Proof(sequences=len(lengths), lengths=tuple(lengths), max_abs_diff=worst_diff,
                 max_abs_logit=worst_logit, tolerance=TOLERANCE, logit_spread=max(0.0, high - low),
                 non_finite=non_finite)

"""The import proof's verdict as a record: what was compared, how closely it agreed, and whether the
comparison could mean anything (rules in frontend/proof.py). Its own file so that the IR, which carries
its proof, needs nothing of the proof's machinery.
"""

from __future__ import annotations

from dataclasses import dataclass

TOLERANCE = 1e-4  # max |ir - ort| must be <= TOLERANCE * max |ort logit|


@dataclass(frozen=True)
class Proof:
    sequences: int  # random sequences compared, one of each length
    lengths: tuple[int, ...]  # their lengths
    max_abs_diff: float  # largest |ir - onnxruntime| over all logits
    max_abs_logit: float  # largest |onnxruntime logit|
    tolerance: float  # relative bound that max_abs_diff must meet
    input_length: int  # length of the sequences that test whether the logits depend on the tokens
    input_sequences: int  # how many of that length (the first is the proof's own), different at every position
    input_spread: float  # largest spread of onnxruntime's logits across them at one (position, vocabulary entry)
    logit_spread: float = float("inf")  # max - min of onnxruntime's logits over those sequences and positions
    non_finite: str | None = None  # where a NaN or infinite logit first appeared (which side, which length)

    @property
    def vacuous(self) -> str | None:
        """Why this comparison cannot mean anything (non-finite, constant or input-independent logits), or None."""
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
        if self.input_spread <= self.tolerance * self.max_abs_logit:
            return (f"the logits do not depend on the input tokens: {self.input_sequences} random sequences of length "
                    f"{self.input_length}, different at every position, give the same logits at every position "
                    f"(differing by at most {self.input_spread:.3g}, the largest logit {self.max_abs_logit:.3g} in "
                    "magnitude): the model predicts the same whatever it reads, and a graph read with its token "
                    "input cut off would pass the proof; import a model whose logits depend on its input")
        return None

    @property
    def passed(self) -> bool:
        return self.vacuous is None and self.max_abs_diff <= self.tolerance * self.max_abs_logit

    def summary(self) -> str:
        ratio = self.max_abs_diff / max(self.max_abs_logit, 1e-30)
        verdict = "PASS" if self.passed else "FAIL"
        more = self.input_sequences - 1
        return (f"{verdict}: max |IR - onnxruntime| = {self.max_abs_diff:.3g} = {ratio:.2g} x max |logit| "
                f"({self.max_abs_logit:.3g}), bound {self.tolerance:g}, over {self.sequences} random sequences "
                f"of lengths {list(self.lengths)}" + (f" and {more} more of length {self.input_length}" if more else ""))

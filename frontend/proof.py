"""The import proof: the IR's float forward must reproduce onnxruntime's logits.

Recovery places nodes by structure; this check is what makes the placement trustworthy.
It runs random token sequences of several lengths through both and compares logits
with a tolerance relative to the largest logit.

A comparison can also be vacuous: a NaN compares as no difference at all, and logits
that never vary (all zero, or one constant) agree with any reading of the graph that
also yields that constant. Logits that vary only by position or vocabulary entry, never
with the tokens read (every embedding row the same), are as empty: a graph read with its
token input cut off would match them. So a few more sequences of one length, different
at every position, must give different logits somewhere. Such proofs are refused
(`Proof.vacuous`), not passed.
"""

from __future__ import annotations

import numpy as np
import onnx
import torch

from .float_model import float_forward
from .graph import ort_session
from .ir import ModelIR
from .proof_record import TOLERANCE, Proof

INPUT_SEQUENCES = 4  # sequences of the shortest length, different at every position, whose logits must differ


def _different_everywhere(ids: np.ndarray, count: int, vocab_size: int, rng: np.random.Generator) -> np.ndarray:
    """`count` random sequences like ids (1, L); at each position no two of them, nor ids, hold the same token."""
    columns = []
    for token in ids[0]:
        draws = rng.choice(vocab_size - 1, size=count, replace=False)  # distinct, from the vocabulary less one
        columns.append(draws + (draws >= token))  # skip ids' own token
    return np.stack(columns, axis=1)  # (count, L)


def prove(ir: ModelIR, proto: onnx.ModelProto, input_name: str, input_dtype: type, lengths: tuple[int, ...],
          seed: int = 0) -> Proof:
    """Compare IR and onnxruntime logits on random sequences of the given lengths, and a few more of the
    shortest length that show whether the logits depend on the tokens at all."""
    session = ort_session(proto)
    rng = np.random.default_rng(seed)
    runs = [rng.integers(0, ir.config.vocab_size, size=(1, length)) for length in lengths]  # (1, length) each
    shortest = min(range(len(runs)), key=lambda i: runs[i].shape[1])
    count = min(INPUT_SEQUENCES, ir.config.vocab_size) - 1
    extra = _different_everywhere(runs[shortest], count, ir.config.vocab_size, rng) if count > 0 else []
    runs += [row[None] for row in extra]  # (1, shortest length) each
    worst_diff, worst_logit = 0.0, 0.0
    low, high = np.inf, -np.inf
    same_tokens = []  # onnxruntime's logits of the sequences of the shortest length, (length, vocab) each
    non_finite = None
    for i, ids in enumerate(runs):
        expected = session.run(None, {input_name: ids.astype(input_dtype)})[0]
        got = float_forward(ir, torch.from_numpy(ids)).numpy()
        for side, logits in (("onnxruntime", expected), ("the IR", got)):
            if non_finite is None and not np.isfinite(logits).all():
                bad = int((~np.isfinite(logits)).sum())
                non_finite = f"{side} gives {bad} of {logits.size} logits as NaN or infinite at length {ids.shape[1]}"
        if non_finite is not None:
            continue  # max() ignores NaN: nothing below may be compared
        worst_diff = max(worst_diff, float(np.abs(got - expected.reshape(got.shape)).max()))
        worst_logit = max(worst_logit, float(np.abs(expected).max()))
        if i < len(lengths):  # the constant check speaks of the proof's own sequences, one of each length
            low, high = min(low, float(expected.min())), max(high, float(expected.max()))
        if i == shortest or i >= len(lengths):
            same_tokens.append(expected.reshape(got.shape[-2:]))
    stacked = np.stack(same_tokens) if len(same_tokens) > 1 else None  # (sequences, length, vocab)
    input_spread = float((stacked.max(0) - stacked.min(0)).max()) if stacked is not None else float("inf")
    return Proof(sequences=len(lengths), lengths=tuple(lengths), max_abs_diff=worst_diff,
                 max_abs_logit=worst_logit, tolerance=TOLERANCE, input_length=int(runs[shortest].shape[1]),
                 input_sequences=count + 1, input_spread=input_spread, logit_spread=max(0.0, high - low),
                 non_finite=non_finite)

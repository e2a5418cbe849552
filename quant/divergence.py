"""KL(float || quantised) per token: one definition for the quality benchmark and the quality floors.

Top-1 agreement sees only whether the best token moved; the divergence also sees a distribution that
flattened or sharpened without changing its argmax, so a quantiser can get worse under it first.
"""

from __future__ import annotations

import torch


def kl_per_token(reference: torch.Tensor, logits: torch.Tensor) -> float:
    """Mean over tokens of KL(softmax(reference) || softmax(logits)), in nats.

    reference, logits: (..., vocab) in the same units: the integer decoder's logits must be multiplied
    by qm.scales["logits"] first (the softmax, unlike the argmax, sees the scale).
    """
    ref, lp = reference.double().log_softmax(-1), logits.double().log_softmax(-1)
    return (ref.exp() * (ref - lp)).sum(-1).mean().item()

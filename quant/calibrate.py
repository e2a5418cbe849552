"""Calibration: the activation ranges that fix every integer scale at compile time.

Text comes from the user (a corpus in the model's vocabulary) or, by default, from the
float model itself: sequences it samples from random first tokens. Self-generated text
needs no data set and follows the distribution the model will actually decode.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch

from ..frontend.float_model import float_forward
from ..frontend.ir import ModelIR
from ..progress import track

SMOOTHING = 0.5  # SmoothQuant's alpha for per-channel activation scales


@dataclass(frozen=True)
class Calibration:
    ids: torch.Tensor  # (sequences, length) the token ids calibration ran on
    amax: dict[str, float]  # site -> max |value| (sites named as float_forward's observe calls them)
    mean_sq: dict[str, np.ndarray]  # site -> mean square per channel: importance of a projection's inputs
    samples: dict[str, torch.Tensor]  # site -> every observed value (flat float32), for choosing clipping ranges
    gram: dict[str, np.ndarray]  # site -> E[a a^T] (channels, channels): the Hessian GPTQ rounds against

    def int8_scale(self, site: str) -> float:
        """Scale of one int8 step at a site: the clipping range with the least squared error, over 127."""
        return clip_range(self.samples[site], 127) / 127

    def channel_scales(self, site: str, channels: int, alpha: float = SMOOTHING) -> np.ndarray:
        """Per-channel int8 steps (channels,): channel j is divided by amax_j ** alpha, then one clipped range.

        SmoothQuant's migration: outlier channels get coarser steps, the weights that read them
        absorb the factor (docs/numerics.md §2), and the int8 grid is spent evenly.
        """
        values = self.samples[site].reshape(-1, channels).double()
        amax = values.abs().amax(0)
        factor = amax.clamp(min=max(float(amax.max()), 1e-12) * 1e-3) ** alpha  # (channels,); dead channels clamped
        common = clip_range((values / factor).reshape(-1), 127) / 127
        return (factor * common).numpy()


@torch.no_grad()
def self_generated(ir: ModelIR, sequences: int, length: int, seed: int = 0, progress: bool = False) -> torch.Tensor:
    """Sample (sequences, length) token ids from the float model at temperature 1.

    progress: a bar per position (one float model run each over the sequences so far: the long part of
    quantising with the default calibration)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(ir.config.vocab_size, (sequences, 1), generator=gen)
    for _ in track(range(1, length), "calibration text", unit="positions", enabled=progress):
        probs = float_forward(ir, ids)[:, -1].double().softmax(-1)
        ids = torch.cat((ids, torch.multinomial(probs, 1, generator=gen)), dim=1)
    return ids


def text_ids(text: str, vocab: tuple[str, ...], sequences: int, length: int) -> torch.Tensor:
    """Evenly spaced windows of a text in a character vocabulary."""
    stoi = {c: i for i, c in enumerate(vocab)}
    data = [stoi[c] for c in text if c in stoi]
    if len(data) < length:
        raise ValueError(f"calibration text has {len(data)} characters of the model's vocabulary; need >= {length}")
    starts = np.linspace(0, len(data) - length, sequences).astype(int)
    return torch.tensor([data[s : s + length] for s in starts], dtype=torch.int64)


def calibrate(ir: ModelIR, ids: torch.Tensor) -> Calibration:
    amax: dict[str, float] = defaultdict(float)
    sums: dict[str, torch.Tensor] = {}
    grams: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = defaultdict(int)
    samples: dict[str, list[torch.Tensor]] = defaultdict(list)

    def observe(site: str, value: torch.Tensor) -> None:
        amax[site] = max(amax[site], float(value.abs().max()))
        samples[site].append(value.detach().reshape(-1).float())
        if value.dim() == 3:  # (batch, seq, channels): a projection input
            flat = value.reshape(-1, value.shape[-1]).double()
            sums[site] = sums.get(site, 0) + flat.pow(2).sum(0)
            grams[site] = grams.get(site, 0) + flat.T @ flat
            counts[site] += flat.shape[0]

    float_forward(ir, ids, observe)
    mean_sq = {site: (sums[site] / counts[site]).numpy() for site in sums}
    return Calibration(ids=ids, amax=dict(amax), mean_sq=mean_sq,
                       samples={site: torch.cat(values) for site, values in samples.items()},
                       gram={site: (grams[site] / counts[site]).numpy() for site in grams})


def clip_range(values: torch.Tensor, levels: int) -> float:
    """The clipping range r in (0, max|v|] minimising the squared error of round(v * levels / r) clamped."""
    v = values.double()
    amax = float(v.abs().max())
    if amax == 0:
        return 1e-12
    best, best_err = amax, float("inf")
    for ratio in np.linspace(1.0, 0.2, 33):
        r = amax * ratio
        q = (v * levels / r).round().clamp(-levels - 1, levels) * r / levels
        err = float((v - q).pow(2).sum())
        if err < best_err:
            best, best_err = r, err
    return best

"""A model split by layers over a chain of boards, when one board's block RAM does not hold it.

Board k holds layers first..end of the model (renumbered from 0 in its stage model), their weights
and their KV cache; the first board also holds the embedding, the last the final norm, the head
and the argmax. Between boards passes the residual vector, int16 exactly as the single-board
decoder keeps it (docs/numerics.md), so the chain decodes what `quant.reference` decodes: the
split changes where the layers run, not what they compute. Stages are contiguous runs of layers
chosen to even out the bits each board stores (weights and KV cache), the resource that runs out.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from .qmodel import QModel, Stage

MAX_BOARDS = 16


def kv_layer_bits(qm: QModel) -> int:
    """Bits one layer's K and V cache stores: int8, the whole context."""
    cfg = qm.config
    return 2 * qm.context * cfg.n_kv_heads * cfg.head_dim * 8


def layer_bits(qm: QModel) -> list[int]:
    """Bits each layer stores: its weight codes and its K and V cache."""
    kv = kv_layer_bits(qm)
    bits = []
    for layer in qm.layers:
        lins = [getattr(layer, part) for part in ("q", "k", "v", "o", "gate", "up", "down")]
        bits.append(sum(int(lin.codes.numel()) * lin.bits for lin in lins if lin is not None) + kv)
    return bits


def split_layers(qm: QModel, boards: int) -> list[tuple[int, int]]:
    """Contiguous layer ranges [(first, end), ...], one per board, that minimise the most bits any board stores
    (the embedding counts on the first, the head on the last); every board gets at least one layer."""
    n = qm.config.n_layers
    if isinstance(boards, bool) or not isinstance(boards, int) or not 1 <= boards <= min(n, MAX_BOARDS):
        raise ValueError(f"boards must be a count from 1 to the model's {n} layers (at most {MAX_BOARDS}), "
                         f"got {boards!r}")
    bits = layer_bits(qm)
    embed = sum(int(t.codes.numel()) * t.bits for name, t in qm.weight_tensors() if name in ("embed", "pos"))
    head = int(qm.head.codes.numel()) * qm.head.bits

    def stage_bits(first: int, end: int) -> int:
        return sum(bits[first:end]) + (embed if first == 0 else 0) + (head if end == n else 0)

    @cache
    def best(first: int, k: int) -> tuple[int, tuple[int, ...]]:
        """(the largest stage, the stage ends) of layers first..n over k boards."""
        if k == 1:
            return stage_bits(first, n), (n,)
        options = []
        for end in range(first + 1, n - k + 2):
            rest, ends = best(end, k - 1)
            options.append((max(stage_bits(first, end), rest), (end, *ends)))
        return min(options)

    _, ends = best(0, boards)
    starts = (0, *ends[:-1])
    return list(zip(starts, ends, strict=True))


def stage_model(qm: QModel, first: int, end: int) -> QModel:
    """The part of `qm` one board holds: layers first..end, renumbered from 0 (their windows with them)."""
    cfg = qm.config
    if not 0 <= first < end <= cfg.n_layers:
        raise ValueError(f"a stage is a non-empty run of the model's {cfg.n_layers} layers, got {first}..{end}")
    windows = None if cfg.attn_windows is None else tuple(cfg.attn_windows[first:end])
    return replace(qm, config=replace(cfg, n_layers=end - first, attn_windows=windows), layers=qm.layers[first:end],
                   stage=Stage(first_layer=first, end_layer=end, layers=cfg.n_layers))


def stages(qm: QModel, boards: int) -> list[QModel]:
    """The stage models of `qm` split over `boards` boards."""
    return [stage_model(qm, first, end) for first, end in split_layers(qm, boards)]


def largest_stage(qm: QModel, boards: int) -> QModel:
    """The stage that stores the most bits: the one a board's fit is checked on (every board has the same engine)."""
    return max(stages(qm, boards), key=lambda part: part.weight_bits + part.config.n_layers * kv_layer_bits(part))

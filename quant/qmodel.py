"""QModel: everything the hardware holds, as integers, plus the scales they came from.

It is the contract between quant/ and rtl/: the RTL bakes exactly these codes, tables,
multipliers and shifts. It saves to a build folder as qmodel.npz (arrays) and
qmodel.json (structure and scalars), without pickle.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..frontend.ir import ModelConfig
from .weights import scale_bits

FORMAT_VERSION = 2  # 2: per-channel norm multipliers, projection steps


@dataclass(frozen=True)
class QLinear:
    """y = rescale(W_int @ a + bias, mult[o], shift[o]) into `out_bits` (docs/numerics.md §2)."""

    codes: torch.Tensor  # int64 (out, in): weight codes (MXFP4: element value x 2)
    block_shift: torch.Tensor  # int64 (out, in): left shift per element (MXFP4 block exponent - row minimum, int_group
    #                            the group's exponent; 0 for int)
    bias: torch.Tensor  # int64 (out,): bias in accumulator units (zeros when the model has none)
    mult: torch.Tensor  # int64 (out,): fixed-point multiplier, [2**14, 2**15)
    shift: torch.Tensor  # int64 (out,): rounding right shift
    bits: int  # code width (3, 4, 6, 8; 4 for MXFP4)
    scheme: str  # "int", "int_group" (a power-of-two exponent per 32 inputs) or "mxfp4"
    in_bits: int  # input activation width: 12 reading a norm, 16 for the down projection of a gated MLP, else 8
    out_bits: int  # 8 (activation), 12 (q, k into RoPE), 16 (residual) or 32 (logits)
    acc_bits: int  # declared accumulator width, checked at compile time against the worst case
    error: float  # relative Frobenius error of the quantised weight

    @property
    def weight(self) -> torch.Tensor:
        """Integer weights as the MAC lanes see them: codes << block_shift."""
        return self.codes << self.block_shift


@dataclass(frozen=True)
class QNorm:
    kind: str  # "rms" or "layer"
    eps_q: int  # epsilon in sum-of-squares units
    mult: torch.Tensor  # int64 (d_model,): Q15 normalised value -> int12 activation (out_bits), per channel
    shift: torch.Tensor  # int64 (d_model,)
    out_bits: int = 8  # 12 (NORM_OUT_FRAC) since 2026-12-06; older qmodel.json files load as 8


@dataclass(frozen=True)
class QEmbedding:
    """A table of rows brought to the int16 residual: rescale(codes[t] << shift, mult[t], shift_r[t], 16)."""

    codes: torch.Tensor  # int64 (rows, d_model)
    block_shift: torch.Tensor  # int64 (rows, d_model)
    mult: torch.Tensor  # int64 (rows,)
    shift: torch.Tensor  # int64 (rows,)
    bits: int
    scheme: str
    error: float

    @property
    def weight(self) -> torch.Tensor:
        return self.codes << self.block_shift


@dataclass(frozen=True)
class QLayer:
    attn_norm: QNorm
    q: QLinear  # -> int8, scale s_q
    k: QLinear  # -> int8, scale s_k
    v: QLinear  # -> int8, scale s_v
    o: QLinear  # int8 attention output (its own step) -> int16 residual (or int16 at its own step: post_attn_norm)
    sm_mult: int  # (max - score) -> exp table index
    sm_shift: int
    att_mult: int  # sum p*v (Q15 x s_v) -> int8 attention output
    att_shift: int
    mlp_norm: QNorm
    up: QLinear  # -> int8
    down: QLinear  # hidden (int16 SILU[g] * u, or int8 GELU output) -> int16 residual
    act_table: torch.Tensor  # int64 (256,): SILU (gated, output at the gate's scale) or GELU (output at s_h)
    gate: QLinear | None = None  # -> int8 (gated MLPs); the hidden SILU[g] * u is int16
    q_norm: QNorm | None = None  # per-head q/k norm (numerics §6): each head of raw q (int12) -> int12 into RoPE
    k_norm: QNorm | None = None  #   (head_dim,) multipliers: the gain's magnitude folded in, its sign in q's rows
    alibi: torch.Tensor | None = None  # int64 (n_heads,): ALiBi's slope per query head in score units (numerics §6):
    #                                    score[t] += alibi[h] * t for the key at position t
    cap_mult: int = 0  # attention soft-cap (numerics §6): scores (int32) -> t in units of c / K, the cap table's index
    cap_shift: int = 0  #   (0, 0: no cap)
    post_attn_norm: QNorm | None = None  # post-sublayer norms (numerics §5): o's int16 output (its own step) -> the
    post_mlp_norm: QNorm | None = None  #   int16 residual's step, (d_model,) multipliers with the gain's magnitude


@dataclass(frozen=True)
class LoraSpec:
    """Which projections carry a LoRA adapter (in SRAM on the chip) and of what rank."""

    rank: int  # 0: no adapters
    sites: tuple[str, ...]  # projection names per layer, from q, k, v, o, gate, up, down


@dataclass(frozen=True)
class Stage:
    """Which part of a model one board of a chain holds (quant/chain.py): layers first..end of `layers` in all. The
    first board also holds the embedding, the last the final norm and the head; the others pass the residual on."""

    first_layer: int
    end_layer: int
    layers: int

    @property
    def first(self) -> bool:
        return self.first_layer == 0

    @property
    def last(self) -> bool:
        return self.end_layer == self.layers


@dataclass(frozen=True)
class QModel:
    config: ModelConfig
    scheme: str  # int8, int4, int3, mixed36 or mxfp4
    context: int  # KV cache length baked into the hardware
    embed: QEmbedding
    layers: tuple[QLayer, ...]
    final_norm: QNorm
    head: QLinear  # -> int32 logits at one common scale
    rsqrt: torch.Tensor  # int64 (1024,)
    exp: torch.Tensor  # int64 (256,)
    rope_cos: torch.Tensor  # int64 (context, head_dim / 2) Q14 (empty for learned positions)
    rope_sin: torch.Tensor
    scales: dict[str, float]  # float value of one integer unit at each site (for reports and evaluation)
    steps: dict[str, tuple[list[float], list[float]]]  # projection -> (input step per channel, output step per row)
    lora: LoraSpec
    cap_table: torch.Tensor | None = None  # attention soft-cap: TANH[0..N] (tables.tanh_cap_table); None: no cap
    pos: QEmbedding | None = None  # learned positions
    stage: Stage | None = None  # one board's part of a chain (its layers renumbered from 0); None: the whole model

    @property
    def has_embedding(self) -> bool:
        """This model (or stage) takes tokens: it holds the embedding (and learned positions)."""
        return self.stage is None or self.stage.first

    @property
    def has_head(self) -> bool:
        """This model (or stage) gives tokens: it holds the final norm and the head."""
        return self.stage is None or self.stage.last

    def linears(self) -> typing.Iterator[tuple[str, QLinear]]:
        for i, layer in enumerate(self.layers):
            for part in ("q", "k", "v", "o", "gate", "up", "down"):
                lin = getattr(layer, part)
                if lin is not None:
                    yield f"layers.{i}.{part}", lin
        if self.has_head:
            yield "head", self.head

    def weight_tensors(self) -> typing.Iterator[tuple[str, QLinear | QEmbedding]]:
        if self.has_embedding:
            yield "embed", self.embed
            if self.pos is not None:
                yield "pos", self.pos
        yield from self.linears()

    @property
    def weight_bits(self) -> int:
        return sum(int(t.codes.numel()) * t.bits for _, t in self.weight_tensors())

    @property
    def n_weights(self) -> int:
        return sum(int(t.codes.numel()) for _, t in self.weight_tensors())

    @property
    def block_scaled(self) -> bool:
        """Some tensor shifts per 32 inputs (int_group, mxfp4): the engine's words must not straddle a block."""
        return any(t.scheme != "int" for _, t in self.weight_tensors())

    @property
    def scale_bits(self) -> int:
        """Side information beside the codes: row rescales, group or block exponents (weights.scale_bits)."""
        return sum(scale_bits(*t.codes.shape, t.scheme) for _, t in self.weight_tensors())

    @property
    def avg_weight_bits(self) -> float:
        """Bits per weight, the codes and their scales together: what a format costs, not only its code width."""
        return (self.weight_bits + self.scale_bits) / self.n_weights

    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {}
        tree = _to_tree(self, "", arrays)
        np.savez_compressed(folder / "qmodel.npz", **arrays)
        (folder / "qmodel.json").write_text(json.dumps({"format": FORMAT_VERSION, "qmodel": tree}, indent=1) + "\n")

    @staticmethod
    def load(folder: str | Path) -> QModel:
        folder = Path(folder)
        meta = json.loads((folder / "qmodel.json").read_text())
        if meta.get("format") != FORMAT_VERSION:
            raise ValueError(f"{folder}/qmodel.json has format {meta.get('format')}; this hardwire reads {FORMAT_VERSION}")
        with np.load(folder / "qmodel.npz", allow_pickle=False) as arrays:
            return _from_tree(QModel, meta["qmodel"], dict(arrays))


def _to_tree(value: object, path: str, arrays: dict[str, np.ndarray]) -> object:
    if isinstance(value, torch.Tensor):
        arrays[path] = value.numpy()
        return {"array": path}
    if dataclasses.is_dataclass(value):
        return {f.name: _to_tree(getattr(value, f.name), f"{path}.{f.name}".lstrip("."), arrays)
                for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return [_to_tree(v, f"{path}.{i}", arrays) for i, v in enumerate(value)]
    return value


def _from_tree(kind: object, tree: object, arrays: dict[str, np.ndarray]) -> object:
    origin = typing.get_origin(kind)
    if tree is None:
        return None
    if kind is torch.Tensor:
        return torch.from_numpy(np.array(arrays[tree["array"]]))
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        inner = [a for a in typing.get_args(kind) if a is not type(None)]
        return _from_tree(inner[0], tree, arrays)
    if origin is tuple:
        inner = typing.get_args(kind)[0]
        return tuple(_from_tree(inner, item, arrays) for item in tree)
    if dataclasses.is_dataclass(kind):
        hints = typing.get_type_hints(kind)
        return kind(**{f.name: _from_tree(hints[f.name], tree[f.name], arrays) for f in dataclasses.fields(kind)
                       if f.name in tree or f.default is dataclasses.MISSING})  # a newer field keeps its default
    return tree

"""Deliberate breaks of a QModel: what a broken chip would compute, for judging the tests that check chips.

A token-exact test (the RTL's tokens equal the integer reference's) proves a feature only if a
chip without that feature would decode other tokens on the test's prompt. Each break here is a
QModel that the unchanged reference decodes the way a chip with one bug would: an attention
output or a projection wired to zero, a layer or the MLP skipped, RoPE off, attention to the
current key only, a family feature (partial rotary, windows, parallel blocks, folded scales)
ignored. `undetected` says which breaks leave a test's tokens unchanged at every position: a
test whose case no break can tell apart is no test of that feature.

The breaks change codes and tables, never the reference: the same integer program runs, as it
would on a chip built from the broken QModel.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import blocks
from .qmodel import QEmbedding, QLayer, QLinear, QModel
from .reference import ReferenceDecoder, forward
from .tables import ROPE_BITS, rope_tables


@dataclass(frozen=True)
class Break:
    """One deliberate bug: its name, what a chip with it would do, and whether the model has the feature."""

    name: str
    what: str
    applies: Callable[[QModel], bool]
    apply: Callable[[QModel], QModel]


def _zero(lin: QLinear) -> QLinear:
    return dataclasses.replace(lin, codes=torch.zeros_like(lin.codes), bias=torch.zeros_like(lin.bias))


def _layers(qm: QModel, change: Callable[[int, QLayer], QLayer]) -> QModel:
    return dataclasses.replace(qm, layers=tuple(change(i, layer) for i, layer in enumerate(qm.layers)))


def _zero_part(part: str) -> Callable[[QModel], QModel]:
    return lambda qm: _layers(qm, lambda _, layer: dataclasses.replace(layer, **{part: _zero(getattr(layer, part))}))


def _drop_layer(index: int) -> Callable[[QModel], QModel]:
    """The layer adds nothing to the residual: its O and DOWN write zeros (as if the chip skipped it)."""
    def apply(qm: QModel) -> QModel:
        return _layers(qm, lambda i, layer: layer if i != index else
                       dataclasses.replace(layer, o=_zero(layer.o), down=_zero(layer.down)))
    return apply


def _config(qm: QModel, **changes: object) -> QModel:
    return dataclasses.replace(qm, config=dataclasses.replace(qm.config, **changes))


def _rope_off(qm: QModel) -> QModel:
    return dataclasses.replace(qm, rope_cos=torch.full_like(qm.rope_cos, 1 << ROPE_BITS),
                               rope_sin=torch.zeros_like(qm.rope_sin))


def _rotate_every_dim(qm: QModel) -> QModel:
    cfg = qm.config
    cos, sin = rope_tables(cfg.head_dim, cfg.rope_theta, qm.context)
    return dataclasses.replace(qm, rope_cos=cos, rope_sin=sin)


def _scores_scaled(qm: QModel) -> QModel:
    """Softmax inputs divided by sqrt(head_dim) once more: a score scale folded into q (GPT-Neo has none, Gemma its
    own) forgotten, or the usual one applied twice."""
    root = math.sqrt(qm.config.head_dim)
    return _layers(qm, lambda _, layer: dataclasses.replace(layer, sm_mult=max(1, round(layer.sm_mult / root))))


def _positions(change: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[QModel], QModel]:
    def apply(qm: QModel) -> QModel:
        pos: QEmbedding = qm.pos
        return dataclasses.replace(qm, pos=dataclasses.replace(pos, codes=change(pos.codes),
                                                               block_shift=change(pos.block_shift)))
    return apply


def _kv_heads_rolled(qm: QModel) -> QModel:
    """Each group of query heads reads the next kv head: the grouped-query mapping wired wrongly."""
    cfg = qm.config

    def roll(lin: QLinear) -> QLinear:
        def rows(t: torch.Tensor) -> torch.Tensor:
            return t.view(cfg.n_kv_heads, cfg.head_dim, *t.shape[1:]).roll(1, 0).reshape(t.shape)
        return dataclasses.replace(lin, codes=rows(lin.codes), block_shift=rows(lin.block_shift), bias=rows(lin.bias),
                                   mult=rows(lin.mult), shift=rows(lin.shift))
    return _layers(qm, lambda _, layer: dataclasses.replace(layer, k=roll(layer.k), v=roll(layer.v)))


def _rope(qm: QModel) -> bool:
    return qm.config.positions == "rope"


def _partial(qm: QModel) -> bool:
    cfg = qm.config
    return _rope(qm) and cfg.rotary_dims is not None and cfg.rotary_dims != cfg.head_dim


def _windowed(qm: QModel) -> bool:
    return any(w is not None and w < qm.context for w in qm.config.layer_windows)


def _always(qm: QModel) -> bool:
    return True


def breaks(qm: QModel) -> dict[str, Break]:
    """Every break that applies to qm, by name (layer drops named per layer: drop_layer_0, ...)."""
    all_breaks = [
        Break("attention_output_zero", "every layer's attention adds nothing (O writes zeros)", _always,
              _zero_part("o")),
        Break("values_zero", "V is zero: every head's weighted sum is zero", _always, _zero_part("v")),
        Break("queries_zero", "Q is zero: every score equal, attention uniform over the keys", _always,
              _zero_part("q")),
        Break("current_key_only", "each query attends to its own position's key only", _always,
              lambda qm: _config(qm, attn_windows=(1,) * qm.config.n_layers)),
        Break("mlp_removed", "every layer's MLP adds nothing (DOWN writes zeros)", _always, _zero_part("down")),
        *(Break(f"drop_layer_{i}", f"layer {i} adds nothing to the residual", _always, _drop_layer(i))
          for i in range(len(qm.layers))),
        Break("scores_scaled", "the softmax's inputs divided by sqrt(head_dim) once more (a folded score scale "
              "forgotten)", _always, _scores_scaled),
        Break("rope_off", "RoPE passes q and k through (cos 1, sin 0 at every position)", _rope, _rope_off),
        Break("partial_rotary_ignored", "RoPE rotates every dim, not only the model's rotary ones", _partial,
              _rotate_every_dim),
        Break("positions_zero", "the learned position table is zero", lambda qm: qm.pos is not None,
              _positions(torch.zeros_like)),
        Break("positions_shifted", "position p reads row p + 1 of the table (an offset such as OPT's misplaced)",
              lambda qm: qm.pos is not None, _positions(lambda t: t.roll(-1, 0))),
        Break("window_ignored", "windowed layers attend to every earlier key", _windowed,
              lambda qm: _config(qm, attn_windows=None)),
        Break("parallel_block_sequential", "the MLP reads the residual after attention, not the block's input",
              lambda qm: qm.config.parallel_residual,
              lambda qm: _config(qm, parallel_residual=False, shared_norm=False)),
        Break("qk_norm_skipped", "q and k reach RoPE as projected: the per-head q/k norm skipped",
              lambda qm: any(layer.q_norm is not None for layer in qm.layers),
              lambda qm: _layers(qm, lambda _, layer: dataclasses.replace(layer, q_norm=None, k_norm=None))),
        Break("alibi_dropped", "no ALiBi bias on the scores", lambda qm: any(layer.alibi is not None for layer in qm.layers),
              lambda qm: _layers(qm, lambda _, layer: dataclasses.replace(layer, alibi=None))),
        Break("alibi_heads_rolled", "each head adds the next head's ALiBi slope",
              lambda qm: any(layer.alibi is not None and len(set(layer.alibi.tolist())) > 1 for layer in qm.layers),
              lambda qm: _layers(qm, lambda _, layer: dataclasses.replace(layer, alibi=layer.alibi.roll(1)))),
        Break("post_norm_skipped", "o's and down's outputs reach the residual as they are: the post-sublayer norms "
              "skipped", lambda qm: any(layer.post_attn_norm is not None for layer in qm.layers),
              lambda qm: _layers(qm, lambda _, layer: dataclasses.replace(layer, post_attn_norm=None,
                                                                          post_mlp_norm=None))),
        Break("attention_cap_skipped", "the scores reach the softmax uncapped (in the cap's units: the table an "
              "identity up to 8 caps)", lambda qm: qm.cap_table is not None,
              lambda qm: dataclasses.replace(qm, cap_table=torch.arange(8 * int(qm.cap_table[-1]) + 1))),
        Break("kv_heads_rolled", "query heads read the wrong kv head (grouped-query mapping)",
              lambda qm: qm.config.n_kv_heads > 1 and qm.config.n_kv_heads < qm.config.n_heads, _kv_heads_rolled),
    ]
    return {b.name: b for b in all_breaks if b.applies(qm)}


def outputs_at_every_position(qm: QModel, prompt: list[int], n: int) -> list[int]:
    """What a chip outputs after each token it is fed: the prompt's tokens, then each generated one but the last.

    len(prompt) - 1 predictions inside the prompt, then the n generated tokens (greedy, ties to the lowest id).
    """
    return ReferenceDecoder(qm).outputs(prompt, n)


def teacher_forced(qm: QModel, fed: list[int]) -> list[int]:
    """The output at every position when exactly these tokens are fed (whatever the model would have generated)."""
    return blocks.argmax(forward(qm, torch.tensor([fed]))[0]).tolist()


def undetected(qm: QModel, prompt: list[int], n: int, names: list[str] | tuple[str, ...]) -> list[str]:
    """The named breaks under which a chip fed this prompt and generating n tokens outputs exactly the reference's
    tokens at every position: those a token-exact test on this case cannot catch. An unknown or inapplicable name
    is an error (a test must not claim a feature its model lacks)."""
    available = breaks(qm)
    missing = [name for name in names if name not in available]
    if missing:
        raise ValueError(f"breaks {missing} do not apply to this model; those that do: {sorted(available)}")
    want = outputs_at_every_position(qm, prompt, n)
    fed = prompt + want[len(prompt) - 1:-1]  # the chip's own outputs are fed back until the first difference
    return [name for name in names if teacher_forced(available[name].apply(qm), fed) == want]

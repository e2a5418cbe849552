"""The decoder's arithmetic units: row units, serializer, rescales, norm, softmax, activation tables,
RoPE and argmax. Nothing here is sequenced: the later stages wire them.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import Module
from amaranth.lib import wiring

from ..quant.qmodel import QModel
from .activation import Glu, TableLookup
from .argmax import Argmax
from .datapath import ACT_BITS, Dims
from .mac_array import MacArray
from .norm import NormSite, NormUnit
from .plan import row_code_bits, score_beat
from .rescale import Rescale
from .rope import Rope
from .row_serializer import RowSerializer
from .skid_buffer import SkidBuffer
from .soft_cap import SoftCap
from .softmax import Softmax


@dataclass(frozen=True)
class Units:
    """Every arithmetic unit, one of each kind (per lane where a beat needs several)."""

    macs: list[MacArray]  # the row units
    serializer: RowSerializer  # the row units' sums to the epilogue, in beats
    rescales: list[Rescale]  # one per epilogue lane, in lockstep
    emb_rescale: Rescale  # the embedding's (and learned positions')
    norm_unit: NormUnit  # every norm site, chosen by its `site`
    norm_names: list[str]  # the sites in that order: attn{i}, mlp{i} (unless shared), post_attn{i}, post_mlp{i} (post-
    #                        sublayer norms), final
    softmax: Softmax  # every layer's, chosen by its `site`
    softmax_in: SkidBuffer  # the softmax's input register
    soft_caps: list[SoftCap]  # one per score lane into the softmax: Gemma 2's attention soft-cap (empty: none)
    acts: list[Glu | TableLookup]  # one per epilogue lane, every layer's table, chosen by its `site`
    rope: Rope | None  # None: learned positions
    head_norm: NormUnit | None  # every per-head q/k norm (sites q0, k0, q1, ...), one head at a time; None: none
    argmax: Argmax


def build_units(m: Module, qm: QModel, dims: Dims, acc_bits: int) -> Units:
    """Row units, serializer, rescales, the norm unit (every norm site), the softmax (every layer), one activation
    unit per epilogue lane (every layer's table), RoPE and the argmax."""
    plan, cfg = dims.plan, qm.config
    # the first rows multiply on DSP blocks, the rest by shift-add, each only as wide as the codes it sees
    macs = [MacArray(dims.lanes, act_bits=ACT_BITS, acc_bits=acc_bits, code_bits=row_code_bits(qm, plan, r),
                     multiplier="shift_add" if r >= dims.rows - plan.shift_add_rows else "dsp")
            for r in range(dims.rows)]
    for r, mac in enumerate(macs):
        m.submodules[f"mac{r}"] = mac
    m.submodules.serializer = serializer = RowSerializer(dims.rows, acc_bits, dims.wide)
    rescales = [Rescale(acc_bits + 1, 32) for _ in range(dims.wide)]
    for e, unit in enumerate(rescales):
        m.submodules[f"rescale{e}" if dims.wide > 1 else "rescale"] = unit
    m.submodules.embed_rescale = emb_rescale = Rescale(8 + 24 + 1, 16)
    norm_sites = {}
    for i, layer in enumerate(qm.layers):
        norm_sites[f"attn{i}"] = layer.attn_norm
        if not cfg.shared_norm:  # one norm for both sublayers (Phi): its activations serve the MLP too
            norm_sites[f"mlp{i}"] = layer.mlp_norm
        if layer.post_attn_norm is not None:  # Gemma 2, 3: o's and down's outputs, int16 to the residual's step
            norm_sites[f"post_attn{i}"], norm_sites[f"post_mlp{i}"] = layer.post_attn_norm, layer.post_mlp_norm
    if qm.has_head:  # a chain's earlier boards pass the residual on instead
        norm_sites["final"] = qm.final_norm
    norm_unit = NormUnit(dims.d, cfg.norm, [NormSite(qn.eps_q, qn.mult.tolist(), qn.shift.tolist(), qn.out_bits)
                                            for qn in norm_sites.values()], lanes=plan.vector_lanes, in_lanes=dims.wide)
    m.submodules.norm = norm_unit
    # one softmax for every layer (one head runs at a time), with each layer's scale: its score buffer and
    # exponent tables exist once, so several softmax lanes cost block RAM once, not per layer
    m.submodules.softmax = softmax = Softmax(dims.ctx, [layer.sm_mult for layer in qm.layers],
                                             [layer.sm_shift for layer in qm.layers], lanes=plan.softmax_lanes,
                                             in_lanes=score_beat(plan, dims.hd))
    # its input through a register: the beat's maximum and the running one were the ECP5 critical path with
    # the epilogue's mode decode in front of them
    m.submodules.softmax_skid = softmax_in = SkidBuffer(softmax.i.payload.shape())
    wiring.connect(m, softmax_in.o, softmax.i)
    soft_caps = []
    if qm.cap_table is not None:  # the scores capped on their way into the softmax's input register
        for e in range(softmax.in_lanes):
            m.submodules[f"soft_cap{e}"] = cap = SoftCap(qm.cap_table.tolist())
            soft_caps.append(cap)
    acts = []
    for e in range(dims.wide):
        unit = (Glu if dims.gated else TableLookup)(*(layer.act_table for layer in qm.layers))
        m.submodules[f"act{e}"] = unit
        acts.append(unit)
    rope = None
    if cfg.positions == "rope":
        m.submodules.rope = rope = Rope(qm.rope_cos, qm.rope_sin, in_bits=dims.raw_bits)
    head_norm = None
    if cfg.qk_norm:  # a norm unit of its own, head_dim wide, an element per cycle: the shared one is d_model wide
        head_sites = [NormSite(qn.eps_q, qn.mult.tolist(), qn.shift.tolist(), qn.out_bits)
                      for layer in qm.layers for qn in (layer.q_norm, layer.k_norm)]
        m.submodules.head_norm = head_norm = NormUnit(dims.hd, "rms", head_sites)
    m.submodules.argmax = argmax = Argmax(32, cfg.vocab_size, dims.wide)
    return Units(macs=macs, serializer=serializer, rescales=rescales, emb_rescale=emb_rescale, norm_unit=norm_unit,
                 norm_names=list(norm_sites), softmax=softmax, softmax_in=softmax_in, soft_caps=soft_caps, acts=acts,
                 rope=rope,
                 head_norm=head_norm, argmax=argmax)

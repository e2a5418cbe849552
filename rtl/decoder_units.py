"""The decoder's memories and units: weight banks and their per-row constants, buffers, the KV cache,
the element vectors the epilogue writes, and the arithmetic units (row units, serializer, rescales,
norm, softmax, activation tables, RoPE, argmax). Nothing here is sequenced: the later stages wire them.
"""

from __future__ import annotations

from amaranth.hdl import signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory

from ..quant.qmodel import QLinear
from .activation import Glu, TableLookup
from .argmax import Argmax
from .banked_vector import BankedVector
from .datapath import ACT_BITS, Datapath, Reader
from .mac_array import MacArray
from .norm import NormSite, NormUnit
from .plan import KV_BITS, kv_layer_words, row_code_bits, score_beat, weight_formats
from .rescale import Rescale
from .rope import Rope
from .row_serializer import RowSerializer
from .skid_buffer import SkidBuffer
from .softmax import Softmax
from .weight_banks import WeightBanks
from .weight_store import WeightStore


def build_weights(dp: Datapath) -> None:
    """Weight banks (one set per storage format), each row's epilogue constants, the embedding tables.
    Adds: linears, acc_bits, banks, bank_of, base_of, params, embed, embed_scale, pos_store, pos_scale."""
    m, qm, storage = dp.m, dp.qm, dp.plan.storage
    dp.linears = linears = dict(qm.linears())
    dp.acc_bits = max(max(lin.acc_bits for lin in linears.values()), 32) + 1
    dp.banks, dp.bank_of, dp.base_of = [], {}, {}
    for index, ((scheme, bits), names) in enumerate(weight_formats(qm).items()):
        wb = WeightBanks([(linears[n].codes.numpy(), linears[n].block_shift.numpy()) for n in names], rows=dp.rows,
                         lanes=dp.lanes, code_bits=bits, scheme=scheme, storage=storage)
        m.submodules[f"weights{index}"] = wb
        dp.banks.append(wb)
        for n, base in zip(names, wb.bases, strict=True):
            dp.bank_of[n], dp.base_of[n] = index, base
    dp.params = {name: _param_rom(dp, f"p{index}", lin) for index, (name, lin) in enumerate(linears.items())}
    dp.embed = WeightStore(qm.embed.codes.numpy(), qm.embed.block_shift.numpy(), lanes=dp.lanes,
                           code_bits=qm.embed.bits, scheme=qm.embed.scheme, storage=storage)
    m.submodules.embed = dp.embed
    dp.embed_scale = _scale_rom(dp, "embed_scale", qm.embed.mult.tolist(), qm.embed.shift.tolist())
    dp.pos_store = dp.pos_scale = None
    if qm.pos is not None:
        dp.pos_store = WeightStore(qm.pos.codes.numpy(), qm.pos.block_shift.numpy(), lanes=dp.lanes,
                                   code_bits=qm.pos.bits, scheme=qm.pos.scheme, storage=storage)
        m.submodules.pos = dp.pos_store
        dp.pos_scale = _scale_rom(dp, "pos_scale", qm.pos.mult.tolist(), qm.pos.shift.tolist())


def build_buffers(dp: Datapath) -> None:
    """Activation buffers, the KV cache banks and the element vectors, with their ports.
    Adds: act_layout, mems, rd, wr, k_layer, v_layer, k_rd, k_wr, v_rd, v_wr, resid, gate_vec, raw_q, raw_k,
    resid_rd, resid_upd, rq1, rq2, rk1, rk2, memories."""
    m, cfg, lanes, wide = dp.m, dp.qm.config, dp.lanes, dp.wide
    dp.act_layout = data.ArrayLayout(signed(ACT_BITS), lanes)
    kv_layout = data.ArrayLayout(signed(KV_BITS), lanes)
    dp.mems = {
        "act": Memory(shape=dp.act_layout, depth=dp.chunks(max(dp.d, dp.qdim)), init=[]),
        "hid": Memory(shape=dp.act_layout, depth=dp.chunks(cfg.ffn), init=[]),
        "qrot": Memory(shape=dp.act_layout, depth=dp.chunks(dp.qdim), init=[]),
        "probs": Memory(shape=dp.act_layout, depth=dp.c_ctx, init=[]),
    }
    for name, mem in dp.mems.items():
        m.submodules[name] = mem
    # the KV cache in `attn_rows` banks, so that the scores of attn_rows positions (K: position p in bank
    # p % attn_rows) and the weighted sums of attn_rows channels (V transposed: channel j in bank j % attn_rows)
    # are formed at once; every layer's cache lies in the same banks, one after another (one layer runs at a
    # time, so a bank's port serves them all and block RAM holds the cache at its full width)
    dp.k_layer, dp.v_layer = kv_layer_words(dp.qm, dp.plan)
    kcache = [Memory(shape=kv_layout, depth=cfg.n_layers * dp.k_layer, init=[]) for _ in range(dp.attn_rows)]
    vcache = [Memory(shape=kv_layout, depth=cfg.n_layers * dp.v_layer, init=[]) for _ in range(dp.attn_rows)]
    for b in range(dp.attn_rows):
        m.submodules[f"kcache{b}"], m.submodules[f"vcache{b}"] = kcache[b], vcache[b]
    # element vectors the epilogue writes `wide` rows at a time (banked: rtl/banked_vector.py)
    dp.resid = BankedVector(m, "resid", signed(16), dp.d, wide, readers=2)  # the norm / embedding; the update
    dp.gate_vec = BankedVector(m, "gate", signed(8), cfg.ffn, wide)
    # q and k before rotation, apart so that q is rotated while the K projection writes k (small: LUT RAM)
    dp.raw_q = BankedVector(m, "raw_q", signed(dp.raw_bits), dp.qdim, wide, readers=2)
    dp.raw_k = BankedVector(m, "raw_k", signed(dp.raw_bits), dp.kvdim, wide, readers=2)
    dp.memories = {**dp.mems, **{f"kcache{b}": mem for b, mem in enumerate(kcache)},  # for testbenches
                   **{f"vcache{b}": mem for b, mem in enumerate(vcache)}}
    for name, vec in (("resid", dp.resid), ("gate", dp.gate_vec), ("raw_q", dp.raw_q), ("raw_k", dp.raw_k)):
        dp.memories.update({f"{name}{b}": mem for b, mem in enumerate(vec.memories)})
    dp.resid_rd, dp.resid_upd = Reader(dp.resid, 0), Reader(dp.resid, 1)
    dp.rq1, dp.rq2, dp.rk1, dp.rk2 = Reader(dp.raw_q, 0), Reader(dp.raw_q, 1), Reader(dp.raw_k, 0), Reader(dp.raw_k, 1)
    dp.rd = {name: mem.read_port() for name, mem in dp.mems.items()}
    dp.wr = {name: mem.write_port(granularity=1) for name, mem in dp.mems.items()}
    dp.k_rd = [mem.read_port() for mem in kcache]
    dp.k_wr = [mem.write_port(granularity=1) for mem in kcache]
    dp.v_rd = [mem.read_port() for mem in vcache]
    dp.v_wr = [mem.write_port(granularity=1) for mem in vcache]


def build_units(dp: Datapath) -> None:
    """Row units, serializer, rescales, the norm unit (every norm site), the softmax (every layer), one activation
    unit per epilogue lane (every layer's table), RoPE and the argmax.
    Adds: macs, serializer, rescales, emb_rescale, norm_unit, norm_names, softmax, softmax_in, acts, rope, argmax."""
    m, qm, plan, cfg = dp.m, dp.qm, dp.plan, dp.qm.config
    # the first rows multiply on DSP blocks, the rest by shift-add, each only as wide as the codes it sees
    dp.macs = [MacArray(dp.lanes, act_bits=ACT_BITS, acc_bits=dp.acc_bits, code_bits=row_code_bits(qm, plan, r),
                        multiplier="shift_add" if r >= dp.rows - plan.shift_add_rows else "dsp")
               for r in range(dp.rows)]
    for r, mac in enumerate(dp.macs):
        m.submodules[f"mac{r}"] = mac
    m.submodules.serializer = dp.serializer = RowSerializer(dp.rows, dp.acc_bits, dp.wide)
    dp.rescales = [Rescale(dp.acc_bits + 1, 32) for _ in range(dp.wide)]  # one per epilogue lane, in lockstep
    for e, unit in enumerate(dp.rescales):
        m.submodules[f"rescale{e}" if dp.wide > 1 else "rescale"] = unit
    m.submodules.embed_rescale = dp.emb_rescale = Rescale(8 + 24 + 1, 16)
    norm_sites = {}
    for i, layer in enumerate(qm.layers):
        norm_sites[f"attn{i}"] = layer.attn_norm
        if not cfg.shared_norm:  # one norm for both sublayers (Phi): its activations serve the MLP too
            norm_sites[f"mlp{i}"] = layer.mlp_norm
    norm_sites["final"] = qm.final_norm
    dp.norm_names = list(norm_sites)
    dp.norm_unit = NormUnit(dp.d, cfg.norm, [NormSite(qn.eps_q, qn.mult.tolist(), qn.shift.tolist(), qn.out_bits)
                                             for qn in norm_sites.values()], lanes=plan.vector_lanes, in_lanes=dp.wide)
    m.submodules.norm = dp.norm_unit
    # one softmax for every layer (one head runs at a time), with each layer's scale: its score buffer and
    # exponent tables exist once, so several softmax lanes cost block RAM once, not per layer
    m.submodules.softmax = dp.softmax = Softmax(dp.ctx, [layer.sm_mult for layer in qm.layers],
                                                [layer.sm_shift for layer in qm.layers], lanes=plan.softmax_lanes,
                                                in_lanes=score_beat(plan, dp.hd))
    # its input through a register: the beat's maximum and the running one were the ECP5 critical path with
    # the epilogue's mode decode in front of them
    m.submodules.softmax_skid = dp.softmax_in = SkidBuffer(dp.softmax.i.payload.shape())
    wiring.connect(m, dp.softmax_in.o, dp.softmax.i)
    dp.acts = []
    for e in range(dp.wide):
        unit = (Glu if dp.gated else TableLookup)(*(layer.act_table for layer in qm.layers))
        m.submodules[f"act{e}"] = unit
        dp.acts.append(unit)
    dp.rope = None
    if cfg.positions == "rope":
        m.submodules.rope = dp.rope = Rope(qm.rope_cos, qm.rope_sin, in_bits=dp.raw_bits)
    m.submodules.argmax = dp.argmax = Argmax(32, cfg.vocab_size, dp.wide)


def _param_rom(dp: Datapath, name: str, lin: QLinear) -> object:
    """Each row's (bias, mult, shift), in words of `wide` rows (the padding rows' constants are never used)."""
    wide = dp.wide
    layout = data.StructLayout({"bias": signed(dp.acc_bits), "mult": unsigned(15), "shift": unsigned(6)})
    rows = [{"bias": int(b), "mult": int(mu), "shift": int(s)}
            for b, mu, s in zip(lin.bias.tolist(), lin.mult.tolist(), lin.shift.tolist(), strict=True)]
    rows += [rows[-1]] * (-len(rows) % wide)
    init = [rows[k:k + wide] for k in range(0, len(rows), wide)]
    dp.m.submodules[name] = rom = Memory(shape=data.ArrayLayout(layout, wide), depth=len(init), init=init)
    return rom.read_port(domain="comb")


def _scale_rom(dp: Datapath, name: str, mults: list[int], shifts: list[int]) -> object:
    layout = data.StructLayout({"mult": unsigned(15), "shift": unsigned(6)})
    init = [{"mult": int(a), "shift": int(b)} for a, b in zip(mults, shifts, strict=True)]
    dp.m.submodules[name] = rom = Memory(shape=layout, depth=len(init), init=init)
    return rom.read_port(domain="comb")

"""The decoder's memories: the weight banks with each row's constants and the embedding tables, the
lane-wide activation buffers, the KV cache banks and the element vectors the epilogue writes.

Each is a record of its memories' ports; the later stages address them. Nothing here is sequenced.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import Module, signed, unsigned
from amaranth.lib import data
from amaranth.lib.memory import Memory, ReadPort, WritePort

from ..quant.qmodel import QLinear, QModel
from .banked_vector import BankedVector
from .datapath import ACT_BITS, Dims, Reader
from .plan import KV_BITS, kv_layer_words, weight_formats
from .weight_banks import WeightBanks
from .weight_store import WeightStore


@dataclass(frozen=True)
class Weights:
    """The weight banks (one per storage format), each projection's place in them and its per-row constants, and
    the embedding tables."""

    linears: dict[str, QLinear]  # every projection, in the order mv_tensor counts them
    acc_bits: int  # the row units' accumulators
    banks: list[WeightBanks]  # mv_format picks one
    bank_of: dict[str, int]  # a projection's bank
    base_of: dict[str, int]  # its first word there
    params: dict[str, ReadPort]  # each row's (bias, mult, shift), `wide` rows a word
    embed: WeightStore | None  # None on a chain's later boards
    embed_scale: ReadPort | None  # each token's (mult, shift)
    pos_store: WeightStore | None  # learned positions (else None)
    pos_scale: ReadPort | None


def build_weights(m: Module, qm: QModel, dims: Dims) -> Weights:
    """Weight banks (one set per storage format), each row's epilogue constants, the embedding tables."""
    storage = dims.plan.storage
    linears = dict(qm.linears())
    acc_bits = max(max(lin.acc_bits for lin in linears.values()), 32) + 1
    banks, bank_of, base_of = [], {}, {}
    for index, ((scheme, bits), names) in enumerate(weight_formats(qm).items()):
        wb = WeightBanks([(linears[n].codes.numpy(), linears[n].block_shift.numpy()) for n in names], rows=dims.rows,
                         lanes=dims.lanes, code_bits=bits, scheme=scheme, storage=storage)
        m.submodules[f"weights{index}"] = wb
        banks.append(wb)
        for n, base in zip(names, wb.bases, strict=True):
            bank_of[n], base_of[n] = index, base
    params = {name: _param_rom(m, dims.wide, acc_bits, f"p{index}", lin)
              for index, (name, lin) in enumerate(linears.items())}
    embed = embed_scale = pos_store = pos_scale = None
    if qm.has_embedding:  # a chain's later boards take the residual instead (quant/chain.py)
        embed = WeightStore(qm.embed.codes.numpy(), qm.embed.block_shift.numpy(), lanes=dims.lanes,
                            code_bits=qm.embed.bits, scheme=qm.embed.scheme, storage=storage)
        m.submodules.embed = embed
        embed_scale = _scale_rom(m, "embed_scale", qm.embed.mult.tolist(), qm.embed.shift.tolist())
    if qm.pos is not None and qm.has_embedding:
        pos_store = WeightStore(qm.pos.codes.numpy(), qm.pos.block_shift.numpy(), lanes=dims.lanes,
                                code_bits=qm.pos.bits, scheme=qm.pos.scheme, storage=storage)
        m.submodules.pos = pos_store
        pos_scale = _scale_rom(m, "pos_scale", qm.pos.mult.tolist(), qm.pos.shift.tolist())
    return Weights(linears=linears, acc_bits=acc_bits, banks=banks, bank_of=bank_of, base_of=base_of, params=params,
                   embed=embed, embed_scale=embed_scale, pos_store=pos_store, pos_scale=pos_scale)


def _param_rom(m: Module, wide: int, acc_bits: int, name: str, lin: QLinear) -> ReadPort:
    """Each row's (bias, mult, shift), in words of `wide` rows (the padding rows' constants are never used)."""
    layout = data.StructLayout({"bias": signed(acc_bits), "mult": unsigned(15), "shift": unsigned(6)})
    rows = [{"bias": int(b), "mult": int(mu), "shift": int(s)}
            for b, mu, s in zip(lin.bias.tolist(), lin.mult.tolist(), lin.shift.tolist(), strict=True)]
    rows += [rows[-1]] * (-len(rows) % wide)
    init = [rows[k:k + wide] for k in range(0, len(rows), wide)]
    m.submodules[name] = rom = Memory(shape=data.ArrayLayout(layout, wide), depth=len(init), init=init)
    return rom.read_port(domain="comb")


def _scale_rom(m: Module, name: str, mults: list[int], shifts: list[int]) -> ReadPort:
    layout = data.StructLayout({"mult": unsigned(15), "shift": unsigned(6)})
    init = [{"mult": int(a), "shift": int(b)} for a, b in zip(mults, shifts, strict=True)]
    m.submodules[name] = rom = Memory(shape=layout, depth=len(init), init=init)
    return rom.read_port(domain="comb")


@dataclass(frozen=True)
class Buffers:
    """The lane-wide buffers the engine reads its activations from, a word per cycle: act (a norm's output or the
    attention output), hid (the MLP's hidden vector), qrot (rotated q) and probs (a head's probabilities)."""

    layout: data.ArrayLayout  # a word: `lanes` activations
    rd: dict[str, ReadPort]  # by name; the engine addresses them all at once
    wr: dict[str, WritePort]
    memories: dict[str, Memory]


def build_buffers(m: Module, qm: QModel, dims: Dims) -> Buffers:
    layout = data.ArrayLayout(signed(ACT_BITS), dims.lanes)
    mems = {
        "act": Memory(shape=layout, depth=dims.chunks(max(dims.d, dims.qdim)), init=[]),
        "hid": Memory(shape=layout, depth=dims.chunks(qm.config.ffn), init=[]),
        "qrot": Memory(shape=layout, depth=dims.chunks(dims.qdim), init=[]),
        "probs": Memory(shape=layout, depth=dims.c_ctx, init=[]),
    }
    for name, mem in mems.items():
        m.submodules[name] = mem
    rd = {name: mem.read_port() for name, mem in mems.items()}
    wr = {name: mem.write_port(granularity=1) for name, mem in mems.items()}
    return Buffers(layout=layout, rd=rd, wr=wr, memories=mems)


@dataclass(frozen=True)
class KvCache:
    """The KV cache in `attn_rows` banks, so that the scores of attn_rows positions (K: position p in bank
    p % attn_rows) and the weighted sums of attn_rows channels (V transposed: channel j in bank j % attn_rows) are
    formed at once. Every layer's cache lies in the same banks, one after another (one layer runs at a time, so a
    bank's port serves them all and block RAM holds the cache at its full width)."""

    k_layer: int  # words of a layer's K in a bank
    v_layer: int  # words of a layer's V (transposed) in a bank
    k_rd: list[ReadPort]  # one per bank
    k_wr: list[WritePort]
    v_rd: list[ReadPort]
    v_wr: list[WritePort]
    memories: dict[str, Memory]


def build_kv_cache(m: Module, qm: QModel, dims: Dims) -> KvCache:
    n_layers = qm.config.n_layers
    kv_layout = data.ArrayLayout(signed(KV_BITS), dims.lanes)
    k_layer, v_layer = kv_layer_words(qm, dims.plan)
    kcache = [Memory(shape=kv_layout, depth=n_layers * k_layer, init=[]) for _ in range(dims.attn_rows)]
    vcache = [Memory(shape=kv_layout, depth=n_layers * v_layer, init=[]) for _ in range(dims.attn_rows)]
    for b in range(dims.attn_rows):
        m.submodules[f"kcache{b}"], m.submodules[f"vcache{b}"] = kcache[b], vcache[b]
    return KvCache(k_layer=k_layer, v_layer=v_layer,
                   k_rd=[mem.read_port() for mem in kcache], k_wr=[mem.write_port(granularity=1) for mem in kcache],
                   v_rd=[mem.read_port() for mem in vcache], v_wr=[mem.write_port(granularity=1) for mem in vcache],
                   memories={**{f"kcache{b}": mem for b, mem in enumerate(kcache)},
                             **{f"vcache{b}": mem for b, mem in enumerate(vcache)}})


@dataclass(frozen=True)
class Vectors:
    """Element vectors the epilogue writes `wide` rows at a time (banked: rtl/banked_vector.py), with their
    readers."""

    resid: BankedVector  # the residual
    gate: BankedVector  # the gate projection's output (gated MLPs)
    raw_q: BankedVector  # q and k before rotation, apart so that q is rotated while the K projection writes k
    raw_k: BankedVector
    resid_rd: Reader  # the residual for a norm, or for learned positions to add to
    resid_upd: Reader  # the residual a projection adds to
    rq1: Reader  # RoPE's pairs (x1, x2) of q and k; rq1 and rk1 also copy them
    rq2: Reader
    rk1: Reader
    rk2: Reader

    @property
    def memories(self) -> dict[str, Memory]:
        return {f"{name}{b}": mem for name, vec in (("resid", self.resid), ("gate", self.gate), ("raw_q", self.raw_q),
                                                     ("raw_k", self.raw_k)) for b, mem in enumerate(vec.memories)}


def build_vectors(m: Module, qm: QModel, dims: Dims) -> Vectors:
    wide = dims.wide
    resid = BankedVector(m, "resid", signed(16), dims.d, wide, readers=2)  # the norm / embedding; the update
    gate = BankedVector(m, "gate", signed(8), qm.config.ffn, wide)
    raw_q = BankedVector(m, "raw_q", signed(dims.raw_bits), dims.qdim, wide, readers=2)  # small: LUT RAM
    raw_k = BankedVector(m, "raw_k", signed(dims.raw_bits), dims.kvdim, wide, readers=2)
    return Vectors(resid=resid, gate=gate, raw_q=raw_q, raw_k=raw_k,
                   resid_rd=Reader(resid, 0), resid_upd=Reader(resid, 1), rq1=Reader(raw_q, 0),
                   rq2=Reader(raw_q, 1), rk1=Reader(raw_k, 0), rk2=Reader(raw_k, 1))

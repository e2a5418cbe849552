"""The Decoder's synchronously read memories, and where yosys puts each on a part.

The fit check (boards/parts.py) counts block RAM memory by memory from this list, rebuilt from
the QModel and the hardware plan as rtl/decoder_units.py builds them: weight ROMs, KV cache banks,
LoRA A, activation buffers, the norm, softmax, activation and RoPE tables, the host link's frame
buffer. Memories read combinationally (LoRA B, residual, parameter ROMs) become LUT RAM or logic
and are counted by synthesis, not here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..quant.qmodel import QModel
from ..quant.tables import RSQRT_BITS, RSQRT_INDEX_BITS, SILU_OUT_BITS, exp_table, rsqrt_table
from ..rtl.datapath import ACT_BITS
from ..rtl.lora_map import lora_address_map
from ..rtl.norm import X_BITS, NormSite, coef_words
from ..rtl.plan import KV_BITS, HardwarePlan, kv_bank_shapes, table_shapes, weight_bank_shapes, weight_formats
from ..rtl.rescale import MULT_BITS, SHIFT_BITS
from ..rtl.rope import TABLE_BITS as ROPE_BITS
from ..rtl.softmax import E_BITS, Z_MAX
from ..rtl.weight_banks import WeightBanks
from ..rtl.weight_store import WeightStore
from .host_link import RX_DEPTH


class BlockRams(Protocol):
    """What a part's block RAM is to the memory mapper (boards/parts.py's Part has these): the fit check asks
    the memories, so the memories know only this much of a part."""

    bram_shapes: tuple[tuple[int, int], ...]  # (depth, width) aspect ratios of one block
    bram_cost: int  # memory_libmap's cost of one block
    bram_byte: int  # write-enable granularity in bits
    lutram: bool  # whether distributed RAM may take a small RAM instead

SCORE_BITS = 32  # rtl/softmax.py's default score width, the one the Decoder uses

# yosys memory_libmap's choice (passes/memory/memory_libmap.cc, MemMapping::handle_geom): the cheapest of soft
# logic (bits x 1/16 for a ROM, x 1 for a RAM, truncated to an integer), LUT RAM and block RAM. For one aspect
# ratio (cell depth D, width W) it lays the word out in a "swizzle": a RAM written element by element starts each
# element on a byte boundary (the cell's write-enable granularity, at most W), so an int8 element takes 9 bits of
# an ECP5 block; a ROM's bits are packed. The memory's depth spans mult_a = ceil(depth / D) cells, and the cells
# are ceil(mult_a x swizzle / W), replicated per read port: the columns left over in one stripe of depth share a
# cell with the next stripe's. Cost: cells x the cell's cost, plus 0.5 per bit of read multiplexer
# ((mult_a - 1) x width per read port) and 0.5 per write-enable demultiplexer output (mult_a x the distinct
# enables, when mult_a > 1). A memory wins only by a strictly lower cost; on a tie soft logic stays.
LOGIC_COST_ROM = 1 / 16
LOGIC_COST_RAM = 1.0
FACTOR_MUX = 0.5
LUTRAM_DEPTH, LUTRAM_WIDTH, LUTRAM_COST = 16, 4, 4  # TRELLIS_DPR16X4 (share/lattice/lutrams_trellis.txt)


@dataclass(frozen=True)
class BlockMemory:
    """One synchronously read memory: block RAM, unless yosys finds a cheaper home for it.

    `width` is the live width: for a ROM the bit columns that are not constant (yosys's opt_mem drops the rest).
    """

    name: str
    kind: str  # "weights", "tables" (rsqrt, exp), "kv", "lora", "buffers"
    depth: int
    width: int
    element_bits: int = 0  # a RAM written element by element (write granularity 1 on an ArrayLayout): its bits
    read_ports: int = 1

    @property
    def bits(self) -> int:
        return self.depth * self.width

    @property
    def rom(self) -> bool:
        return self.kind in ("weights", "tables")

    def _swizzle(self, byte: int) -> int:
        """Bits of the word laid out in cells whose write enables cover `byte` bits: each element rounded up."""
        if self.rom or not self.element_bits or byte <= 1:
            return self.width
        whole, rest = divmod(self.width, self.element_bits)
        return whole * -(-self.element_bits // byte) * byte + -(-rest // byte) * byte

    def _option(self, cell_depth: int, cell_width: int, cell_cost: float, byte: int) -> tuple[float, int]:
        """(cost, cells) of one aspect ratio; `byte`: the cell's write-enable granularity (0: its whole width)."""
        mult_a = -(-self.depth // cell_depth)
        effective = cell_width if not byte or byte > cell_width else byte
        cells = self.read_ports * -(-mult_a * self._swizzle(effective) // cell_width)
        mux = self.read_ports * (mult_a - 1) * self.width
        enables = (self.width // self.element_bits if self.element_bits else 1) if not self.rom else 0
        demux = mult_a * enables if mult_a > 1 else 0
        return cells * cell_cost + FACTOR_MUX * (mux + demux), cells

    def _block_option(self, part: BlockRams) -> tuple[float, int]:
        """(cost, blocks) of the cheapest aspect ratio of the part's block RAM."""
        return min(self._option(depth, width, part.bram_cost, part.bram_byte) for depth, width in part.bram_shapes)

    def blocks(self, part: BlockRams) -> int:
        """Block RAMs this memory takes if it goes to block RAM."""
        return self._block_option(part)[1]

    def in_block_ram(self, part: BlockRams) -> bool:
        """Whether yosys puts it in block RAM: a shallow buffer or a small table is cheaper in LUTs."""
        block = self._block_option(part)[0]
        logic = int(self.bits * (LOGIC_COST_ROM if self.rom else LOGIC_COST_RAM))
        if block >= logic:
            return False
        # ROMs never go to LUT RAM (prune_rom)
        lutram = part.lutram and not self.rom and self._option(LUTRAM_DEPTH, LUTRAM_WIDTH, LUTRAM_COST, 0)[0] <= block
        return not lutram


def live_bits(values: list[int], width: int) -> int:
    """Bit columns of a `width`-bit table (two's complement) that are not the same in every word."""
    mask = (1 << width) - 1
    words = [int(v) & mask for v in values]
    ones = zeros = 0
    for word in words:
        ones |= word
        zeros |= ~word & mask
    return max(1, bin(ones & zeros).count("1"))


def weight_live_bits(qm: QModel, plan: HardwarePlan) -> dict[str, int]:
    """The live width of every weight ROM (the embedding, learned positions, each format's row banks), from the
    words rtl/weight_banks.py stores: a bank whose shift field or top code bit never changes is that much narrower
    in block RAM (one DP16KD fewer on the bundled model's int4 bank 0 at 2 x 32)."""
    def store_live_bits(store: WeightStore) -> int:
        store._MustUse__silence = True  # built for its words only, never elaborated
        return live_bits(store.stored_words, store.word_bits)

    live = {name: store_live_bits(WeightStore(table.codes.numpy(), table.block_shift.numpy(), lanes=plan.lanes,
                                        code_bits=table.bits, scheme=table.scheme, storage="rom"))
            for name, table in (("embed", qm.embed), ("pos", qm.pos)) if table is not None}
    linears = dict(qm.linears())
    for index, ((scheme, bits), names) in enumerate(weight_formats(qm).items()):
        banks = WeightBanks([(linears[n].codes.numpy(), linears[n].block_shift.numpy()) for n in names],
                            rows=plan.rows, lanes=plan.lanes, code_bits=bits, scheme=scheme, storage="rom")
        banks._MustUse__silence = True
        live.update({f"weights{index}.bank{b}": store_live_bits(bank) for b, bank in enumerate(banks.banks)})
    return live


def block_memories(qm: QModel, plan: HardwarePlan) -> list[BlockMemory]:
    """The Decoder's synchronously read memories: the plan's weight and KV banks, tables and buffers."""
    cfg = qm.config
    lanes, chunks = plan.lanes, plan.chunks
    mems: list[BlockMemory] = []
    if plan.storage == "rom":  # "logic" weights are case tables: gates, not memories
        live = weight_live_bits(qm, plan)
        mems += [BlockMemory(name, "weights", depth, live[name])
                 for name, depth, width in table_shapes(qm, plan) + weight_bank_shapes(qm, plan)]
    # tables: yosys drops bit columns that hold the same value in every word (opt_mem), so they are
    # counted at their live width, from the contents the RTL bakes in
    # one NormUnit for every norm site: rsqrt table, every site's per-channel scales, the input copy
    norms = [q for layer in qm.layers for q in (layer.attn_norm, layer.mlp_norm, layer.post_attn_norm,
                                                layer.post_mlp_norm) if q is not None] + [qm.final_norm]
    width, d = plan.vector_lanes, cfg.d_model
    words = plan.chunks_of(d, width)
    mems.append(BlockMemory("rsqrt", "tables", 1 << RSQRT_INDEX_BITS, live_bits(rsqrt_table().tolist(), RSQRT_BITS + 1)))
    coef_bits = MULT_BITS + SHIFT_BITS
    sites = [NormSite(qn.eps_q, qn.mult.tolist(), qn.shift.tolist(), qn.out_bits) for qn in norms]
    coefs = [sum(c << (coef_bits * k) for k, c in enumerate(word)) for word in coef_words(sites, d, width)]
    mems.append(BlockMemory("norm_coef", "tables", len(coefs), live_bits(coefs, width * coef_bits)))
    mems.append(BlockMemory("norm_x", "buffers", words, width * X_BITS, X_BITS))
    if cfg.qk_norm:  # the per-head q/k norm's own unit (rtl/decoder_units.py): head_dim wide, one lane
        heads = [NormSite(qn.eps_q, qn.mult.tolist(), qn.shift.tolist(), qn.out_bits)
                 for layer in qm.layers for qn in (layer.q_norm, layer.k_norm)]
        mems.append(BlockMemory("head_norm_rsqrt", "tables", 1 << RSQRT_INDEX_BITS,
                                live_bits(rsqrt_table().tolist(), RSQRT_BITS + 1)))
        head_coefs = [word[0] for word in coef_words(heads, cfg.head_dim, 1)]
        mems.append(BlockMemory("head_norm_coef", "tables", len(head_coefs), live_bits(head_coefs, coef_bits)))
        mems.append(BlockMemory("head_norm_x", "buffers", cfg.head_dim, X_BITS, X_BITS))
    exp = live_bits(exp_table().tolist(), E_BITS)
    sm_lanes = plan.softmax_lanes
    # one Softmax for every layer: its score buffer, an EXP table per lane (the registered case tables become
    # ROMs in synthesis); an activation unit per epilogue lane, holding every layer's table
    mems.append(BlockMemory("softmax_buf", "buffers", plan.chunks_of(qm.context, sm_lanes),
                            sm_lanes * max(SCORE_BITS, E_BITS), max(SCORE_BITS, E_BITS)))
    mems += [BlockMemory(f"exp{k}", "tables", Z_MAX + 1, exp) for k in range(sm_lanes)]
    act_entries = [v for layer in qm.layers for v in layer.act_table.tolist()]
    act_bits = SILU_OUT_BITS if cfg.gated else 8
    mems += [BlockMemory(f"act_table{e}", "tables", len(act_entries), live_bits(act_entries, act_bits))
             for e in range(plan.epilogue_lanes)]
    if cfg.positions == "rope":  # cos and sin per position and pair
        for name, table in (("rope_cos", qm.rope_cos), ("rope_sin", qm.rope_sin)):
            mems.append(BlockMemory(name, "tables", qm.context * (cfg.head_dim // 2),
                                    live_bits(table.flatten().tolist(), ROPE_BITS)))
    qdim = cfg.n_heads * cfg.head_dim
    mems += [BlockMemory(name, "kv", depth, width, KV_BITS) for name, depth, width in kv_bank_shapes(qm, plan)]
    for slot in lora_address_map(qm):  # A: one read port; B: one per epilogue lane (the delta prefetch)
        where = f"{slot.layer}.{slot.site}"
        mems.append(BlockMemory(f"lora_a.{where}", "lora", slot.rank * chunks(slot.in_features), lanes * 8, 8))
        mems.append(BlockMemory(f"lora_b.{where}", "lora", slot.out_features, slot.rank * 8, 8, plan.epilogue_lanes))
    for name, n in (("act", max(cfg.d_model, qdim)), ("hid", cfg.ffn), ("qrot", qdim), ("probs", qm.context)):
        mems.append(BlockMemory(name, "buffers", chunks(n), lanes * ACT_BITS, ACT_BITS))
    mems.append(BlockMemory("host_link.buffer", "buffers", 512, 8))  # boards/host_link.py: two payload banks
    # the receive FIFO (SyncFIFOBuffered: a memory of depth - 1 entries and an output register)
    mems.append(BlockMemory("host_link.rx_fifo", "buffers", RX_DEPTH - 1, 8))
    return mems

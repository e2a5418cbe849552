"""The decoder's engine: one address generator for every multiply-accumulate.

A product is started by `Product.start` (one cycle of mv_start with the mv_* registers set): it walks
`groups` groups of rows, `chunks` words each, reading the same address from every row unit's
weight bank (or KV bank, or LoRA A) and the activation word from one buffer, broadcast to all row
units. The row units finish a group together and the RowSerializer hands its sums to the epilogue.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data

from ..quant.qmodel import QModel
from .datapath import Dims, Mode, MvStart, Source
from .decoder_memories import Buffers, KvCache, Weights
from .decoder_units import Units
from .lora_bank import LoraBank
from .mac_array import MacArray
from .plan import epilogue_width, score_beat
from .weight_banks import WeightBanks


class Product:
    """The registers that describe the running product, set together by `start` with a one-cycle mv_start.

    Created before the engine and the epilogue, which read them: the schedule that sets them is built last.
    """

    def __init__(self, qm: QModel, dims: Dims, weights: Weights, kv: KvCache) -> None:
        self._qm, self._dims, self._weights = qm, dims, weights
        cfg, ctx, d, qdim = qm.config, dims.ctx, dims.d, dims.qdim
        self.mv_start = Signal()  # one-cycle pulse, set by the schedule with the mv_* registers below
        self.mv_tensor = Signal(range(max(2, len(weights.linears))))
        self.mv_format = Signal(range(max(2, len(weights.banks))))
        self.mv_group = Signal(range(dims.rows + 1))  # rows per group: all (a matrix), attn_rows, or one (LoRA A)
        self.mv_mode = Signal(Mode)
        self.mv_src = Signal(Source)
        self.mv_attn = Signal()  # codes from the K / V cache instead of a weight store
        self.mv_wide = Signal()  # the epilogue takes `wide` rows per beat (else one)
        self.lora_on = Signal()  # this projection adds its LoRA term
        self.mv_rows = Signal(range(max(ctx, cfg.ffn, cfg.vocab_size, d, qdim) + 1))
        self.mv_chunks = Signal(range(dims.chunks(max(ctx, cfg.ffn, d, qdim)) + 1))
        self.mv_groups = Signal.like(self.mv_rows)
        max_words = max([cfg.n_layers * kv.k_layer, cfg.n_layers * kv.v_layer] + [wb.words for wb in weights.banks])
        self.mv_row_stride = Signal(range(max_words + 1))
        self.mv_code_base = Signal(range(max_words + 1))
        self.mv_act_base = Signal(range(dims.chunks(max(d, qdim, cfg.ffn, ctx)) + 1))
        # the epilogue's rows per full beat (a group of attention rows may be narrower than `wide`) and rows not yet
        # out: registers set here, so that no subtraction runs ahead of the destinations (it was the ECP5 critical
        # path)
        self.step = Signal(range(dims.wide + 1), init=1)
        self.rows_left = Signal.like(self.mv_rows)

    def start(self, name_or_mode: str | Mode, *, rows: object, chunks: int, mode: Mode, src: Source,
              code_base: object = 0, stride: int | None = None, act_base: object = 0) -> MvStart:
        """The statements that start a product: a weight matrix by name (`rows` rows per group from the banks), or
        attention (Mode.SCORES, Mode.PV: attention rows per group from the KV banks) or LoRA A (one row per
        group)."""
        dims, weights = self._dims, self._weights
        matrix = isinstance(name_or_mode, str)
        group = dims.rows if matrix else dims.attn_rows if name_or_mode in (Mode.SCORES, Mode.PV) else 1
        groups = -(-rows // group) if isinstance(rows, int) else (rows + group - 1) // group
        stmts = [self.mv_start.eq(1), self.mv_mode.eq(mode), self.mv_src.eq(src), self.mv_rows.eq(rows),
                 self.mv_chunks.eq(chunks), self.mv_groups.eq(groups), self.mv_group.eq(group),
                 self.mv_code_base.eq(weights.base_of[name_or_mode] if matrix else code_base),
                 self.mv_row_stride.eq(chunks if stride is None else stride),
                 self.mv_act_base.eq(act_base), self.mv_attn.eq(name_or_mode in (Mode.SCORES, Mode.PV)),
                 self.lora_on.eq(0)]
        site = name_or_mode.rsplit(".", 1)[-1] if matrix else None
        wide_scores = name_or_mode == Mode.SCORES and score_beat(dims.plan, dims.hd) > 1
        wide = wide_scores or (matrix and epilogue_width(self._qm, dims.plan, site) > 1)
        stmts += [self.mv_wide.eq(wide), self.step.eq(min(group, dims.wide) if wide else 1), self.rows_left.eq(rows)]
        if matrix:
            stmts += [self.mv_tensor.eq(list(weights.linears).index(name_or_mode)),
                      self.mv_format.eq(weights.bank_of[name_or_mode])]
        return MvStart(stmts, name_or_mode, chunks, src)


class Engine:
    """The address generator's pipeline state. The epilogue reads whether it is `drained`; the rest is its own."""

    def __init__(self) -> None:
        self.issuing, self.pending = Signal(), Signal()  # addresses left to issue; a word read, not yet staged
        self.first_q, self.last_q = Signal(), Signal()  # that word is its row's first, last chunk
        self.advance = Signal()  # the reads move on: the row units take the staged word, or none is staged
        self.staged = Signal()  # a word waits in the row units' input registers (_row_unit_inputs)

    @property
    def drained(self) -> Value:
        """No word of the product is left to issue, read or take."""
        return ~self.issuing & ~self.pending & ~self.staged


def build_engine(m: Module, dims: Dims, p: Product, banks: list[WeightBanks], buffers: Buffers, kv: KvCache,
                 units: Units, lora: LoraBank) -> Engine:
    """The address generator, the row units' inputs and the serializer's input, for the product `p` describes."""
    m.d.sync += p.mv_start.eq(0)
    m.d.comb += units.serializer.wide.eq(p.mv_wide)
    engine = Engine()
    m.d.comb += engine.advance.eq(~engine.staged | units.macs[0].i.ready)
    _address_generator(m, p, engine, banks, buffers, kv, lora)
    _row_unit_inputs(m, dims, p, engine, banks, buffers, kv, units.macs, lora)
    _serializer_input(m, p, units)
    return engine


def _address_generator(m: Module, p: Product, engine: Engine, banks: list[WeightBanks], buffers: Buffers,
                       kv: KvCache, lora: LoraBank) -> None:
    """Row group by row group, chunk by chunk; `advance` whenever the row units take a word."""
    row, chunk = Signal.like(p.mv_rows), Signal.like(p.mv_chunks)
    row_base = Signal.like(p.mv_code_base)
    advance = engine.advance
    # the read addresses are registers (row_base + chunk and mv_act_base + chunk, kept up to date as they move),
    # with one counter of its own per weight bank, KV bank and LoRA A: the banks fill the die, and one register
    # driving every block's address pins was the routed 4 x 32 build's critical path (17 ns of routing,
    # 2026-12-07). Each copy counts for itself (its own incrementer), so synthesis cannot merge them
    act_addr = Signal.like(p.mv_act_base)
    copies: list[Signal] = []

    def address_copy(name: str) -> Signal:
        copy = Signal.like(p.mv_code_base, name=name)
        copies.append(copy)
        return copy

    for f, wb in enumerate(banks):
        m.d.comb += [wb.addr[b].eq(address_copy(f"code_addr_f{f}_b{b}")) for b in range(wb.rows)]
        m.d.comb += wb.en.eq(advance)
    for port in buffers.rd.values():
        m.d.comb += [port.addr.eq(act_addr), port.en.eq(advance)]
    for b, port in enumerate(kv.k_rd):
        m.d.comb += [port.addr.eq(address_copy(f"code_addr_k{b}")), port.en.eq(advance)]
    for b, port in enumerate(kv.v_rd):
        m.d.comb += [port.addr.eq(address_copy(f"code_addr_v{b}")), port.en.eq(advance)]
    m.d.comb += [lora.a_addr.eq(address_copy("code_addr_lora")), lora.a_en.eq(advance)]
    with m.If(p.mv_start):
        m.d.sync += [engine.issuing.eq(1), row.eq(0), chunk.eq(0), row_base.eq(p.mv_code_base),
                     act_addr.eq(p.mv_act_base), *(copy.eq(p.mv_code_base) for copy in copies)]
    with m.Elif(advance):
        m.d.sync += engine.pending.eq(engine.issuing)
        with m.If(engine.issuing):
            m.d.sync += [engine.first_q.eq(chunk == 0), engine.last_q.eq(chunk == p.mv_chunks - 1)]
            with m.If(chunk == p.mv_chunks - 1):
                next_base = row_base + p.mv_row_stride
                m.d.sync += [chunk.eq(0), row.eq(row + 1), row_base.eq(next_base), act_addr.eq(p.mv_act_base),
                             *(copy.eq(next_base) for copy in copies)]
                with m.If(row == p.mv_groups - 1):
                    m.d.sync += engine.issuing.eq(0)
            with m.Else():
                m.d.sync += [chunk.eq(chunk + 1), act_addr.eq(act_addr + 1), *(copy.eq(copy + 1) for copy in copies)]


def _row_unit_inputs(m: Module, dims: Dims, p: Product, engine: Engine, banks: list[WeightBanks], buffers: Buffers,
                     kv: KvCache, macs: list[MacArray], lora: LoraBank) -> None:
    """Codes: the selected weight bank's words, this layer's K / V cache word (row unit b reads KV bank b) or the
    running LoRA slot's A; activations: the selected buffer's word, broadcast to every row unit."""
    lanes = dims.lanes
    codes_sel = Signal(data.ArrayLayout(data.ArrayLayout(signed(8), lanes), dims.rows))  # one word per row unit
    shift_sel = Signal(data.ArrayLayout(unsigned(5), dims.rows))
    with m.If(p.mv_attn):
        for b in range(dims.attn_rows):
            with m.If(p.mv_mode == Mode.SCORES):
                m.d.comb += [codes_sel[b][j].eq(kv.k_rd[b].data[j]) for j in range(lanes)]
            with m.Else():
                m.d.comb += [codes_sel[b][j].eq(kv.v_rd[b].data[j]) for j in range(lanes)]
    with m.Elif(p.mv_mode == Mode.LORA_A):  # int8 codes, no block shift
        m.d.comb += [codes_sel[0][j].eq(lora.a_data[j]) for j in range(lanes)]
    with m.Else(), m.Switch(p.mv_format):
        for index, wb in enumerate(banks):
            with m.Case(index):
                m.d.comb += [codes_sel.eq(wb.codes), shift_sel.eq(wb.shift)]
    acts_sel = Signal(buffers.layout)
    with m.Switch(p.mv_src):
        for src, name in ((Source.ACT, "act"), (Source.HID, "hid"), (Source.Q, "qrot"), (Source.PROBS, "probs")):
            with m.Case(src):
                m.d.comb += acts_sel.eq(buffers.rd[name].data)
    # one register stage between the memories' multiplexers and the row units (ENGINE_INPUT_STAGE): the banks
    # fill the die, so a weight bank's depth multiplexer and the format / KV / LoRA choice after it are a cycle of
    # routing of their own (the routed 2 x 32 build's critical path, 2026-12-07: 20 ns of it)
    # data registers without reset (`staged` says whether they hold a word): a reset reaching every one of them
    # across the die was the routed 4 x 32 build's critical path (22.2 ns, 2026-12-07)
    codes_q = Signal.like(codes_sel, reset_less=True)
    shift_q = Signal.like(shift_sel, reset_less=True)
    acts_q = Signal.like(acts_sel, reset_less=True)
    first_s, last_s = Signal(), Signal()
    with m.If(engine.advance):
        m.d.sync += [engine.staged.eq(engine.pending), codes_q.eq(codes_sel), shift_q.eq(shift_sel),
                     acts_q.eq(acts_sel),
                     first_s.eq(engine.first_q), last_s.eq(engine.last_q)]
    for r, mac in enumerate(macs):
        m.d.comb += [mac.i.valid.eq(engine.staged), mac.i.payload.codes.eq(codes_q[r]),
                     mac.i.payload.shift.eq(shift_q[r]), mac.i.payload.acts.eq(acts_q),
                     mac.i.payload.first.eq(first_s), mac.i.payload.last.eq(last_s)]


def _serializer_input(m: Module, p: Product, units: Units) -> None:
    """The row units finish together; the serializer takes their sums, as many as the group has rows left."""
    serializer = units.serializer
    rows_loaded = Signal.like(p.mv_rows)
    rows_left = Signal.like(p.mv_rows)
    m.d.comb += rows_left.eq(p.mv_rows - rows_loaded)
    m.d.comb += [serializer.i.valid.eq(units.macs[0].o.valid),
                 serializer.i.payload.count.eq(Mux(rows_left >= p.mv_group, p.mv_group, rows_left))]
    for r, mac in enumerate(units.macs):
        m.d.comb += [serializer.i.payload.values[r].eq(mac.o.payload), mac.o.ready.eq(serializer.i.ready)]
    with m.If(p.mv_start):
        m.d.sync += rows_loaded.eq(0)
    with m.Elif(serializer.i.valid & serializer.i.ready):
        m.d.sync += rows_loaded.eq(rows_loaded + serializer.i.payload.count)

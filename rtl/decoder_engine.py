"""The decoder's engine: one address generator for every multiply-accumulate.

A product is started by `start_mv` (one cycle of mv_start with the mv_* registers set): it walks
`groups` groups of rows, `chunks` words each, reading the same address from every row unit's
weight bank (or KV bank, or LoRA A) and the activation word from one buffer, broadcast to all row
units. The row units finish a group together and the RowSerializer hands its sums to the epilogue.
"""

from __future__ import annotations

from amaranth.hdl import Mux, Signal, signed, unsigned
from amaranth.lib import data

from .datapath import Datapath, Mode, MvStart, Source
from .plan import epilogue_width, score_beat


def build_engine(dp: Datapath) -> None:
    """The mv_* registers, the address generator and the row units' inputs.
    Adds: mv_start, mv_tensor, mv_format, mv_group, mv_mode, mv_src, mv_attn, mv_wide, mv_rows, mv_chunks,
    mv_groups, mv_row_stride, mv_code_base, mv_act_base, issuing, pending, advance, staged, lora_on."""
    m, cfg, ctx, d, qdim = dp.m, dp.qm.config, dp.ctx, dp.d, dp.qdim
    dp.mv_start = Signal()  # one-cycle pulse, set by the schedule with the mv_* registers below
    m.d.sync += dp.mv_start.eq(0)
    dp.mv_tensor = Signal(range(max(2, len(dp.linears))))
    dp.mv_format = Signal(range(max(2, len(dp.banks))))
    dp.mv_group = Signal(range(dp.rows + 1))  # rows per group: all (a weight matrix), attn_rows, or one (LoRA A)
    dp.mv_mode = Signal(Mode)
    dp.mv_src = Signal(Source)
    dp.mv_attn = Signal()  # codes from the K / V cache instead of a weight store
    dp.mv_wide = Signal()  # the epilogue takes `wide` rows per beat (else one)
    dp.lora_on = Signal()  # this projection adds its LoRA term
    m.d.comb += dp.serializer.wide.eq(dp.mv_wide)
    dp.mv_rows = Signal(range(max(ctx, cfg.ffn, cfg.vocab_size, d, qdim) + 1))
    dp.mv_chunks = Signal(range(dp.chunks(max(ctx, cfg.ffn, d, qdim)) + 1))
    dp.mv_groups = Signal.like(dp.mv_rows)
    max_words = max([cfg.n_layers * dp.k_layer, cfg.n_layers * dp.v_layer] + [wb.words for wb in dp.banks])
    dp.mv_row_stride = Signal(range(max_words + 1))
    dp.mv_code_base = Signal(range(max_words + 1))
    dp.mv_act_base = Signal(range(dp.chunks(max(d, qdim, cfg.ffn, ctx)) + 1))
    _address_generator(dp)
    _row_unit_inputs(dp)
    _serializer_input(dp)


def _address_generator(dp: Datapath) -> None:
    """Row group by row group, chunk by chunk; `advance` whenever the row units take a word."""
    m = dp.m
    row, chunk = Signal.like(dp.mv_rows), Signal.like(dp.mv_chunks)
    row_base = Signal.like(dp.mv_code_base)
    dp.issuing, dp.pending = Signal(), Signal()
    dp.first_q, dp.last_q = Signal(), Signal()
    advance = Signal()
    dp.advance = advance
    dp.staged = Signal()  # a word waits in the row units' input registers (_row_unit_inputs)
    m.d.comb += advance.eq(~dp.staged | dp.macs[0].i.ready)
    # the read addresses are registers (row_base + chunk and mv_act_base + chunk, kept up to date as they move),
    # with one counter of its own per weight bank, KV bank and LoRA A: the banks fill the die, and one register
    # driving every block's address pins was the routed 4 x 32 build's critical path (17 ns of routing,
    # 2026-12-07). Each copy counts for itself (its own incrementer), so synthesis cannot merge them
    act_addr = Signal.like(dp.mv_act_base)
    copies: list[Signal] = []

    def address_copy(name: str) -> Signal:
        copy = Signal.like(dp.mv_code_base, name=name)
        copies.append(copy)
        return copy

    for f, wb in enumerate(dp.banks):
        m.d.comb += [wb.addr[b].eq(address_copy(f"code_addr_f{f}_b{b}")) for b in range(wb.rows)]
        m.d.comb += wb.en.eq(advance)
    for port in dp.rd.values():
        m.d.comb += [port.addr.eq(act_addr), port.en.eq(advance)]
    for b, port in enumerate(dp.k_rd):
        m.d.comb += [port.addr.eq(address_copy(f"code_addr_k{b}")), port.en.eq(advance)]
    for b, port in enumerate(dp.v_rd):
        m.d.comb += [port.addr.eq(address_copy(f"code_addr_v{b}")), port.en.eq(advance)]
    m.d.comb += [dp.lora.a_addr.eq(address_copy("code_addr_lora")), dp.lora.a_en.eq(advance)]
    with m.If(dp.mv_start):
        m.d.sync += [dp.issuing.eq(1), row.eq(0), chunk.eq(0), row_base.eq(dp.mv_code_base),
                     act_addr.eq(dp.mv_act_base), *(copy.eq(dp.mv_code_base) for copy in copies)]
    with m.Elif(advance):
        m.d.sync += dp.pending.eq(dp.issuing)
        with m.If(dp.issuing):
            m.d.sync += [dp.first_q.eq(chunk == 0), dp.last_q.eq(chunk == dp.mv_chunks - 1)]
            with m.If(chunk == dp.mv_chunks - 1):
                next_base = row_base + dp.mv_row_stride
                m.d.sync += [chunk.eq(0), row.eq(row + 1), row_base.eq(next_base), act_addr.eq(dp.mv_act_base),
                             *(copy.eq(next_base) for copy in copies)]
                with m.If(row == dp.mv_groups - 1):
                    m.d.sync += dp.issuing.eq(0)
            with m.Else():
                m.d.sync += [chunk.eq(chunk + 1), act_addr.eq(act_addr + 1), *(copy.eq(copy + 1) for copy in copies)]


def _row_unit_inputs(dp: Datapath) -> None:
    """Codes: the selected weight bank's words, this layer's K / V cache word (row unit b reads KV bank b) or the
    running LoRA slot's A; activations: the selected buffer's word, broadcast to every row unit."""
    m, lanes = dp.m, dp.lanes
    codes_sel = Signal(data.ArrayLayout(data.ArrayLayout(signed(8), lanes), dp.rows))  # one word per row unit
    shift_sel = Signal(data.ArrayLayout(unsigned(5), dp.rows))
    with m.If(dp.mv_attn):
        for b in range(dp.attn_rows):
            with m.If(dp.mv_mode == Mode.SCORES):
                m.d.comb += [codes_sel[b][j].eq(dp.k_rd[b].data[j]) for j in range(lanes)]
            with m.Else():
                m.d.comb += [codes_sel[b][j].eq(dp.v_rd[b].data[j]) for j in range(lanes)]
    with m.Elif(dp.mv_mode == Mode.LORA_A):  # int8 codes, no block shift
        m.d.comb += [codes_sel[0][j].eq(dp.lora.a_data[j]) for j in range(lanes)]
    with m.Else(), m.Switch(dp.mv_format):
        for index, wb in enumerate(dp.banks):
            with m.Case(index):
                m.d.comb += [codes_sel.eq(wb.codes), shift_sel.eq(wb.shift)]
    acts_sel = Signal(dp.act_layout)
    with m.Switch(dp.mv_src):
        for src, name in ((Source.ACT, "act"), (Source.HID, "hid"), (Source.Q, "qrot"), (Source.PROBS, "probs")):
            with m.Case(src):
                m.d.comb += acts_sel.eq(dp.rd[name].data)
    # one register stage between the memories' multiplexers and the row units (ENGINE_INPUT_STAGE): the banks
    # fill the die, so a weight bank's depth multiplexer and the format / KV / LoRA choice after it are a cycle of
    # routing of their own (the routed 2 x 32 build's critical path, 2026-12-07: 20 ns of it)
    # data registers without reset (`staged` says whether they hold a word): a reset reaching every one of them
    # across the die was the routed 4 x 32 build's critical path (22.2 ns, 2026-12-07)
    codes_q = Signal.like(codes_sel, reset_less=True)
    shift_q = Signal.like(shift_sel, reset_less=True)
    acts_q = Signal.like(acts_sel, reset_less=True)
    first_s, last_s = Signal(), Signal()
    with m.If(dp.advance):
        m.d.sync += [dp.staged.eq(dp.pending), codes_q.eq(codes_sel), shift_q.eq(shift_sel), acts_q.eq(acts_sel),
                     first_s.eq(dp.first_q), last_s.eq(dp.last_q)]
    for r, mac in enumerate(dp.macs):
        m.d.comb += [mac.i.valid.eq(dp.staged), mac.i.payload.codes.eq(codes_q[r]),
                     mac.i.payload.shift.eq(shift_q[r]), mac.i.payload.acts.eq(acts_q),
                     mac.i.payload.first.eq(first_s), mac.i.payload.last.eq(last_s)]


def _serializer_input(dp: Datapath) -> None:
    """The row units finish together; the serializer takes their sums, as many as the group has rows left."""
    m = dp.m
    rows_loaded = Signal.like(dp.mv_rows)
    rows_left = Signal.like(dp.mv_rows)
    m.d.comb += rows_left.eq(dp.mv_rows - rows_loaded)
    m.d.comb += [dp.serializer.i.valid.eq(dp.macs[0].o.valid),
                 dp.serializer.i.payload.count.eq(Mux(rows_left >= dp.mv_group, dp.mv_group, rows_left))]
    for r, mac in enumerate(dp.macs):
        m.d.comb += [dp.serializer.i.payload.values[r].eq(mac.o.payload), mac.o.ready.eq(dp.serializer.i.ready)]
    with m.If(dp.mv_start):
        m.d.sync += rows_loaded.eq(0)
    with m.Elif(dp.serializer.i.valid & dp.serializer.i.ready):
        m.d.sync += rows_loaded.eq(rows_loaded + dp.serializer.i.payload.count)


def start_mv(dp: Datapath, name_or_mode: str | Mode, *, rows: object, chunks: int, mode: Mode, src: Source,
             code_base: object = 0, stride: int | None = None, act_base: object = 0) -> MvStart:
    """The statements that start a product: a weight matrix by name (`rows` rows per group from the banks), or
    attention (Mode.SCORES, Mode.PV: attention rows per group from the KV banks) or LoRA A (one row per group)."""
    matrix = isinstance(name_or_mode, str)
    group = dp.rows if matrix else dp.attn_rows if name_or_mode in (Mode.SCORES, Mode.PV) else 1
    groups = -(-rows // group) if isinstance(rows, int) else (rows + group - 1) // group
    stmts = [dp.mv_start.eq(1), dp.mv_mode.eq(mode), dp.mv_src.eq(src), dp.mv_rows.eq(rows),
             dp.mv_chunks.eq(chunks), dp.mv_groups.eq(groups), dp.mv_group.eq(group),
             dp.mv_code_base.eq(dp.base_of[name_or_mode] if matrix else code_base),
             dp.mv_row_stride.eq(chunks if stride is None else stride),
             dp.mv_act_base.eq(act_base), dp.mv_attn.eq(name_or_mode in (Mode.SCORES, Mode.PV)), dp.lora_on.eq(0)]
    site = name_or_mode.rsplit(".", 1)[-1] if matrix else None
    wide_scores = name_or_mode == Mode.SCORES and score_beat(dp.plan, dp.hd) > 1
    wide = wide_scores or (matrix and epilogue_width(dp.qm, dp.plan, site) > 1)
    stmts += [dp.mv_wide.eq(wide), dp.step.eq(min(group, dp.wide) if wide else 1), dp.rows_left.eq(rows)]
    if matrix:
        stmts += [dp.mv_tensor.eq(list(dp.linears).index(name_or_mode)), dp.mv_format.eq(dp.bank_of[name_or_mode])]
    return MvStart(stmts, name_or_mode, chunks, src)

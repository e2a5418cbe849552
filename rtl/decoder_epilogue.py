"""The decoder's epilogue: each output row's bias, rescale and LoRA term, then its destination.

The serializer hands rows on in beats: `wide` consecutive rows (mv_wide) or one. Each epilogue
lane has its own bias, rescale and LoRA term, and the destinations take runs of consecutive
elements (BankedVector, lane-group writes), so rows stay in order. The rescaled row is clamped
to int32 before the LoRA term is added (the reference keeps it unclamped): the result differs
only where a projection output alone already exceeds int32.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import Const, Module, Mux, Signal, Value, signed
from amaranth.lib import data

from ..quant.blocks import SCORE_BITS
from ..quant.qmodel import QModel
from .datapath import Dims, Mode, Reader
from .decoder_control import Control
from .decoder_engine import Engine, Product
from .decoder_memories import Buffers, KvCache, Vectors, Weights
from .decoder_side import NormLink
from .decoder_units import Units
from .lora_bank import LoraBank
from .rescale import saturate
from .skid_buffer import SkidBuffer
from .word_runs import beat_bank_write, run_into, write_run


@dataclass(frozen=True)
class Epilogue:
    """What the schedule waits for: the running product has ended (its last row is at its destination)."""

    mv_done: Signal


class _Rows:
    """The epilogue's own counters and handshake: rows into and out of the rescales, the beat leaving the skid
    buffer, whether its destination takes it, and LoRA A's result."""

    def __init__(self, dims: Dims, p: Product, rank: int) -> None:
        wide = dims.wide
        self.row_in = Signal.like(p.mv_rows)  # rows that entered the rescale
        self.row_out = Signal.like(p.mv_rows)  # rows that left it
        self.beat = Signal(range(wide + 1))  # rows in the beat leaving the rescale: every beat is full but the last
        self.last_beat = Signal()  # the beat leaving the rescale ends the product
        self.t16 = Signal(data.ArrayLayout(signed(16), max(1, rank)))  # rescale(A a) of the running slot
        self.dest_ready = Signal()  # the destination of the current mode takes the beat leaving the skid buffer
        self.took = Signal()  # it takes it this cycle


@dataclass(frozen=True)
class _Beat:
    """The beat leaving the skid buffer: each lane's row saturated to int8, to int16, and clamped to int32."""

    valid: Value
    y8: list[Value]
    y16: list[Value]
    y32: list[Value]


def build_epilogue(m: Module, qm: QModel, dims: Dims, p: Product, engine: Engine, weights: Weights,
                   buffers: Buffers, kv: KvCache, vectors: Vectors, units: Units, control: Control, lora: LoraBank,
                   link: NormLink) -> Epilogue:
    """The serializer's rows through bias, rescale and LoRA term into the destination of the product's mode."""
    wide = dims.wide
    r = _Rows(dims, p, lora.rank)
    m.d.comb += [r.beat.eq(Mux(p.rows_left < p.step, p.rows_left, p.step)), r.last_beat.eq(p.rows_left <= p.step)]
    _rescale_inputs(m, qm, dims, p, weights, units, control, lora, r)
    delta = _lora_delta(m, dims, p, units, lora, r)
    # the rows, LoRA term added and saturated, pass a skid buffer on the way to their destination: the
    # destinations' ready stops there instead of running back through the rescales, the serializer and the
    # row units into every register's enable, and the saturations stop there instead of running on into them
    skid = m.submodules.epilogue_skid = SkidBuffer(data.StructLayout({
        "y8": data.ArrayLayout(signed(8), wide), "y16": data.ArrayLayout(signed(16), wide),
        "y32": data.ArrayLayout(signed(32), wide)}))
    m.d.comb += skid.i.valid.eq(units.rescales[0].o.valid)
    for e in range(wide):  # each lane adds its row's LoRA term
        y_sum = Signal(signed(68), name=f"y_sum{e}")
        m.d.comb += [y_sum.eq(units.rescales[e].o.payload + delta[e]), skid.i.payload.y8[e].eq(saturate(y_sum, 8)),
                     skid.i.payload.y16[e].eq(saturate(y_sum, 16)),
                     skid.i.payload.y32[e].eq(units.rescales[e].o.payload), units.rescales[e].o.ready.eq(skid.i.ready)]
    y = _Beat(valid=skid.o.valid, y8=[skid.o.payload.y8[e] for e in range(wide)],
              y16=[skid.o.payload.y16[e] for e in range(wide)], y32=[skid.o.payload.y32[e] for e in range(wide)])
    m.d.comb += skid.o.ready.eq(r.dest_ready)
    _destinations(m, dims, p, r, y, kv, vectors, units, control, link)
    _attention_and_head_destinations(m, dims, p, r, y, buffers, units, control, lora)
    hid_left = _hidden_writer(m, qm, dims, p, buffers, units)
    mv_done = Signal()
    m.d.comb += mv_done.eq(engine.drained & ~p.mv_start & (p.rows_left == 0) &
                           Mux(p.mv_mode == Mode.UP, hid_left == 0, 1))
    return Epilogue(mv_done=mv_done)


def _rescale_inputs(m: Module, qm: QModel, dims: Dims, p: Product, weights: Weights, units: Units, control: Control,
                    lora: LoraBank, r: _Rows) -> None:
    """Each lane's bias, multiplier and shift: the tensor's per-row constants (a wide beat reads one word of
    `wide` rows), identity for scores, the layer's attention scale for PV, the slot's A scale for LoRA A."""
    wide = dims.wide
    bias = [Signal(signed(weights.acc_bits), name=f"bias{e}") for e in range(wide)]
    mult = [Signal(15, name=f"mult{e}") for e in range(wide)]
    shift = [Signal(6, name=f"shift{e}") for e in range(wide)]
    att_mult, att_shift = Signal(15), Signal(6)
    with m.Switch(control.layer_sel):
        for i, layer in enumerate(qm.layers):
            with m.Case(i):
                m.d.comb += [att_mult.eq(layer.att_mult), att_shift.eq(layer.att_shift)]
    alibi = _alibi_terms(m, qm, dims, p, units, control)
    with m.If(p.mv_mode == Mode.SCORES):
        if qm.cap_table is None:
            m.d.comb += [*(mu.eq(1 << 14) for mu in mult), *(sh.eq(14) for sh in shift)]  # identity: scores pass
        else:  # Gemma 2's soft-cap: into units of c / K, the layer's cap multiplier (numerics §6)
            with m.Switch(control.layer_sel):
                for i, layer in enumerate(qm.layers):
                    with m.Case(i):
                        m.d.comb += [*(mu.eq(layer.cap_mult) for mu in mult), *(sh.eq(layer.cap_shift) for sh in shift)]
        m.d.comb += [b.eq(term) for b, term in zip(bias, alibi, strict=False)]  # ALiBi: each key's bias
    with m.Elif(p.mv_mode == Mode.PV):
        m.d.comb += [mult[0].eq(att_mult), shift[0].eq(att_shift)]
    with m.Elif(p.mv_mode == Mode.LORA_A):
        m.d.comb += [mult[0].eq(lora.a_mult), shift[0].eq(lora.a_shift)]
    with m.Else(), m.Switch(p.mv_tensor):
        wide_bits = (wide - 1).bit_length()
        for index, name in enumerate(weights.linears):
            with m.Case(index):
                port = weights.params[name]
                m.d.comb += port.addr.eq(r.row_in >> wide_bits)
                for e in range(wide):
                    entry = port.data[e] if e else port.data[Mux(p.mv_wide, 0, r.row_in[:wide_bits])]
                    m.d.comb += [bias[e].eq(entry.bias), mult[e].eq(entry.mult), shift[e].eq(entry.shift)]
    serializer = units.serializer
    for e, unit in enumerate(units.rescales):
        m.d.comb += [unit.i.valid.eq(serializer.o.valid),
                     unit.i.payload.value.eq(serializer.o.payload.values[e] + bias[e]),
                     unit.i.payload.mult.eq(mult[e]), unit.i.payload.shift.eq(shift[e])]
    m.d.comb += serializer.o.ready.eq(units.rescales[0].i.ready)
    with m.If(serializer.o.valid & units.rescales[0].i.ready):
        m.d.sync += r.row_in.eq(r.row_in + serializer.o.payload.count)
    with m.If(p.mv_start):
        m.d.sync += [r.row_in.eq(0), r.row_out.eq(0)]


def _alibi_terms(m: Module, qm: QModel, dims: Dims, p: Product, units: Units, control: Control) -> list[Value]:
    """ALiBi (numerics §6): lane e of a beat of scores adds alibi[h] * t for its key t (the beat's first row plus e:
    the keys come in position order), the running head's constant chosen by the layer and head registers. The first
    row's term is a running sum, moved by alibi[h] times the beat's rows as each beat enters the rescales, so a lane
    costs an adder and a constant multiple of alibi[h], no multiplier; the cycles are unchanged. Empty without
    ALiBi (no lane adds anything)."""
    if all(layer.alibi is None for layer in qm.layers):
        return []
    slope, first = Signal(signed(SCORE_BITS)), Signal(signed(SCORE_BITS))  # alibi[h]; alibi[h] * the beat's first key
    with m.Switch(control.layer_sel):
        for i, layer in enumerate(qm.layers):
            with m.Case(i), m.Switch(control.head):
                for h, value in enumerate(layer.alibi.tolist()):
                    with m.Case(h):
                        m.d.comb += slope.eq(value)
    serializer = units.serializer
    with m.If(p.mv_start):
        m.d.sync += first.eq(0)
    with m.Elif(serializer.o.valid & units.rescales[0].i.ready):
        m.d.sync += first.eq(first + slope * serializer.o.payload.count)
    return [first + slope * e for e in range(dims.wide)]


def _lora_delta(m: Module, dims: Dims, p: Product, units: Units, lora: LoraBank, r: _Rows) -> list[Signal]:
    """delta = round_shift((B t16)[row] * b_mult, b_shift) per lane, added before the output saturation.

    Rows leave in order, so the deltas are computed ahead of their rows by a pipeline that stalls as a whole
    when its last stage is not consumed: B's rows (the read port's register), the running slot's rows (a
    register after the slot multiplexer), the rank products and their sum, the product by b_mult, then the
    rounding shift. In one, two and four stages they limited Fmax to 16, 40 and 46 MHz on ECP5. Its 5 stages
    fill within 6 cycles of mv_start, before any row leaves the rescales (the row units and the rescales alone
    take 11). Lane e's delta is that of row e of the beat."""
    wide, rank = dims.wide, lora.rank
    delta = [Signal(signed(66), name=f"delta{e}") for e in range(wide)]
    if not lora.slots:
        return delta
    prefetch_row = Signal.like(r.row_out)  # the first row of the next beat to read from B
    low_bits = 8 + 16 + rank.bit_length() + 1
    half = Signal(signed(66))
    m.d.comb += half.eq(Mux(lora.b_shift == 0, 0, Const(1, 1) << (lora.b_shift - 1)[:6]))
    stages: list[list] = [[], [], [], [], []]  # B's rows are stage 0, in the read port
    for e in range(wide):
        b_row = Signal.like(lora.b_data[e], name=f"b_row{e}")
        low = Signal(signed(low_bits), name=f"low{e}")
        scaled = Signal(signed(low_bits + 16), name=f"scaled{e}")
        delta_reg = Signal(signed(66), name=f"delta_reg{e}")
        stages[1].append(b_row.eq(lora.b_data[e]))
        stages[2].append(low.eq(sum(b_row[j] * r.t16[j] for j in range(rank))))
        stages[3].append(scaled.eq(low * lora.b_mult))
        stages[4].append(delta_reg.eq((scaled + half) >> lora.b_shift))
        m.d.comb += delta[e].eq(Mux(p.lora_on, delta_reg, 0))
    valid = [Signal(name=f"delta_valid{k}") for k in range(len(stages))]
    consumed, advance = Signal(), Signal()
    m.d.comb += [consumed.eq(units.rescales[0].o.valid & units.rescales[0].o.ready), advance.eq(~valid[-1] | consumed)]
    m.d.comb += [*(lora.b_addr[e].eq(prefetch_row + e) for e in range(wide)), lora.b_en.eq(advance & ~p.mv_start)]
    with m.If(p.mv_start):  # t16, the slot and its B scales are final when a projection starts
        m.d.sync += [prefetch_row.eq(0), *(v.eq(0) for v in valid)]
    with m.Elif(advance):
        m.d.sync += [prefetch_row.eq(prefetch_row + p.step), valid[0].eq(1),
                     *(valid[k + 1].eq(valid[k]) for k in range(len(stages) - 1)), *(s for st in stages for s in st)]
    return delta


def _destinations(m: Module, dims: Dims, p: Product, r: _Rows, y: _Beat, kv: KvCache, vectors: Vectors, units: Units,
                  control: Control, link: NormLink) -> None:
    """The projections' destinations: raw q and k, the transposed V cache, the residual (whose update also streams
    into the next norm unit), a post-sublayer norm, the gate vector and the activation units."""
    took = r.took
    m.d.comb += took.eq(y.valid & r.dest_ready)
    with m.If(took):
        m.d.sync += [r.row_out.eq(r.row_out + r.beat), p.rows_left.eq(p.rows_left - r.beat)]
    resid_free, resid_capture = _residual_stage(m, dims, r, y, vectors, link)
    gate_rd = Reader(vectors.gate, 0)
    row_out, beat, y8 = r.row_out, r.beat, y.y8
    with m.Switch(p.mv_mode):
        with m.Case(Mode.Q, Mode.K):
            m.d.comb += r.dest_ready.eq(1)
            raw = y8 if dims.raw_bits == 8 else [saturate(y, dims.raw_bits) for y in y.y16]  # int12 into RoPE
            for vec, mode in ((vectors.raw_q, Mode.Q), (vectors.raw_k, Mode.K)):
                run_into(m, vec, row_out, raw, beat, took & (p.mv_mode == mode))
        with m.Case(Mode.V):  # transposed: row j of head g, column = slot (as K's); a beat's channels in distinct banks
            m.d.comb += r.dest_ready.eq(1)
            slot = control.kv_slot
            word = control.layer_sel * kv.v_layer + (row_out // dims.attn_rows) * dims.c_ctx + slot // dims.lanes
            beat_bank_write(m, kv.v_wr, row_out, word, slot % dims.lanes, y8, beat, took)
        with m.Case(Mode.RESID):  # through the residual stages
            m.d.comb += r.dest_ready.eq(resid_free)
            with m.If(took):
                m.d.sync += resid_capture
        if dims.post_norms:
            with m.Case(Mode.POST):  # o's or down's rows straight into their post-sublayer norm, beat by beat
                m.d.comb += [r.dest_ready.eq(link.ready), link.valid.eq(y.valid), link.count.eq(beat),
                             *(link.values[e].eq(y.y16[e]) for e in range(dims.wide))]
        with m.Case(Mode.GATE):
            m.d.comb += r.dest_ready.eq(1)
            run_into(m, vectors.gate, row_out, y8, beat, took)
        with m.Case(Mode.UP):  # every lane's unit takes its row (lanes past the beat compute what is not kept)
            m.d.comb += [gate_rd.addr.eq(row_out), r.dest_ready.eq(units.acts[0].i.ready)]
            for e, unit in enumerate(units.acts):
                m.d.comb += unit.i.valid.eq(y.valid)
                if dims.gated:
                    m.d.comb += [unit.i.payload.gate.eq(gate_rd.run[e]), unit.i.payload.up.eq(y8[e])]
                else:
                    m.d.comb += unit.i.payload.eq(y8[e])


def _residual_stage(m: Module, dims: Dims, r: _Rows, y: _Beat, vectors: Vectors, link: NormLink) -> tuple[Signal, list]:
    """resid += y16 (saturated) for a beat, in two registers on its way into the residual and the norm unit: the
    beat with the residual's run (read by its own reader at row_out), then the saturated sum, which is written
    and handed to the norm. In one cycle, read, add, write and the norm's input word were the ECP5 critical path.
    Rows of consecutive beats differ, so no beat reads what the stages still hold. The stages drain whatever the
    mode (the product may have ended); -> (the first stage is free, its capture statements for the RESID mode)."""
    wide = dims.wide
    m.d.comb += vectors.resid_upd.addr.eq(r.row_out)
    a_full, b_full = Signal(name="resid_read_full"), Signal(name="resid_sum_full")
    a_row, b_row = (Signal.like(r.row_out, name=f"resid_{n}_row") for n in ("read", "sum"))
    a_beat, b_beat = (Signal.like(r.beat, name=f"resid_{n}_beat") for n in ("read", "sum"))
    old = [Signal(signed(16), name=f"resid_old{e}") for e in range(wide)]
    add = [Signal(signed(16), name=f"resid_add{e}") for e in range(wide)]
    new = [Signal(signed(16), name=f"resid_sum{e}") for e in range(wide)]
    b_out, a_to_b, a_free = Signal(), Signal(), Signal()
    m.d.comb += [b_out.eq(b_full & link.ready), a_to_b.eq(a_full & (~b_full | b_out)),
                 a_free.eq(~a_full | a_to_b)]
    with m.If(b_out):
        m.d.sync += b_full.eq(0)
        m.d.comb += [link.valid.eq(1), link.count.eq(b_beat), *(link.values[e].eq(new[e]) for e in range(wide))]
        run_into(m, vectors.resid, b_row, new, b_beat, 1)
    with m.If(a_to_b):
        m.d.sync += [a_full.eq(0), b_full.eq(1), b_row.eq(a_row), b_beat.eq(a_beat),
                     *(new[e].eq(saturate(old[e] + add[e], 16)) for e in range(wide))]
    capture = [a_full.eq(1), a_row.eq(r.row_out), a_beat.eq(r.beat),
               *(old[e].eq(vectors.resid_upd.run[e]) for e in range(wide)), *(add[e].eq(y.y16[e]) for e in range(wide))]
    return a_free, capture


def _attention_and_head_destinations(m: Module, dims: Dims, p: Product, r: _Rows, y: _Beat, buffers: Buffers,
                                     units: Units, control: Control, lora: LoraBank) -> None:
    """Scores into the softmax, the attention output into the activation buffer, LoRA A into t16, logits into the
    argmax."""
    row_out, beat, took = r.row_out, r.beat, r.took
    ys = y.y32  # rescale(acc), clamped to int32
    valid = y.valid
    scores_in, argmax, wr_act = units.softmax_in, units.argmax, buffers.wr["act"]  # the softmax behind its register
    with m.Switch(p.mv_mode):
        with m.Case(Mode.SCORES):  # beats of at most softmax.in_lanes (the serializer's groups of attention rows)
            m.d.comb += [scores_in.i.valid.eq(valid), r.dest_ready.eq(scores_in.i.ready),
                         scores_in.i.payload.count.eq(beat), scores_in.i.payload.last.eq(r.last_beat)]
            if units.soft_caps:  # each through its soft-cap table (Gemma 2)
                m.d.comb += [units.soft_caps[e].t.eq(ys[e]) for e in range(units.softmax.in_lanes)]
                m.d.comb += [scores_in.i.payload.scores[e].eq(units.soft_caps[e].capped)
                             for e in range(units.softmax.in_lanes)]
            else:
                m.d.comb += [scores_in.i.payload.scores[e].eq(ys[e]) for e in range(units.softmax.in_lanes)]
        with m.Case(Mode.PV):  # attention output of this head, element head*hd + j
            element = Signal(range(dims.qdim))
            m.d.comb += [r.dest_ready.eq(1), element.eq(control.head * dims.hd + row_out),
                         wr_act.addr.eq(element // dims.lanes), wr_act.en.eq(Mux(took, 1 << (element % dims.lanes), 0))]
            m.d.comb += [wr_act.data[j].eq(y.y8[0]) for j in range(dims.lanes)]
        with m.Case(Mode.LORA_A):
            m.d.comb += r.dest_ready.eq(1)
            with m.If(took), m.Switch(row_out):
                for j in range(lora.rank):
                    with m.Case(j):
                        m.d.sync += r.t16[j].eq(y.y16[0])
        with m.Case(Mode.LOGITS):
            m.d.comb += [argmax.i.valid.eq(valid), r.dest_ready.eq(argmax.i.ready),
                         argmax.i.payload.count.eq(beat), argmax.i.payload.last.eq(r.last_beat)]
            m.d.comb += [argmax.i.payload.values[e].eq(ys[e]) for e in range(dims.wide)]


def _hidden_writer(m: Module, qm: QModel, dims: Dims, p: Product, buffers: Buffers, units: Units) -> Signal:
    """The activation units' output, beats of hidden[o] in order, into the hidden buffer; -> rows not yet written
    (a register, like the epilogue's rows left: a subtraction in front of the write enables was the critical
    path)."""
    wide = dims.wide
    hid_count = Signal(range(qm.config.ffn + 1))
    hid_left = Signal.like(p.mv_rows)
    for unit in units.acts:
        m.d.comb += unit.o.ready.eq(1)
    hid_valid, hid_beat = Signal(), Signal(range(wide + 1))
    m.d.comb += [hid_valid.eq(units.acts[0].o.valid),
                 hid_beat.eq(Mux(hid_left < p.step, hid_left, p.step))]
    write_run(m, buffers.wr["hid"], hid_count, [unit.o.payload for unit in units.acts], hid_beat, hid_valid, dims.lanes)
    with m.If(hid_valid):
        m.d.sync += [hid_count.eq(hid_count + hid_beat), hid_left.eq(hid_left - hid_beat)]
    with m.If(p.mv_start):  # mv_rows is set by then
        m.d.sync += [hid_count.eq(0), hid_left.eq(p.mv_rows)]
    return hid_left


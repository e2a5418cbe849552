"""Decoder: the whole model as one circuit, running a static schedule per token.

One token in, one token out (the argmax after it). Weights sit in WeightStores (ROM or
constant logic), the KV cache in per-layer SRAMs, and every multiply-accumulate of the
token, projections and attention alike, runs through one MacArray of `lanes` lanes fed
by a single address generator. The schedule is fixed at compile time: a Python loop over
the QModel unrolls it into the states of one FSM (no run-time scheduling, as in TileRT).
docs/hardware.md draws the data flow; docs/numerics.md is what every block computes.
LoRA adapters (numerics §9) live in writable SRAM loaded through the `lora` port between
tokens (rtl/lora_map.py); an adapted projection first runs A over its input (rank rows)
into sixteen-bit registers, then adds B t to each output row before its saturation. The
rescaled row is clamped to int32 before that sum (the reference keeps it unclamped): the
result differs only where a projection output alone already exceeds int32.
"""

from __future__ import annotations

from amaranth.hdl import Const, Elaboratable, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..quant.qmodel import QLinear, QModel
from .activation import Glu, TableLookup
from .argmax import Argmax
from .banked_vector import BankedVector
from .lora_map import RESET, lora_addr_bits, lora_address_map
from .mac_array import MacArray
from .norm import NormSite, NormUnit
from .plan import KV_BITS, HardwarePlan, epilogue_width, kv_layer_words, row_code_bits, score_beat, weight_formats
from .rescale import Rescale, saturate
from .rope import Rope
from .row_serializer import RowSerializer
from .softmax import Softmax
from .weight_banks import WeightBanks
from .weight_store import WeightStore
from .word_runs import write_run

ACT_BITS = 17  # MAC activations: int8 and int16 values, and Q15 probabilities up to 32768
MAX_LORA_RANK = 64  # LoRA B t: one multiplier per rank, all in the epilogue


class _Start(list):
    """The statements that start a matrix-vector product, and what they start (for LoRA)."""

    def __init__(self, stmts: list, tensor: object, chunks: object, src: Source) -> None:
        super().__init__(stmts)
        self.tensor, self.chunks, self.src = tensor, chunks, src


class Mode(enum.Enum, shape=4):
    """Where a matrix-vector result goes (the epilogue)."""

    Q = 0  # int8 -> raw q, rotated later
    K = 1  # int8 -> raw k, rotated into the K cache
    V = 2  # int8 -> the transposed V cache at this position
    RESID = 3  # int16 -> added to the residual (o, down)
    GATE = 4  # int8 -> gate buffer
    UP = 5  # int8 -> SILU[gate] * up (or GELU[up]) -> hidden buffer
    SCORES = 6  # int32 scores -> softmax
    PV = 7  # attention output int8 -> activation buffer
    LOGITS = 8  # int32 -> argmax
    LORA_A = 9  # LoRA A a, rescaled to int16 -> the t16 registers


class Source(enum.Enum, shape=3):
    """Where the MAC lanes' activations come from."""

    ACT = 0  # norm output or attention output
    HID = 1  # MLP hidden
    Q = 2  # rotated q
    PROBS = 3  # softmax probabilities


class _Reader:
    """Element reader `r` of a BankedVector, read one element at a time (`addr`, `data`) or as a run (`run`)."""

    def __init__(self, vector: BankedVector, r: int) -> None:
        self.addr, self.data, self.run = vector.rd_base[r], vector.rd_values[r][0], vector.rd_values[r]


def token_layout(vocab: int) -> data.StructLayout:
    return data.StructLayout({"token": unsigned(max(1, (vocab - 1).bit_length())), "new_seq": 1})


def status_layout() -> data.StructLayout:
    return data.StructLayout({"tokens": unsigned(32), "cycles": unsigned(32), "position": unsigned(16),
                              "busy": 1, "context_full": 1, "bad_token": 1})


def _check(qm: QModel, rows: int, lanes: int, storage: str, attention_rows: int | None, softmax_lanes: int,
           dsp_rows: int | None, epilogue_lanes: int) -> None:
    cfg = qm.config
    if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= 64 or rows & (rows - 1):
        raise ValueError(f"rows must be a power of two from 1 to 64, got {rows!r}")
    if attention_rows is not None:
        ok = [a for a in range(1, rows + 1) if not a & (a - 1) and cfg.head_dim % a == 0]
        if attention_rows not in ok:
            raise ValueError(f"attention rows must be a power of two that divides the head width {cfg.head_dim} and is "
                             f"at most rows ({rows}), got {attention_rows!r}; accepted: {', '.join(map(str, ok))}")
    if storage not in ("rom", "logic"):
        raise ValueError(f"storage must be 'rom' or 'logic', got {storage!r}")
    if dsp_rows is not None and (isinstance(dsp_rows, bool) or not isinstance(dsp_rows, int) or
                                 not 0 <= dsp_rows <= rows):
        raise ValueError(f"DSP rows must be None (all) or a count from 0 to rows ({rows}), got {dsp_rows!r}")
    if lanes < 1 or lanes & (lanes - 1) or lanes > 64:
        raise ValueError(f"lanes must be a power of two from 1 to 64, got {lanes}")
    if cfg.head_dim % lanes:
        raise ValueError(f"lanes {lanes} must divide the head width {cfg.head_dim}: the attention products read "
                         f"whole heads; accepted lanes for this model: "
                         f"{', '.join(str(1 << k) for k in range(7) if cfg.head_dim % (1 << k) == 0)}")
    if qm.scheme == "mxfp4" and 32 % lanes:
        raise ValueError(f"MXFP4 needs lanes dividing its 32-element blocks, got {lanes}")
    if qm.lora.rank > MAX_LORA_RANK and qm.lora.sites:
        raise ValueError(f"LoRA rank {qm.lora.rank} is more than the {MAX_LORA_RANK} products the epilogue forms per "
                         f"output row (B t); quantize with a rank of at most {MAX_LORA_RANK}")
    for site in qm.lora.sites:
        if qm.lora.rank and any(getattr(layer, site, None) is None for layer in qm.layers):
            raise ValueError(f"LoRA site {site!r} is not a projection of every layer of this model")
    if isinstance(softmax_lanes, bool) or softmax_lanes not in [1 << k for k in range(7)] or lanes % softmax_lanes:
        raise ValueError(f"softmax lanes must be a power of two that divides lanes ({lanes}), got {softmax_lanes!r}")
    if (isinstance(epilogue_lanes, bool) or epilogue_lanes not in [1 << k for k in range(7)] or rows % epilogue_lanes
            or lanes % epilogue_lanes):
        raise ValueError(f"epilogue lanes must be a power of two that divides rows ({rows}) and lanes ({lanes}), "
                         f"got {epilogue_lanes!r}")


class Decoder(wiring.Component):
    """Token stream in (with a new-sequence flag), next-token stream out, status counters."""

    def __init__(self, qm: QModel, *, rows: int = 1, lanes: int = 8, storage: str = "rom",
                 attention_rows: int | None = None, softmax_lanes: int = 1, dsp_rows: int | None = None,
                 epilogue_lanes: int = 1) -> None:
        try:
            _check(qm, rows, lanes, storage, attention_rows, softmax_lanes, dsp_rows, epilogue_lanes)
        except ValueError:
            self._MustUse__silence = True
            raise
        self.qm, self.rows, self.lanes, self.storage = qm, rows, lanes, storage
        self.plan = HardwarePlan(rows=rows, lanes=lanes, storage=storage, attention_rows=attention_rows,
                                 softmax_lanes=softmax_lanes, dsp_rows=dsp_rows, epilogue_lanes=epilogue_lanes)
        # attention runs `rows` positions (scores) or channels (weighted sum) at once when the head width allows
        self.attn_rows = self.plan.attn_rows(qm.config.head_dim)
        cfg = qm.config
        self.token_bits = max(1, (cfg.vocab_size - 1).bit_length())
        super().__init__({
            "tokens": In(stream.Signature(token_layout(cfg.vocab_size))),
            "out": Out(stream.Signature(unsigned(self.token_bits))),
            "status": Out(status_layout()),
            "lora": In(stream.Signature(data.StructLayout({"addr": unsigned(lora_addr_bits(qm)),
                                                           "data": unsigned(16)}))),
        })

    # -- static facts of the schedule -----------------------------------------------------

    def chunks(self, n: int) -> int:
        return -(-n // self.lanes)

    def elaborate(self, platform: object) -> Elaboratable:
        m = Module()
        qm, lanes = self.qm, self.lanes
        cfg = qm.config
        d, hd, ctx = cfg.d_model, cfg.head_dim, qm.context
        kvdim, qdim = cfg.n_kv_heads * hd, cfg.n_heads * hd
        group = cfg.n_heads // cfg.n_kv_heads
        gated = cfg.activation == "silu_glu"
        c_ctx, c_kv = self.chunks(ctx), kvdim // lanes
        linears = dict(qm.linears())
        acc_bits = max(max(lin.acc_bits for lin in linears.values()), 32) + 1

        # -- weight banks (one set per storage format) and the per-row epilogue constants -------------
        rows = self.rows
        formats = weight_formats(qm)
        banks: list[WeightBanks] = []
        bank_of, base_of = {}, {}
        for index, ((scheme, bits), names) in enumerate(formats.items()):
            wb = WeightBanks([(linears[n].codes.numpy(), linears[n].block_shift.numpy()) for n in names], rows=rows,
                             lanes=lanes, code_bits=bits, scheme=scheme, storage=self.storage)
            m.submodules[f"weights{index}"] = wb
            banks.append(wb)
            for n, base in zip(names, wb.bases, strict=True):
                bank_of[n], base_of[n] = index, base
        self.banks = banks
        wide = self.plan.epilogue_lanes  # rows per cycle through the epilogue (when the destination takes them)
        params: dict[str, object] = {}
        for index, (name, lin) in enumerate(linears.items()):
            params[name] = self._param_rom(m, f"p{index}", lin, acc_bits, wide)
        embed = WeightStore(qm.embed.codes.numpy(), qm.embed.block_shift.numpy(), lanes=lanes,
                            code_bits=qm.embed.bits, scheme=qm.embed.scheme, storage=self.storage)
        m.submodules.embed = embed
        embed_scale = self._scale_rom(m, "embed_scale", qm.embed.mult.tolist(), qm.embed.shift.tolist())
        pos_store = pos_scale = None
        if qm.pos is not None:
            pos_store = WeightStore(qm.pos.codes.numpy(), qm.pos.block_shift.numpy(), lanes=lanes,
                                    code_bits=qm.pos.bits, scheme=qm.pos.scheme, storage=self.storage)
            m.submodules.pos = pos_store
            pos_scale = self._scale_rom(m, "pos_scale", qm.pos.mult.tolist(), qm.pos.shift.tolist())

        # -- buffers ----------------------------------------------------------------------------
        act_layout = data.ArrayLayout(signed(ACT_BITS), lanes)
        kv_layout = data.ArrayLayout(signed(KV_BITS), lanes)
        big = max(d, qdim)
        mems = {
            "act": Memory(shape=act_layout, depth=self.chunks(big), init=[]),
            "hid": Memory(shape=act_layout, depth=self.chunks(cfg.ffn), init=[]),
            "qrot": Memory(shape=act_layout, depth=self.chunks(qdim), init=[]),
            "probs": Memory(shape=act_layout, depth=c_ctx, init=[]),
        }
        for name, mem in mems.items():
            m.submodules[name] = mem
        # the KV cache in `attn_rows` banks, so that the scores of attn_rows positions (K: position p in bank
        # p % attn_rows) and the weighted sums of attn_rows channels (V transposed: channel j in bank j % attn_rows)
        # are formed at once; every layer's cache lies in the same banks, one after another (one layer runs at a
        # time, so a bank's port serves them all and block RAM holds the cache at its full width)
        attn_rows = self.attn_rows
        k_layer, v_layer = kv_layer_words(qm, self.plan)
        kcache = [Memory(shape=kv_layout, depth=cfg.n_layers * k_layer, init=[]) for _ in range(attn_rows)]
        vcache = [Memory(shape=kv_layout, depth=cfg.n_layers * v_layer, init=[]) for _ in range(attn_rows)]  # V^T
        for b in range(attn_rows):
            m.submodules[f"kcache{b}"], m.submodules[f"vcache{b}"] = kcache[b], vcache[b]
        # element vectors the epilogue writes `wide` rows at a time (banked: rtl/banked_vector.py)
        resid = BankedVector(m, "resid", signed(16), d, wide)
        gate_vec = BankedVector(m, "gate", signed(8), cfg.ffn, wide)
        # q and k before rotation, apart so that q is rotated while the K projection writes k (small: LUT RAM)
        raw_q = BankedVector(m, "raw_q", signed(8), qdim, wide, readers=2)
        raw_k = BankedVector(m, "raw_k", signed(8), kvdim, wide, readers=2)
        self.memories = {**mems, **{f"kcache{b}": mem for b, mem in enumerate(kcache)},  # for testbenches
                         **{f"vcache{b}": mem for b, mem in enumerate(vcache)}}
        for name, vec in (("resid", resid), ("gate", gate_vec), ("raw_q", raw_q), ("raw_k", raw_k)):
            self.memories.update({f"{name}{b}": mem for b, mem in enumerate(vec.memories)})

        resid_rd = _Reader(resid, 0)
        rq1, rq2, rk1, rk2 = _Reader(raw_q, 0), _Reader(raw_q, 1), _Reader(raw_k, 0), _Reader(raw_k, 1)
        rd = {name: mem.read_port() for name, mem in mems.items()}
        wr = {name: mem.write_port(granularity=1) for name, mem in mems.items()}
        k_rd = [mem.read_port() for mem in kcache]
        k_wr = [mem.write_port(granularity=1) for mem in kcache]
        v_rd = [mem.read_port() for mem in vcache]
        v_wr = [mem.write_port(granularity=1) for mem in vcache]

        # -- units ------------------------------------------------------------------------------
        # the first rows multiply on DSP blocks, the rest by shift-add, each only as wide as the codes it sees
        macs = [MacArray(lanes, act_bits=ACT_BITS, acc_bits=acc_bits, code_bits=row_code_bits(qm, self.plan, r),
                         multiplier="shift_add" if r >= rows - self.plan.shift_add_rows else "dsp")
                for r in range(rows)]
        for r, mac in enumerate(macs):
            m.submodules[f"mac{r}"] = mac
        m.submodules.serializer = serializer = RowSerializer(rows, acc_bits, wide)
        rescales = [Rescale(acc_bits + 1, 32) for _ in range(wide)]  # one per epilogue lane, in lockstep
        for e, unit in enumerate(rescales):
            m.submodules[f"rescale{e}" if wide > 1 else "rescale"] = unit
        rescale = rescales[0]
        m.submodules.embed_rescale = emb_rescale = Rescale(8 + 24 + 1, 16)
        # one norm unit for every norm site (they run one at a time), with each site's constants
        norm_sites = {}
        for i, layer in enumerate(qm.layers):
            norm_sites[f"attn{i}"], norm_sites[f"mlp{i}"] = layer.attn_norm, layer.mlp_norm
        norm_sites["final"] = qm.final_norm
        norm_unit = NormUnit(d, cfg.norm, [NormSite(qn.eps_q, qn.mult.tolist(), qn.shift.tolist())
                                           for qn in norm_sites.values()], lanes=self.plan.vector_lanes,
                             in_lanes=wide)
        m.submodules.norm = norm_unit
        # one softmax for every layer (one head runs at a time), with each layer's scale: its score buffer and
        # exponent tables exist once, so several softmax lanes cost block RAM once, not per layer
        m.submodules.softmax = softmax = Softmax(ctx, [layer.sm_mult for layer in qm.layers],
                                                 [layer.sm_shift for layer in qm.layers], lanes=self.plan.softmax_lanes,
                                                 in_lanes=score_beat(self.plan, hd))
        acts = []  # one activation unit per epilogue lane, holding every layer's table (layer_sel picks)
        for e in range(wide):
            unit = (Glu if gated else TableLookup)(*(layer.act_table for layer in qm.layers))
            m.submodules[f"act{e}"] = unit
            acts.append(unit)
        rope = None
        if cfg.positions == "rope":
            m.submodules.rope = rope = Rope(qm.rope_cos, qm.rope_sin)
        m.submodules.argmax = argmax = Argmax(32, cfg.vocab_size, wide)
        self._argmax = argmax

        # -- control registers ---------------------------------------------------------------------
        token = Signal(self.token_bits)
        position = Signal(range(ctx + 1))
        # selectors keep at least one bit: a zero-width signal is written as [-1:0], which Verilog tools refuse
        layer_sel = Signal(range(max(2, cfg.n_layers)))
        m.d.comb += softmax.site.eq(layer_sel)  # the layer's score scale
        m.d.comb += [unit.site.eq(layer_sel) for unit in acts]  # the layer's activation table
        head = Signal(range(max(2, cfg.n_heads)))
        busy, context_full, bad_token = Signal(), Signal(), Signal()
        tokens_done, cycles = Signal(32), Signal(32)
        m.d.sync += cycles.eq(cycles + 1)
        m.d.comb += [self.status.tokens.eq(tokens_done), self.status.cycles.eq(cycles),
                     self.status.position.eq(position), self.status.busy.eq(busy),
                     self.status.context_full.eq(context_full), self.status.bad_token.eq(bad_token)]

        # -- LoRA adapters: A and B in writable SRAM, scales in registers, loaded between tokens -------
        # (address map: rtl/lora_map.py; what they compute: docs/numerics.md §9)
        slots = lora_address_map(qm)
        rank = qm.lora.rank if slots else 0
        lora_sel = Signal(range(max(2, len(slots))))  # the slot of the projection running now
        lora_on = Signal()  # this projection adds its LoRA term
        t16 = Signal(data.ArrayLayout(signed(16), max(1, rank)))  # rescale(A a): the rank values of this slot
        a_rd, b_rd, lora_regs = [], [], []
        m.d.comb += self.lora.ready.eq(~busy)  # writes only between tokens; the host waits while busy
        lora_we = Signal()
        m.d.comb += lora_we.eq(self.lora.valid & self.lora.ready)
        laddr, ldata = self.lora.payload.addr, self.lora.payload.data
        lane_bits = (lanes - 1).bit_length()

        def split(value: object, bits: int) -> tuple[object, object]:
            return (value[:bits] if bits else Const(0, 1)), value[bits:]

        for n, slot in enumerate(slots):
            c_in = self.chunks(slot.in_features)
            a_mem = Memory(shape=data.ArrayLayout(signed(8), lanes), depth=rank * c_in, init=[])
            b_mem = Memory(shape=data.ArrayLayout(signed(8), rank), depth=slot.out_features, init=[])
            m.submodules[f"lora_a{n}"], m.submodules[f"lora_b{n}"] = a_mem, b_mem
            self.memories[f"lora_a{n}"], self.memories[f"lora_b{n}"] = a_mem, b_mem
            a_rd.append(a_mem.read_port())
            b_rd.append([b_mem.read_port(domain="comb") for _ in range(self.plan.epilogue_lanes)])  # one per lane
            a_wr, b_wr = a_mem.write_port(granularity=1), b_mem.write_port(granularity=1)
            # A[j, k] at a_base + j * a_stride + k -> word j * c_in + k // lanes, lane k % lanes
            a_off = Signal(range(rank * slot.a_stride), name=f"lora{n}_a_off")
            m.d.comb += a_off.eq(laddr - slot.a_base)
            k, j = split(a_off, (slot.a_stride - 1).bit_length())
            a_hit = Signal(name=f"lora{n}_a_hit")
            a_in = (laddr < slot.b_base) if slot.a_base == 0 else (laddr >= slot.a_base) & (laddr < slot.b_base)
            if slot.in_features < slot.a_stride:  # padding addresses: ignored (constant compares upset lint)
                a_in &= k < slot.in_features
            m.d.comb += a_hit.eq(lora_we & a_in)
            lane, word_in_row = split(k, lane_bits)
            m.d.comb += [a_wr.addr.eq(j * c_in + word_in_row), a_wr.en.eq(Mux(a_hit, 1 << lane, 0))]
            m.d.comb += [a_wr.data[e].eq(ldata[:8]) for e in range(lanes)]
            # B[o, j] at b_base + o * b_stride + j -> word o, element j
            b_off = Signal(range(slot.out_features * slot.b_stride), name=f"lora{n}_b_off")
            m.d.comb += b_off.eq(laddr - slot.b_base)
            jb, o = split(b_off, (slot.b_stride - 1).bit_length())
            b_hit = Signal(name=f"lora{n}_b_hit")
            b_in = (laddr >= slot.b_base) & (laddr < slot.reg_base)
            if rank < slot.b_stride:
                b_in &= jb < rank
            m.d.comb += b_hit.eq(lora_we & b_in)
            m.d.comb += [b_wr.addr.eq(o), b_wr.en.eq(Mux(b_hit, 1 << jb, 0))]
            m.d.comb += [b_wr.data[e].eq(ldata[:8]) for e in range(rank)]
            regs = {}
            for r_index, (r_name, r_init) in enumerate(RESET.items()):
                regs[r_name] = reg = Signal(15 if r_name.endswith("mult") else 6, init=r_init, name=f"lora{n}_{r_name}")
                with m.If(lora_we & (laddr == slot.reg_base + r_index)):
                    m.d.sync += reg.eq(ldata[:len(reg)])
            lora_regs.append(regs)

        # -- the matrix-vector engine: one address generator for every MAC ---------------------------
        mv_start = Signal()  # one-cycle pulse, set by the schedule with the mv_* registers below
        m.d.sync += mv_start.eq(0)
        mv_tensor = Signal(range(max(2, len(linears))))
        mv_format = Signal(range(max(2, len(banks))))
        mv_group = Signal(range(rows + 1))  # rows per group: all (a weight matrix), attn_rows, or one (LoRA A)
        mv_mode = Signal(Mode)
        mv_src = Signal(Source)
        mv_attn = Signal()  # codes from the K / V cache instead of a weight store
        mv_wide = Signal()  # the epilogue takes `wide` rows per beat (else one)
        m.d.comb += serializer.wide.eq(mv_wide)
        mv_rows = Signal(range(max(ctx, cfg.ffn, cfg.vocab_size, d, qdim) + 1))
        mv_chunks = Signal(range(self.chunks(max(ctx, cfg.ffn, d, qdim)) + 1))
        mv_groups = Signal.like(mv_rows)
        max_words = max([cfg.n_layers * k_layer, cfg.n_layers * v_layer] + [wb.words for wb in banks])
        mv_row_stride = Signal(range(max_words + 1))
        mv_code_base = Signal(range(max_words + 1))
        mv_act_base = Signal(range(self.chunks(max(big, cfg.ffn, ctx)) + 1))
        row, chunk = Signal.like(mv_rows), Signal.like(mv_chunks)
        row_base = Signal.like(mv_code_base)
        issuing, pending = Signal(), Signal()
        first_q, last_q = Signal(), Signal()
        advance = Signal()
        m.d.comb += advance.eq(~pending | macs[0].i.ready)
        code_addr = Signal.like(mv_code_base)
        act_addr = Signal.like(mv_act_base)
        m.d.comb += [code_addr.eq(row_base + chunk), act_addr.eq(mv_act_base + chunk)]
        for wb in banks:
            m.d.comb += [wb.addr.eq(code_addr), wb.en.eq(advance)]
        for port in rd.values():
            m.d.comb += [port.addr.eq(act_addr), port.en.eq(advance)]
        for port in k_rd + v_rd + a_rd:
            m.d.comb += [port.addr.eq(code_addr), port.en.eq(advance)]
        with m.If(mv_start):
            m.d.sync += [issuing.eq(1), row.eq(0), chunk.eq(0), row_base.eq(mv_code_base)]
        with m.Elif(advance):
            m.d.sync += pending.eq(issuing)
            with m.If(issuing):
                m.d.sync += [first_q.eq(chunk == 0), last_q.eq(chunk == mv_chunks - 1)]
                with m.If(chunk == mv_chunks - 1):
                    m.d.sync += [chunk.eq(0), row.eq(row + 1), row_base.eq(row_base + mv_row_stride)]
                    with m.If(row == mv_groups - 1):
                        m.d.sync += issuing.eq(0)
                with m.Else():
                    m.d.sync += chunk.eq(chunk + 1)
        # codes: the selected weight store, or this layer's K / V cache word
        codes_sel = Signal(data.ArrayLayout(data.ArrayLayout(signed(8), lanes), rows))  # one word per row unit
        shift_sel = Signal(data.ArrayLayout(unsigned(5), rows))
        with m.If(mv_attn):  # row unit b reads KV bank b
            for b in range(attn_rows):
                with m.If(mv_mode == Mode.SCORES):
                    m.d.comb += [codes_sel[b][j].eq(k_rd[b].data[j]) for j in range(lanes)]
                with m.Else():
                    m.d.comb += [codes_sel[b][j].eq(v_rd[b].data[j]) for j in range(lanes)]
        with m.Elif(mv_mode == Mode.LORA_A), m.Switch(lora_sel):  # A of the slot: int8 codes, no block shift
            for n, port in enumerate(a_rd):
                with m.Case(n):
                    m.d.comb += [codes_sel[0][j].eq(port.data[j]) for j in range(lanes)]
        with m.Else(), m.Switch(mv_format):
            for index, wb in enumerate(banks):
                with m.Case(index):
                    m.d.comb += [codes_sel.eq(wb.codes), shift_sel.eq(wb.shift)]
        acts_sel = Signal(act_layout)
        with m.Switch(mv_src):
            for src, name in ((Source.ACT, "act"), (Source.HID, "hid"), (Source.Q, "qrot"), (Source.PROBS, "probs")):
                with m.Case(src):
                    m.d.comb += acts_sel.eq(rd[name].data)
        for r, mac in enumerate(macs):  # the activation word is broadcast to every row unit
            m.d.comb += [mac.i.valid.eq(pending), mac.i.payload.codes.eq(codes_sel[r]),
                         mac.i.payload.shift.eq(shift_sel[r]), mac.i.payload.acts.eq(acts_sel),
                         mac.i.payload.first.eq(first_q), mac.i.payload.last.eq(last_q)]
        # the row units finish together; the serializer hands their sums on one per cycle, in row order
        rows_loaded = Signal.like(mv_rows)
        rows_left = Signal.like(mv_rows)
        m.d.comb += rows_left.eq(mv_rows - rows_loaded)
        m.d.comb += [serializer.i.valid.eq(macs[0].o.valid),
                     serializer.i.payload.count.eq(Mux(rows_left >= mv_group, mv_group, rows_left))]
        for r, mac in enumerate(macs):
            m.d.comb += [serializer.i.payload.values[r].eq(mac.o.payload), mac.o.ready.eq(serializer.i.ready)]
        with m.If(mv_start):
            m.d.sync += rows_loaded.eq(0)
        with m.Elif(serializer.i.valid & serializer.i.ready):
            m.d.sync += rows_loaded.eq(rows_loaded + serializer.i.payload.count)

        # -- epilogue: bias and rescale, then the destination, a beat of rows per cycle --------------
        # a beat is `wide` consecutive rows (mv_wide) or one; each lane has its own bias and rescale, and the
        # destinations take runs of consecutive elements (BankedVector, lane-group writes), so rows stay in order
        row_in = Signal.like(mv_rows)  # rows that entered the rescale
        row_out = Signal.like(mv_rows)  # rows that left it
        step = Signal(range(wide + 1))  # rows per full beat: a group (attention rows) may be narrower than `wide`
        beat = Signal(range(wide + 1))  # rows in the beat leaving the rescale: every beat is full but the last
        m.d.comb += [step.eq(Mux(mv_wide, Mux(mv_group < wide, mv_group, wide), 1)),
                     beat.eq(Mux(mv_rows - row_out < step, mv_rows - row_out, step))]
        bias = [Signal(signed(acc_bits), name=f"bias{e}") for e in range(wide)]
        mult = [Signal(15, name=f"mult{e}") for e in range(wide)]
        shift = [Signal(6, name=f"shift{e}") for e in range(wide)]
        att_mult, att_shift = Signal(15), Signal(6)
        with m.Switch(layer_sel):
            for i, layer in enumerate(qm.layers):
                with m.Case(i):
                    m.d.comb += [att_mult.eq(layer.att_mult), att_shift.eq(layer.att_shift)]
        with m.If(mv_mode == Mode.SCORES):
            m.d.comb += [*(mu.eq(1 << 14) for mu in mult), *(sh.eq(14) for sh in shift)]  # identity: scores pass
        with m.Elif(mv_mode == Mode.PV):
            m.d.comb += [mult[0].eq(att_mult), shift[0].eq(att_shift)]
        with m.Elif(mv_mode == Mode.LORA_A), m.Switch(lora_sel):
            for n, regs in enumerate(lora_regs):
                with m.Case(n):
                    m.d.comb += [mult[0].eq(regs["a_mult"]), shift[0].eq(regs["a_shift"])]
        with m.Else(), m.Switch(mv_tensor):
            wide_bits = (wide - 1).bit_length()
            for index, name in enumerate(linears):
                with m.Case(index):
                    port = params[name]  # words of `wide` rows' constants: a wide beat reads one whole word
                    m.d.comb += port.addr.eq(row_in >> wide_bits)
                    for e in range(wide):
                        entry = port.data[e] if e else port.data[Mux(mv_wide, 0, row_in[:wide_bits])]
                        m.d.comb += [bias[e].eq(entry.bias), mult[e].eq(entry.mult), shift[e].eq(entry.shift)]
        dest_ready = Signal()
        for e, unit in enumerate(rescales):
            m.d.comb += [unit.i.valid.eq(serializer.o.valid), unit.i.payload.value.eq(serializer.o.payload.values[e] + bias[e]),
                         unit.i.payload.mult.eq(mult[e]), unit.i.payload.shift.eq(shift[e]), unit.o.ready.eq(dest_ready)]
        m.d.comb += serializer.o.ready.eq(rescale.i.ready)
        with m.If(serializer.o.valid & rescale.i.ready):
            m.d.sync += row_in.eq(row_in + serializer.o.payload.count)
        with m.If(mv_start):
            m.d.sync += [row_in.eq(0), row_out.eq(0)]

        ys = [unit.o.payload for unit in rescales]  # rescale(acc), clamped to int32 (the reference leaves it unsaturated)

        # LoRA: delta = round_shift((B t16)[row] * b_mult, b_shift), added before the output saturation.
        # Rows leave in order, so the delta of each is prefetched through two registers (B t16, then
        # the scaled and shifted delta) ahead of its row: the B read, the rank products, the multiply
        # by b_mult and the shift are then off the epilogue's path (they limited Fmax to 16 MHz on ECP5).
        delta = [Signal(signed(66), name=f"delta{e}") for e in range(wide)]
        if slots:  # per epilogue lane: lane e's delta is that of row prefetch_row + e of the beat
            b_words = [Signal(data.ArrayLayout(signed(8), rank), name=f"b_word{e}") for e in range(wide)]
            b_mult, b_shift = Signal(15), Signal(6)
            prefetch_row = Signal.like(row_out)  # the first row of the next beat whose B t16 is formed
            for ports in b_rd:
                m.d.comb += [port.addr.eq(prefetch_row + e) for e, port in enumerate(ports)]
            with m.Switch(lora_sel):
                for n, (ports, regs) in enumerate(zip(b_rd, lora_regs, strict=True)):
                    with m.Case(n):
                        m.d.comb += [b_mult.eq(regs["b_mult"]), b_shift.eq(regs["b_shift"])]
                        m.d.comb += [b_words[e].eq(port.data) for e, port in enumerate(ports)]
            low_full, delta_full = Signal(), Signal()  # stage 1 (B t16 of the beat ahead), stage 2 (its deltas)
            half = Mux(b_shift == 0, 0, Const(1, 1) << (b_shift - 1)[:6])
            consumed = Signal()
            m.d.comb += consumed.eq(rescale.o.valid & rescale.o.ready)
            move = Signal()
            m.d.comb += move.eq(low_full & (~delta_full | consumed))
            lows, low_regs, delta_regs = [], [], []  # per lane: B t16 now, stage 1, stage 2
            for e in range(wide):
                low = Signal(signed(8 + 16 + rank.bit_length() + 1), name=f"low{e}")
                m.d.comb += low.eq(sum(b_words[e][j] * t16[j] for j in range(rank)))
                lows.append(low)
                low_regs.append(Signal.like(low, name=f"low_reg{e}"))
                delta_regs.append(Signal.like(delta[e], name=f"delta_reg{e}"))
                m.d.comb += delta[e].eq(Mux(lora_on, delta_regs[e], 0))
            with m.If(mv_start):  # t16, lora_sel and the B scales are final when a projection starts
                m.d.sync += [prefetch_row.eq(0), low_full.eq(0), delta_full.eq(0)]
            with m.Else():
                with m.If(move):
                    m.d.sync += [delta_full.eq(1),
                                 *(d_reg.eq(((l_reg * b_mult) + half) >> b_shift)
                                   for d_reg, l_reg in zip(delta_regs, low_regs, strict=True))]
                with m.Elif(consumed):
                    m.d.sync += delta_full.eq(0)
                with m.If(~low_full | move):
                    m.d.sync += [low_full.eq(1), prefetch_row.eq(prefetch_row + step),
                                 *(l_reg.eq(low) for l_reg, low in zip(low_regs, lows, strict=True))]
        y8 = [Signal(signed(8), name=f"y8_{e}") for e in range(wide)]
        y16 = [Signal(signed(16), name=f"y16_{e}") for e in range(wide)]
        for e in range(wide):  # each lane adds its row's LoRA term
            y_sum = Signal(signed(68), name=f"y_sum{e}")
            m.d.comb += [y_sum.eq(ys[e] + delta[e]), y8[e].eq(saturate(y_sum, 8)),
                         y16[e].eq(saturate(y_sum, 16))]
        # a residual update (O, DOWN) streams each beat of new elements straight into the next norm unit as well
        resid_new = [Signal(signed(16), name=f"resid_new{e}") for e in range(wide)]
        resid_took, resid_beat = Signal(), Signal(range(wide + 1))
        norm_fused, norm_in_ready = Signal(), Signal(init=1)
        took = Signal()
        m.d.comb += took.eq(rescale.o.valid & dest_ready)
        with m.If(took):
            m.d.sync += row_out.eq(row_out + beat)
        gate_rd = _Reader(gate_vec, 0)
        with m.Switch(mv_mode):
            with m.Case(Mode.Q, Mode.K):
                m.d.comb += dest_ready.eq(1)
                for vec, mode in ((raw_q, Mode.Q), (raw_k, Mode.K)):
                    self._run_into(m, vec, row_out, y8, beat, took & (mv_mode == mode))
            with m.Case(Mode.V):  # transposed: row j of head g, column = position; a beat's channels in distinct banks
                m.d.comb += dest_ready.eq(1)
                self._beat_bank_write(m, v_wr, row_out, layer_sel * v_layer + (row_out // attn_rows) * c_ctx +
                                      position // lanes, position % lanes, y8, beat, took)
            with m.Case(Mode.RESID):
                m.d.comb += [dest_ready.eq(norm_in_ready), resid_rd.addr.eq(row_out), resid_took.eq(took),
                             resid_beat.eq(beat)]
                for e in range(wide):
                    m.d.comb += resid_new[e].eq(saturate(resid_rd.run[e] + y16[e], 16))
                self._run_into(m, resid, row_out, resid_new, beat, took)
            with m.Case(Mode.GATE):
                m.d.comb += dest_ready.eq(1)
                self._run_into(m, gate_vec, row_out, y8, beat, took)
            with m.Case(Mode.UP):  # every lane's unit takes its row (lanes past the beat compute what is not kept)
                m.d.comb += [gate_rd.addr.eq(row_out), dest_ready.eq(acts[0].i.ready)]
                for e, unit in enumerate(acts):
                    m.d.comb += unit.i.valid.eq(rescale.o.valid)
                    if gated:
                        m.d.comb += [unit.i.payload.gate.eq(gate_rd.run[e]), unit.i.payload.up.eq(y8[e])]
                    else:
                        m.d.comb += unit.i.payload.eq(y8[e])
            with m.Case(Mode.SCORES):  # beats of at most softmax.in_lanes (the serializer's groups of attention rows)
                m.d.comb += [softmax.i.valid.eq(rescale.o.valid), dest_ready.eq(softmax.i.ready),
                             softmax.i.payload.count.eq(beat), softmax.i.payload.last.eq(row_out + beat == mv_rows)]
                m.d.comb += [softmax.i.payload.scores[e].eq(ys[e]) for e in range(softmax.in_lanes)]
            with m.Case(Mode.PV):  # attention output of this head, element head*hd + j
                element = Signal(range(qdim))
                m.d.comb += [dest_ready.eq(1), element.eq(head * hd + row_out),
                             wr["act"].addr.eq(element // lanes),
                             wr["act"].en.eq(Mux(took, 1 << (element % lanes), 0))]
                m.d.comb += [wr["act"].data[j].eq(y8[0]) for j in range(lanes)]
            with m.Case(Mode.LORA_A):
                m.d.comb += dest_ready.eq(1)
                with m.If(took), m.Switch(row_out):
                    for j in range(rank):
                        with m.Case(j):
                            m.d.sync += t16[j].eq(y16[0])
            with m.Case(Mode.LOGITS):
                m.d.comb += [argmax.i.valid.eq(rescale.o.valid), dest_ready.eq(argmax.i.ready),
                             argmax.i.payload.count.eq(beat), argmax.i.payload.last.eq(row_out + beat == mv_rows)]
                m.d.comb += [argmax.i.payload.values[e].eq(ys[e]) for e in range(wide)]

        # the activation units' output: beats of hidden[o], in order
        hid_count = Signal(range(cfg.ffn + 1))
        for unit in acts:
            m.d.comb += unit.o.ready.eq(1)
        hid_valid, hid_beat = Signal(), Signal(range(wide + 1))
        m.d.comb += [hid_valid.eq(acts[0].o.valid),
                     hid_beat.eq(Mux(mv_rows - hid_count < step, mv_rows - hid_count, step))]
        write_run(m, wr["hid"], hid_count, [unit.o.payload for unit in acts], hid_beat, hid_valid, lanes)
        with m.If(hid_valid):
            m.d.sync += hid_count.eq(hid_count + hid_beat)
        with m.If(mv_start):
            m.d.sync += hid_count.eq(0)

        mv_done = Signal()
        m.d.comb += mv_done.eq(~issuing & ~pending & ~mv_start & (row_out == mv_rows) &
                               Mux(mv_mode == Mode.UP, hid_count == mv_rows, 1))

        # -- the schedule ----------------------------------------------------------------------------
        def start_mv(name_or_mode: str | Mode, *, rows: object, chunks: int, mode: Mode, src: Source,
                     code_base: object = 0, stride: int | None = None, act_base: object = 0) -> list:
            matrix = isinstance(name_or_mode, str)  # a weight matrix: `rows` rows per group from the banks
            group = self.rows if matrix else attn_rows if name_or_mode in (Mode.SCORES, Mode.PV) else 1
            groups = -(-rows // group) if isinstance(rows, int) else (rows + group - 1) // group
            stmts = [mv_start.eq(1), mv_mode.eq(mode), mv_src.eq(src), mv_rows.eq(rows), mv_chunks.eq(chunks),
                     mv_groups.eq(groups), mv_group.eq(group),
                     mv_code_base.eq(base_of[name_or_mode] if matrix else code_base),
                     mv_row_stride.eq(chunks if stride is None else stride),
                     mv_act_base.eq(act_base), mv_attn.eq(name_or_mode in (Mode.SCORES, Mode.PV)), lora_on.eq(0)]
            site = name_or_mode.rsplit(".", 1)[-1] if matrix else None
            wide_scores = name_or_mode == Mode.SCORES and score_beat(self.plan, cfg.head_dim) > 1
            stmts.append(mv_wide.eq(wide_scores or (matrix and epilogue_width(qm, self.plan, site) > 1)))
            if matrix:
                stmts += [mv_tensor.eq(list(linears).index(name_or_mode)), mv_format.eq(bank_of[name_or_mode])]
            return _Start(stmts, name_or_mode, chunks, src)

        # norm feeding: residual element i into the selected norm unit, outputs into act
        norm_words = -(-d // norm_unit.lanes)
        n_in, n_out = Signal(range(d + 1)), Signal(range(norm_words + 1))
        norm_sel = Signal(range(max(2, len(norm_sites))))
        norm_names = list(norm_sites)
        norm_done = Signal()
        norm_running = Signal()
        m.d.comb += norm_unit.site.eq(norm_sel)
        with m.If(norm_running):
            with m.If(norm_fused):  # fed by the residual update's epilogue, a beat per beat it writes
                m.d.comb += [norm_unit.i.valid.eq(resid_took), norm_unit.i.payload.count.eq(resid_beat),
                             norm_in_ready.eq(norm_unit.i.ready)]
                m.d.comb += [norm_unit.i.payload.values[e].eq(resid_new[e]) for e in range(wide)]
            with m.Else():  # fed from the residual memory
                m.d.comb += [norm_unit.i.valid.eq(n_in < d), norm_unit.i.payload.values[0].eq(resid_rd.data),
                             norm_unit.i.payload.count.eq(1)]
            m.d.comb += norm_unit.o.ready.eq(1)
            with m.If(norm_unit.i.valid & norm_unit.i.ready):
                m.d.sync += n_in.eq(n_in + norm_unit.i.payload.count)
            with m.If(norm_unit.o.valid):  # a word of vector_lanes elements into its lanes of an act word
                m.d.sync += n_out.eq(n_out + 1)
                self._lane_group_write(m, wr["act"], n_out, norm_unit.o.payload, lanes)
        m.d.comb += norm_done.eq(n_out == norm_words)

        # rope: pairs (head, i) from raw into q (rotated) or the K cache at this position
        pair_in, pair_out = Signal(range(qdim // 2 + 1)), Signal(range(qdim // 2 + 1))
        rope_is_k = Signal()
        rope_pairs = Signal(range(qdim // 2 + 1))
        rope_running = Signal()
        half = hd // 2
        if rope is not None:
            hi, ii = Signal(range(max(2, cfg.n_heads))), Signal(range(max(2, half)))
            m.d.comb += [hi.eq(pair_in // half), ii.eq(pair_in % half),
                         rq1.addr.eq(hi * hd + ii), rq2.addr.eq(hi * hd + ii + half),
                         rk1.addr.eq(hi * hd + ii), rk2.addr.eq(hi * hd + ii + half),
                         rope.i.valid.eq(rope_running & (pair_in < rope_pairs)),
                         rope.i.payload.x1.eq(Mux(rope_is_k, rk1.data, rq1.data)),
                         rope.i.payload.x2.eq(Mux(rope_is_k, rk2.data, rq2.data)),
                         rope.i.payload.pos.eq(position), rope.i.payload.pair.eq(ii)]
            with m.If(rope.i.valid & rope.i.ready):
                m.d.sync += pair_in.eq(pair_in + 1)
            # each result is two elements, hd/2 apart: write y1 now, y2 from a holding register next cycle
            ho, io = Signal(range(max(2, cfg.n_heads))), Signal(range(max(2, half)))
            second, second_el, second_val = Signal(), Signal(range(qdim)), Signal(signed(8))
            write_el, write_val, write_en = Signal(range(qdim)), Signal(signed(8)), Signal()
            m.d.comb += [ho.eq(pair_out // half), io.eq(pair_out % half), rope.o.ready.eq(~second)]
            with m.If(second):
                m.d.comb += [write_el.eq(second_el), write_val.eq(second_val), write_en.eq(1)]
                m.d.sync += second.eq(0)
            with m.Elif(rope.o.valid):
                m.d.comb += [write_el.eq(ho * hd + io), write_val.eq(rope.o.payload.y1), write_en.eq(1)]
                m.d.sync += [pair_out.eq(pair_out + 1), second.eq(1), second_el.eq(ho * hd + io + half),
                             second_val.eq(rope.o.payload.y2)]
            self._rope_writes(m, lanes, c_kv, rope_is_k, write_en, write_el, write_val, wr["qrot"], k_wr, layer_sel,
                              position)
            # the rotation runs beside the schedule (q during the K projection, k during V): it ends itself
            with m.If(rope_running & (pair_out == rope_pairs) & ~second):
                m.d.sync += rope_running.eq(0)
        else:
            second = Const(0)

        # -- token-level FSM -----------------------------------------------------------------------
        out_token, token_ready = Signal(self.token_bits), Signal()
        m.d.comb += [argmax.o.ready.eq(1)]
        with m.If(argmax.o.valid):
            m.d.sync += [out_token.eq(argmax.o.payload), token_ready.eq(1)]
        emb_i, emb_o = Signal(range(d + 1)), Signal(range(d + 1))
        emb_word = Signal(data.ArrayLayout(signed(8), lanes))
        emb_shift = Signal(5)

        with m.FSM(name="schedule") as fsm:
            self.fsm = fsm  # for testbenches and waveforms: the schedule state
            with m.State("IDLE"):
                m.d.comb += self.tokens.ready.eq(1)
                with m.If(self.tokens.valid):
                    m.d.sync += busy.eq(1)
                    new_pos = Mux(self.tokens.payload.new_seq, 0, position)
                    with m.If(self.tokens.payload.new_seq):
                        m.d.sync += [position.eq(0), context_full.eq(0), bad_token.eq(0)]
                    with m.If(self.tokens.payload.token >= cfg.vocab_size):
                        m.d.sync += [bad_token.eq(1), busy.eq(0)]
                    with m.Elif(new_pos >= ctx):
                        m.d.sync += [context_full.eq(1), busy.eq(0)]
                    with m.Else():
                        m.d.sync += [token.eq(self.tokens.payload.token), emb_i.eq(0), emb_o.eq(0),
                                     # the embedding's last pass loads the first norm as it writes the residual
                                     norm_running.eq(1), norm_sel.eq(norm_names.index("attn0")), n_in.eq(0),
                                     n_out.eq(0), norm_fused.eq(1)]
                        m.next = "EMBED_READ"
            self._embed_states(m, embed, embed_scale, emb_rescale, token, emb_i, emb_o, emb_word, emb_shift,
                               resid, resid_rd, d, "EMBED", "POS_READ" if pos_store is not None else "L0_NORM_ATTN",
                               position=None, to_norm=None if pos_store is not None else
                               (resid_new[0], resid_took, resid_beat))
            if pos_store is not None:
                self._embed_states(m, pos_store, pos_scale, emb_rescale, position, emb_i, emb_o, emb_word, emb_shift,
                                   resid, resid_rd, d, "POS", "L0_NORM_ATTN", position=True,
                                   to_norm=(resid_new[0], resid_took, resid_beat))

            def norm_state(name: str, key: str, nxt: str) -> None:
                with m.State(name):
                    with m.If(~norm_running):
                        m.d.sync += [norm_running.eq(1), norm_sel.eq(norm_names.index(key)), n_in.eq(0), n_out.eq(0)]
                    with m.Elif(norm_done):
                        m.d.sync += [norm_running.eq(0), norm_fused.eq(0)]
                        m.next = nxt
                    m.d.comb += resid_rd.addr.eq(n_in)

            slot_of = {f"layers.{s.layer}.{s.site}": n for n, s in enumerate(slots)}

            def feeding_norm(start: _Start, key: str) -> _Start:
                """A residual update that also loads the norm unit `key`: its norm state then only drains it."""
                return _Start([*start, norm_running.eq(1), norm_sel.eq(norm_names.index(key)), n_in.eq(0),
                               n_out.eq(0), norm_fused.eq(1)], start.tensor, start.chunks, start.src)

            def mv_state(name: str, nxt: str, start: _Start) -> None:
                if start.tensor in slot_of:  # adapted: first t16 = rescale(A a), then the projection plus B t16
                    with m.State(name):
                        m.d.sync += [*start_mv(Mode.LORA_A, rows=rank, chunks=start.chunks, mode=Mode.LORA_A,
                                               src=start.src), lora_sel.eq(slot_of[start.tensor])]
                        m.next = name + "_LORA_A_WAIT"
                    with m.State(name + "_LORA_A_WAIT"), m.If(mv_done):
                        m.next = name + "_MAIN"
                    name = name + "_MAIN"
                    start = _Start([*start, lora_on.eq(1)], start.tensor, start.chunks, start.src)
                with m.State(name):
                    m.d.sync += start
                    m.next = name + "_WAIT"
                with m.State(name + "_WAIT"), m.If(mv_done):
                    m.next = nxt

            def rope_state(name: str, is_k: bool, pairs: int, nxt: str) -> None:
                """Start a rotation once the previous one has ended, and go on while it runs."""
                with m.State(name), m.If(~rope_running):
                    m.d.sync += [rope_running.eq(1), rope_is_k.eq(is_k), rope_pairs.eq(pairs), pair_in.eq(0),
                                 pair_out.eq(0)]
                    m.next = nxt

            for i in range(cfg.n_layers):
                n = f"layers.{i}"
                nxt_layer = f"L{i + 1}_NORM_ATTN" if i + 1 < cfg.n_layers else "FINAL_NORM"
                with m.State(f"L{i}_NORM_ATTN"):
                    m.d.sync += layer_sel.eq(i)
                    m.next = f"L{i}_NORM_ATTN_RUN"
                norm_state(f"L{i}_NORM_ATTN_RUN", f"attn{i}", f"L{i}_Q")
                c_d = self.chunks(d)
                if rope is not None:
                    mv_state(f"L{i}_Q", f"L{i}_ROPE_Q", start_mv(f"{n}.q", rows=qdim, chunks=c_d, mode=Mode.Q,
                                                                 src=Source.ACT))
                    rope_state(f"L{i}_ROPE_Q", False, qdim // 2, f"L{i}_K")
                    mv_state(f"L{i}_K", f"L{i}_ROPE_K", start_mv(f"{n}.k", rows=kvdim, chunks=c_d, mode=Mode.K,
                                                                 src=Source.ACT))
                    rope_state(f"L{i}_ROPE_K", True, kvdim // 2, f"L{i}_V")
                else:
                    mv_state(f"L{i}_Q", f"L{i}_COPY_Q", start_mv(f"{n}.q", rows=qdim, chunks=c_d, mode=Mode.Q,
                                                                 src=Source.ACT))
                    self._copy_state(m, f"L{i}_COPY_Q", f"L{i}_K", qdim, rq1, wr["qrot"], None, lanes, c_kv,
                                     layer_sel, position)
                    mv_state(f"L{i}_K", f"L{i}_COPY_K", start_mv(f"{n}.k", rows=kvdim, chunks=c_d, mode=Mode.K,
                                                                 src=Source.ACT))
                    self._copy_state(m, f"L{i}_COPY_K", f"L{i}_V", kvdim, rk1, None, k_wr, lanes, c_kv,
                                     layer_sel, position)
                mv_state(f"L{i}_V", f"L{i}_ROPE_WAIT", start_mv(f"{n}.v", rows=kvdim, chunks=c_d, mode=Mode.V,
                                                                src=Source.ACT))
                with m.State(f"L{i}_ROPE_WAIT"), m.If(~rope_running):  # q and this position's k are in place
                    m.next = f"L{i}_H0_SCORES"
                for h in range(cfg.n_heads):
                    g = h // group
                    with m.State(f"L{i}_H{h}_SCORES"):
                        m.d.sync += head.eq(h)
                        m.d.sync += start_mv(Mode.SCORES, rows=position + 1, chunks=hd // lanes, mode=Mode.SCORES,
                                             src=Source.Q, code_base=i * k_layer + (g * hd) // lanes, stride=c_kv,
                                             act_base=(h * hd) // lanes)
                        m.next = f"L{i}_H{h}_SCORES_WAIT"
                    with m.State(f"L{i}_H{h}_SCORES_WAIT"), m.If(mv_done):
                        m.next = f"L{i}_H{h}_SOFTMAX"
                    self._softmax_state(m, f"L{i}_H{h}_SOFTMAX", f"L{i}_H{h}_PV", softmax, wr["probs"], lanes)
                    nxt = f"L{i}_H{h + 1}_SCORES" if h + 1 < cfg.n_heads else f"L{i}_O"
                    with m.State(f"L{i}_H{h}_PV"):
                        m.d.sync += start_mv(Mode.PV, rows=hd, chunks=(position + lanes) // lanes, mode=Mode.PV,
                                             src=Source.PROBS, code_base=i * v_layer + g * hd // attn_rows * c_ctx,
                                             stride=c_ctx)
                        m.next = f"L{i}_H{h}_PV_WAIT"
                    with m.State(f"L{i}_H{h}_PV_WAIT"), m.If(mv_done):
                        m.next = nxt
                mv_state(f"L{i}_O", f"L{i}_NORM_MLP", feeding_norm(start_mv(f"{n}.o", rows=d, chunks=self.chunks(qdim),
                                                                            mode=Mode.RESID, src=Source.ACT), f"mlp{i}"))
                norm_state(f"L{i}_NORM_MLP", f"mlp{i}", f"L{i}_GATE" if gated else f"L{i}_UP")
                if gated:
                    mv_state(f"L{i}_GATE", f"L{i}_UP", start_mv(f"{n}.gate", rows=cfg.ffn, chunks=c_d, mode=Mode.GATE,
                                                                src=Source.ACT))
                mv_state(f"L{i}_UP", f"L{i}_DOWN", start_mv(f"{n}.up", rows=cfg.ffn, chunks=c_d, mode=Mode.UP,
                                                            src=Source.ACT))
                mv_state(f"L{i}_DOWN", nxt_layer, feeding_norm(start_mv(f"{n}.down", rows=d, chunks=self.chunks(cfg.ffn),
                                                                        mode=Mode.RESID, src=Source.HID),
                                                               f"attn{i + 1}" if i + 1 < cfg.n_layers else "final"))
            norm_state("FINAL_NORM", "final", "HEAD")
            mv_state("HEAD", "ARGMAX", start_mv("head", rows=cfg.vocab_size, chunks=self.chunks(d), mode=Mode.LOGITS,
                                                src=Source.ACT))
            with m.State("ARGMAX"), m.If(token_ready):
                m.d.sync += token_ready.eq(0)
                m.next = "EMIT"
            with m.State("EMIT"):
                m.d.comb += [self.out.valid.eq(1), self.out.payload.eq(out_token)]
                with m.If(self.out.ready):
                    m.d.sync += [position.eq(position + 1), tokens_done.eq(tokens_done + 1), busy.eq(0)]
                    m.next = "IDLE"
        return m

    # -- pieces of the schedule ------------------------------------------------------------------

    @staticmethod
    def _param_rom(m: Module, name: str, lin: QLinear, acc_bits: int, wide: int) -> object:
        """Each row's (bias, mult, shift), in words of `wide` rows (the padding rows' constants are never used)."""
        layout = data.StructLayout({"bias": signed(acc_bits), "mult": unsigned(15), "shift": unsigned(6)})
        rows = [{"bias": int(b), "mult": int(mu), "shift": int(s)}
                for b, mu, s in zip(lin.bias.tolist(), lin.mult.tolist(), lin.shift.tolist(), strict=True)]
        rows += [rows[-1]] * (-len(rows) % wide)
        init = [rows[k:k + wide] for k in range(0, len(rows), wide)]
        m.submodules[name] = rom = Memory(shape=data.ArrayLayout(layout, wide), depth=len(init), init=init)
        return rom.read_port(domain="comb")

    @staticmethod
    def _scale_rom(m: Module, name: str, mults: list[int], shifts: list[int]) -> object:
        layout = data.StructLayout({"mult": unsigned(15), "shift": unsigned(6)})
        init = [{"mult": int(a), "shift": int(b)} for a, b in zip(mults, shifts, strict=True)]
        m.submodules[name] = rom = Memory(shape=layout, depth=len(init), init=init)
        return rom.read_port(domain="comb")

    def _embed_states(self, m: Module, store: WeightStore, scale: object, rescale: Rescale, row: Signal,
                      emb_i: Signal, emb_o: Signal, word: Signal, word_shift: Signal, resid: BankedVector,
                      resid_rd: object, d: int, prefix: str, nxt: str, position: object,
                      to_norm: tuple[Signal, Signal, Signal] | None) -> None:
        """Row `row` of a table into the residual: rescale(code << shift, mult[row], shift[row]).

        The token embedding writes the residual; learned positions (position=True) add to it. The last of
        these passes also hands each element written to the first norm unit (to_norm: its value, its strobe).
        """
        lanes = self.lanes
        chunks = self.chunks(d)
        lane = Signal(range(lanes + 1), name=f"{prefix.lower()}_lane")
        with m.State(f"{prefix}_READ"):
            m.d.comb += [store.addr.eq(row * chunks + emb_i // lanes), store.en.eq(1)]
            m.d.sync += lane.eq(0)
            m.next = f"{prefix}_FEED"
        with m.State(f"{prefix}_FEED"):
            m.d.comb += [scale.addr.eq(row), rescale.o.ready.eq(1)]
            value = Signal(signed(8 + 24 + 1), name=f"{prefix.lower()}_value")
            m.d.comb += value.eq(store.codes[lane] << store.shift)
            m.d.comb += [rescale.i.valid.eq((lane < lanes) & (emb_i < d)), rescale.i.payload.value.eq(value),
                         rescale.i.payload.mult.eq(scale.data.mult), rescale.i.payload.shift.eq(scale.data.shift)]
            with m.If(rescale.i.valid & rescale.i.ready):
                m.d.sync += [lane.eq(lane + 1), emb_i.eq(emb_i + 1)]
            with m.If(rescale.o.valid):
                m.d.sync += emb_o.eq(emb_o + 1)
                written = Signal(signed(16), name=f"{prefix.lower()}_written")
                if position:
                    total = Signal(signed(18), name=f"{prefix.lower()}_sum")
                    m.d.comb += [resid_rd.addr.eq(emb_o), total.eq(resid_rd.data + rescale.o.payload),
                                 written.eq(saturate(total, 16))]
                else:
                    m.d.comb += written.eq(rescale.o.payload)
                m.d.comb += [resid.wr_base.eq(emb_o), resid.wr_values[0].eq(written), resid.wr_count.eq(1),
                             resid.wr_en.eq(1)]
                if to_norm is not None:  # one element per beat
                    m.d.comb += [to_norm[0].eq(written), to_norm[1].eq(1), to_norm[2].eq(1)]
            with m.If(emb_o == d):
                m.d.sync += [emb_i.eq(0), emb_o.eq(0)]
                m.next = nxt
            with m.Elif((lane == lanes) & (emb_i < d)):  # word used up: the rescale keeps what is in flight
                m.next = f"{prefix}_READ"

    @staticmethod
    def _run_into(m: Module, vector: BankedVector, base: object, values: list, count: object, en: object) -> None:
        """Elements base .. base + count - 1 of `vector` from values[0..count)."""
        m.d.comb += [vector.wr_base.eq(base), vector.wr_count.eq(count), vector.wr_en.eq(en)]
        m.d.comb += [vector.wr_values[e].eq(values[e]) for e in range(len(values))]

    @staticmethod
    def _beat_bank_write(m: Module, ports: list, first: object, addr: object, lane: object, values: list,
                         count: object, en: object) -> None:
        """Elements first .. first + count - 1 into lane `lane` of word `addr` of banks first % len(ports) on: a beat
        of at most len(ports) elements that starts at a multiple of its width, so it lies in one word of each bank."""
        banks = len(ports)
        bits = (banks - 1).bit_length()
        for b, port in enumerate(ports):
            e = Signal(range(max(2, banks)), name=f"beat_lane{b}")  # the beat's element that bank b takes
            m.d.comb += e.eq((b + banks - first[:bits])[:bits] if banks > 1 else 0)
            value = values[0]
            for k in range(1, min(banks, len(values))):
                value = Mux(e == k, values[k], value)
            m.d.comb += [port.addr.eq(addr), port.en.eq(Mux(en & (e < count), 1 << lane, 0))]
            m.d.comb += [port.data[j].eq(value) for j in range(len(port.data))]

    def _k_write(self, m: Module, k_wr: list, layer_sel: Signal, position: Signal, el: object, val: object,
                 en: object, c_kv: int) -> None:
        """One element of k (after RoPE) into this layer's K cache at `position` (bank position % attn_rows)."""
        k_layer = kv_layer_words(self.qm, self.plan)[0]
        self._beat_bank_write(m, k_wr, position, layer_sel * k_layer + (position // self.attn_rows) * c_kv +
                              el // self.lanes, el % self.lanes, [val], 1, en)

    def _rope_writes(self, m: Module, lanes: int, c_kv: int, is_k: Signal, en: Signal, el: Signal, val: Signal,
                     q_wr: object, k_wr: list, layer_sel: Signal, position: Signal) -> None:
        """One rotated element into q (act layout) or this layer's K cache row at `position`."""
        with m.If(~is_k):
            m.d.comb += [q_wr.addr.eq(el // lanes), q_wr.en.eq(Mux(en, 1 << (el % lanes), 0))]
            m.d.comb += [q_wr.data[j].eq(val) for j in range(lanes)]
        with m.Else():
            self._k_write(m, k_wr, layer_sel, position, el, val, en, c_kv)

    def _copy_state(self, m: Module, name: str, nxt: str, count: int, raw_rd: object, q_wr: object | None,
                    k_wr: list | None, lanes: int, c_kv: int, layer_sel: Signal, position: Signal) -> None:
        """Learned positions: q and k need no rotation, only moving from raw_q / raw_k into place."""
        index = Signal(range(count + 1), name=f"{name.lower()}_index")
        with m.State(name):
            m.d.comb += raw_rd.addr.eq(index)
            with m.If(index == count):
                m.d.sync += index.eq(0)
                m.next = nxt
            with m.Else():
                m.d.sync += index.eq(index + 1)
                if q_wr is not None:
                    m.d.comb += [q_wr.addr.eq(index // lanes), q_wr.en.eq(1 << (index % lanes))]
                    m.d.comb += [q_wr.data[j].eq(raw_rd.data) for j in range(lanes)]
                else:
                    self._k_write(m, k_wr, layer_sel, position, index, raw_rd.data, 1, c_kv)

    @staticmethod
    def _lane_group_write(m: Module, port: object, index: object, values: object, lanes: int,
                          clear_above: object = 0) -> None:
        """Word `index` of len(values)-element words into its lanes of a `lanes`-wide memory (len(values) divides
        lanes); with `clear_above` high, the lanes above the group are written 0 too."""
        width = len(values)
        first = index * width  # the element in the group's first lane
        m.d.comb += port.addr.eq(first // lanes)
        with m.Switch(first % lanes if width < lanes else 0):
            for offset in range(0, lanes, width):
                with m.Case(offset):
                    ours = ((1 << width) - 1) << offset
                    m.d.comb += port.en.eq(Mux(clear_above, ((1 << lanes) - 1) & ~((1 << offset) - 1), ours))
                    m.d.comb += [port.data[j].eq(values[j - offset] if offset <= j < offset + width else 0)
                                 for j in range(lanes)]

    def _softmax_state(self, m: Module, name: str, nxt: str, sm: Softmax, probs_wr: object, lanes: int) -> None:
        """Words of probabilities of one head into `probs` (softmax_lanes divides lanes); the lanes of the last
        word past the row's end are written 0, so that the weighted sum never reads a stale probability."""
        width = sm.lanes
        k = Signal(range(self.plan.chunks(self.qm.context) * lanes // width + 1), name=f"{name.lower()}_k")
        with m.State(name):
            m.d.comb += sm.o.ready.eq(1)
            with m.If(sm.o.valid):
                self._lane_group_write(m, probs_wr, k, sm.o.payload.probs, lanes, clear_above=sm.o.payload.last)
                m.d.sync += k.eq(k + 1)
                with m.If(sm.o.payload.last):
                    m.d.sync += k.eq(0)
                    m.next = nxt

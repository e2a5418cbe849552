"""The decoder's schedule: one FSM whose states a Python loop over the QModel unrolls.

IDLE takes a token; the embedding (and learned positions) fill the residual; each layer runs its
norm, Q / K / V with the rotation beside them, each head's scores, softmax and weighted sum, then
O, the MLP norm, gate / up and down; the final norm, the head and the argmax end the token. The
order and the cycles of every step are rtl/plan.py's schedule (a test holds them equal).
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import stream

from ..quant.qmodel import QModel
from .datapath import Dims, Mode, MvStart, Source
from .decoder_control import Control
from .decoder_engine import Product
from .decoder_epilogue import Epilogue
from .decoder_memories import Buffers, KvCache, Vectors, Weights
from .decoder_residual import post_add_states, residual_element
from .decoder_residual import to_norm as residual_to_norm
from .decoder_side import HeadNormDriver, NormFeeder, NormLink, RopeDriver, k_write, q_write
from .decoder_units import Units
from .lora_bank import LoraBank
from .plan import RESID_STAGE
from .rescale import saturate
from .word_runs import lane_group_write


@dataclass(frozen=True)
class ScheduleIn:
    """What the schedule drives and waits for: the other stages' controls, and what its own states use."""

    qm: QModel
    dims: Dims
    tokens: stream.Interface  # the component's ports: a token in, the next one out
    out: stream.Interface
    resid_in: stream.Interface | None  # a chain's board: the residual from the board before, to the board after
    resid_out: stream.Interface | None
    control: Control  # the token's registers, which it sets
    product: Product  # starts products ...
    epilogue: Epilogue  # ... and waits for them (mv_done)
    feeder: NormFeeder  # starts norms and waits for them
    rope: RopeDriver  # starts rotations and waits for them
    link: NormLink  # the embedding hands its elements to the first norm
    weights: Weights  # the embedding tables
    units: Units  # the embedding's rescale, the softmax's output, the argmax's answer
    buffers: Buffers  # probabilities into probs, q copied into qrot
    kv: KvCache  # each layer's place; k copied into the K cache
    vectors: Vectors  # the residual the embedding writes; raw q and k, copied
    lora: LoraBank  # the adapter slots (an adapted projection runs LoRA A first)
    head_norm: HeadNormDriver  # starts a per-head q/k norm and waits for it


def build_schedule(m: Module, s: ScheduleIn) -> object:
    """The token-level FSM (-> it, for testbenches: the schedule state)."""
    cfg, ctl = s.qm.config, s.control
    m.d.comb += s.units.argmax.o.ready.eq(1)
    with m.If(s.units.argmax.o.valid):
        m.d.sync += [ctl.out_token.eq(s.units.argmax.o.payload), ctl.token_ready.eq(1)]
    with m.FSM(name="schedule") as fsm:
        to_norm = residual_to_norm(s.link)
        if s.qm.has_embedding:
            _idle_state(m, s)
            learned = s.weights.pos_store is not None
            _embed_states(m, s, s.weights.embed, s.weights.embed_scale, ctl.token, "EMBED",
                          "POS_READ" if learned else "L0_START", add=False, to_norm=None if learned else to_norm)
            if learned:
                _embed_states(m, s, s.weights.pos_store, s.weights.pos_scale, ctl.position, "POS", "L0_START",
                              add=True, to_norm=to_norm)
        else:
            _receive_states(m, s, to_norm)
        for i in range(cfg.n_layers):
            with m.State(f"L{i}_START"):  # this position's K and V go to its slot of the ring (windowed), else to it
                window = ctl.windows[i]
                m.d.sync += [ctl.layer_sel.eq(i), ctl.kv_slot.eq(ctl.position if window is None else ctl.ring[window])]
                m.next = f"L{i}_NORM_MLP_RUN" if cfg.parallel_residual else f"L{i}_NORM_ATTN_RUN"
            if cfg.parallel_residual:
                _parallel_mlp_states(m, s, i)
            _attention_states(m, s, i)
            for h in range(cfg.n_heads):
                _head_states(m, s, i, h)
            _mlp_states(m, s, i)
        if not s.qm.has_head:
            _send_states(m, s)
            return fsm
        _norm_state(m, s, "FINAL_NORM", "final", "HEAD")
        _mv_state(m, s, "HEAD", "ARGMAX", s.product.start("head", rows=cfg.vocab_size, chunks=s.dims.chunks(s.dims.d),
                                                         mode=Mode.LOGITS, src=Source.ACT))
        with m.State("ARGMAX"), m.If(ctl.token_ready):
            m.d.sync += ctl.token_ready.eq(0)
            m.next = "EMIT"
        with m.State("EMIT"):
            m.d.comb += [s.out.valid.eq(1), s.out.payload.eq(ctl.out_token)]
            with m.If(s.out.ready):
                _token_done(m, ctl)
                m.next = "IDLE"
    return fsm


def _token_done(m: Module, ctl: Control) -> None:
    """The token has left: the next position (its ring slots), one more token, not busy."""
    m.d.sync += [ctl.position.eq(ctl.position + 1), ctl.tokens_done.eq(ctl.tokens_done + 1), ctl.busy.eq(0)]
    m.d.sync += [slot.eq(Mux(slot == w - 1, 0, slot + 1)) for w, slot in ctl.ring.items()]  # p + 1 mod w


def _receive_states(m: Module, s: ScheduleIn, to_norm: tuple[Signal, Signal, Signal]) -> None:
    """A chain's later board: the residual from the board before, an element a cycle, into the residual memory and
    the first norm unit (as the embedding loads it); its first element says whether a sequence starts."""
    ctl, resid_in, d = s.control, s.resid_in, s.dims.d
    index = ctl.emb_o
    with m.State("IDLE"), m.If(resid_in.valid):
        m.d.sync += [ctl.busy.eq(1), index.eq(0), *s.feeder.start(first_norm(s.qm, 0)), s.feeder.fused.eq(1)]
        with m.If(resid_in.payload.new_seq):
            m.d.sync += [ctl.position.eq(0), *(slot.eq(0) for slot in ctl.ring.values())]
        m.next = "RECEIVE"
    with m.State("RECEIVE"):
        m.d.comb += resid_in.ready.eq(s.link.ready)
        with m.If(resid_in.valid & s.link.ready):
            residual_element(m, s.vectors, index, resid_in.payload.value, to_norm)
            m.d.sync += index.eq(index + 1)
            with m.If(index == d - 1):
                m.d.sync += index.eq(0)
                m.next = "L0_START"


def _send_states(m: Module, s: ScheduleIn) -> None:
    """A chain's earlier board: after its last layer, the residual to the board after, an element a cycle (read as
    the residual update's registers have written it: SEND_SETTLE waits for them)."""
    ctl, out, d = s.control, s.resid_out, s.dims.d
    index = ctl.emb_o
    settle = Signal(range(RESID_STAGE + 1), name="send_settle")
    with m.State("SEND_SETTLE"):
        m.d.sync += settle.eq(settle + 1)
        with m.If(settle == RESID_STAGE - 1):
            m.d.sync += [settle.eq(0), index.eq(0)]
            m.next = "SEND"
    with m.State("SEND"):
        m.d.comb += [s.vectors.resid_rd.addr.eq(index), out.valid.eq(1), out.payload.value.eq(s.vectors.resid_rd.data),
                     out.payload.new_seq.eq(ctl.position == 0)]
        with m.If(out.ready):
            m.d.sync += index.eq(index + 1)
            with m.If(index == d - 1):
                m.d.sync += index.eq(0)
                _token_done(m, ctl)
                m.next = "IDLE"


def _idle_state(m: Module, s: ScheduleIn) -> None:
    """Take a token (a new sequence resets the position and the flags); refuse one out of range or past the
    context with a sticky flag, else start the embedding, whose last pass loads the first norm."""
    tokens, ctl = s.tokens, s.control
    with m.State("IDLE"):
        m.d.comb += tokens.ready.eq(1)
        with m.If(tokens.valid):
            m.d.sync += ctl.busy.eq(1)
            new_pos = Mux(tokens.payload.new_seq, 0, ctl.position)
            with m.If(tokens.payload.new_seq):
                m.d.sync += [ctl.position.eq(0), ctl.context_full.eq(0), ctl.bad_token.eq(0)]
                m.d.sync += [slot.eq(0) for slot in ctl.ring.values()]
            with m.If(tokens.payload.token >= s.qm.config.vocab_size):
                m.d.sync += [ctl.bad_token.eq(1), ctl.busy.eq(0)]
            with m.Elif(new_pos >= s.dims.ctx):
                m.d.sync += [ctl.context_full.eq(1), ctl.busy.eq(0)]
            with m.Else():
                m.d.sync += [ctl.token.eq(tokens.payload.token), ctl.emb_i.eq(0), ctl.emb_o.eq(0),
                             *s.feeder.start(first_norm(s.qm, 0)), s.feeder.fused.eq(1)]
                m.next = "EMBED_READ"


def first_norm(qm: QModel, i: int) -> str:
    """The norm site a residual update into layer i loads: the attention's, or a parallel block's MLP norm (its
    attention norm then runs from the residual memory: both read the block's input)."""
    cfg = qm.config
    return f"mlp{i}" if cfg.parallel_residual and not cfg.shared_norm else f"attn{i}"


def _parallel_mlp_states(m: Module, s: ScheduleIn, i: int) -> None:
    """A parallel block's MLP before its attention: the MLP norm, gate / up into the hidden buffer, which
    attention leaves alone; DOWN runs after O. With one shared norm, the attention reads the same activations,
    which gate and up leave in place; with two, the attention norm then reads the residual, still the block's
    input. The sums are the reference's: saturate(saturate(x + o) + down)."""
    _norm_state(m, s, f"L{i}_NORM_MLP_RUN", first_norm(s.qm, i), f"L{i}_GATE" if s.dims.gated else f"L{i}_UP")
    _gate_up_states(m, s, i, f"L{i}_Q" if s.qm.config.shared_norm else f"L{i}_NORM_ATTN_RUN")


def _gate_up_states(m: Module, s: ScheduleIn, i: int, nxt: str) -> None:
    """Layer i's gate (gated MLPs) and up projections from the act buffer into the hidden buffer, then `nxt`."""
    n, ffn, c_d = f"layers.{i}", s.qm.config.ffn, s.dims.chunks(s.dims.d)
    if s.dims.gated:
        gate = s.product.start(f"{n}.gate", rows=ffn, chunks=c_d, mode=Mode.GATE, src=Source.ACT)
        _mv_state(m, s, f"L{i}_GATE", f"L{i}_UP", gate)
    _mv_state(m, s, f"L{i}_UP", nxt, s.product.start(f"{n}.up", rows=ffn, chunks=c_d, mode=Mode.UP, src=Source.ACT))


def _attention_states(m: Module, s: ScheduleIn, i: int) -> None:
    """Layer i up to its heads: the norm (unless a shared one ran), Q, K and V, with q and k rotated (or copied)
    into place."""
    n, c_d = f"layers.{i}", s.dims.chunks(s.dims.d)
    if not s.qm.config.shared_norm:
        _norm_state(m, s, f"L{i}_NORM_ATTN_RUN", f"attn{i}", f"L{i}_Q")
    q = s.product.start(f"{n}.q", rows=s.dims.qdim, chunks=c_d, mode=Mode.Q, src=Source.ACT)
    k = s.product.start(f"{n}.k", rows=s.dims.kvdim, chunks=c_d, mode=Mode.K, src=Source.ACT)
    rope = s.units.rope is not None
    for part, start, count, nxt in (("Q", q, s.dims.qdim, f"L{i}_K"), ("K", k, s.dims.kvdim, f"L{i}_V")):
        place = f"L{i}_{'ROPE' if rope else 'COPY'}_{part}"  # rotated (or copied) into place
        if s.units.head_norm is not None:  # each head of raw q (raw k) normalised in place first
            _mv_state(m, s, f"L{i}_{part}", f"L{i}_{part}_NORM", start)
            _head_norm_state(m, s, f"L{i}_{part}_NORM", i, part == "K", count, place)
        else:
            _mv_state(m, s, f"L{i}_{part}", place, start)
        if rope:
            _rope_state(m, s, place, part == "K", count // 2, nxt)
        else:
            _copy_state(m, s, place, nxt, count, is_k=part == "K")
    v = s.product.start(f"{n}.v", rows=s.dims.kvdim, chunks=c_d, mode=Mode.V, src=Source.ACT)
    _mv_state(m, s, f"L{i}_V", f"L{i}_ROPE_WAIT", v)
    with m.State(f"L{i}_ROPE_WAIT"), m.If(~s.rope.running):  # q and this position's k are in place
        m.next = f"L{i}_H0_SCORES"


def _head_states(m: Module, s: ScheduleIn, i: int, h: int) -> None:
    """Head h of layer i: scores over the positions so far, softmax, weighted sum of V into the act buffer.

    A windowed layer (window w) runs them over the min(position + 1, w) slots of its ring, in slot order: the
    softmax and the weighted sum are sums over the keys, the same in any order."""
    hd, lanes, window, position = s.dims.hd, s.dims.lanes, s.control.windows[i], s.control.position
    g = h // (s.qm.config.n_heads // s.qm.config.n_kv_heads)
    keys = position + 1 if window is None else Mux(position < window, position + 1, window)
    words = (keys + lanes - 1) // lanes  # of probabilities: the weighted sum's chunks
    with m.State(f"L{i}_H{h}_SCORES"):
        m.d.sync += s.control.head.eq(h)
        m.d.sync += s.product.start(Mode.SCORES, rows=keys, chunks=hd // lanes, mode=Mode.SCORES, src=Source.Q,
                                    code_base=i * s.kv.k_layer + (g * hd) // lanes, stride=s.dims.c_kv,
                                    act_base=(h * hd) // lanes)
        m.next = f"L{i}_H{h}_SCORES_WAIT"
    with m.State(f"L{i}_H{h}_SCORES_WAIT"), m.If(s.epilogue.mv_done):
        m.next = f"L{i}_H{h}_SOFTMAX"
    _softmax_state(m, s, f"L{i}_H{h}_SOFTMAX", f"L{i}_H{h}_PV")
    nxt = f"L{i}_H{h + 1}_SCORES" if h + 1 < s.qm.config.n_heads else f"L{i}_O"
    with m.State(f"L{i}_H{h}_PV"):
        m.d.sync += s.product.start(Mode.PV, rows=hd, chunks=words, mode=Mode.PV, src=Source.PROBS,
                                    code_base=i * s.kv.v_layer + g * hd // s.dims.attn_rows * s.dims.c_ctx,
                                    stride=s.dims.c_ctx)
        m.next = f"L{i}_H{h}_PV_WAIT"
    with m.State(f"L{i}_H{h}_PV_WAIT"), m.If(s.epilogue.mv_done):
        m.next = nxt


def _mlp_states(m: Module, s: ScheduleIn, i: int) -> None:
    """Layer i after its heads: O into the residual (loading the MLP norm), the norm, gate / up, down (loading the
    next layer's first norm, or the final one). A parallel block ran its norm, gate and up before the attention:
    O only adds. With post-sublayer norms (Gemma 2, 3) O and DOWN load their own norm instead, whose output is then
    added to the residual, loading the next norm."""
    n, cfg = f"layers.{i}", s.qm.config
    nxt_layer = f"L{i + 1}_START" if i + 1 < cfg.n_layers else "FINAL_NORM" if s.qm.has_head else "SEND_SETTLE"
    nxt_norm = first_norm(s.qm, i + 1) if i + 1 < cfg.n_layers else "final" if s.qm.has_head else None
    post = s.qm.layers[i].post_attn_norm is not None
    mode = Mode.POST if post else Mode.RESID
    o = s.product.start(f"{n}.o", rows=s.dims.d, chunks=s.dims.chunks(s.dims.qdim), mode=mode, src=Source.ACT)
    down = s.product.start(f"{n}.down", rows=s.dims.d, chunks=s.dims.chunks(cfg.ffn), mode=mode, src=Source.HID)
    mlp = f"L{i}_GATE" if s.dims.gated else f"L{i}_UP"
    if cfg.parallel_residual:
        _mv_state(m, s, f"L{i}_O", f"L{i}_DOWN", o)
    elif post:
        _post_states(m, s, f"L{i}_O", o, f"post_attn{i}", f"L{i}_NORM_MLP", f"mlp{i}")
    else:
        _mv_state(m, s, f"L{i}_O", f"L{i}_NORM_MLP", _feeding_norm(s, o, f"mlp{i}"))
    if not cfg.parallel_residual:
        _norm_state(m, s, f"L{i}_NORM_MLP", f"mlp{i}", mlp)
        _gate_up_states(m, s, i, f"L{i}_DOWN")
    if post:
        _post_states(m, s, f"L{i}_DOWN", down, f"post_mlp{i}", nxt_layer, nxt_norm)
        return
    if nxt_norm is not None:
        down = _feeding_norm(s, down, nxt_norm)
    _mv_state(m, s, f"L{i}_DOWN", nxt_layer, down)


def _post_states(m: Module, s: ScheduleIn, name: str, start: MvStart, site: str, nxt: str, nxt_norm: str | None) -> None:
    """A product (O or DOWN) through its post-sublayer norm into the residual: the product loads norm `site`, which
    writes the activation buffer; the add then writes the residual and loads `nxt_norm` (none on a chain's earlier
    board), and `nxt` follows."""
    _mv_state(m, s, name, f"{name}_POST_NORM", _feeding_norm(s, start, site))
    _norm_state(m, s, f"{name}_POST_NORM", site, f"{name}_POST_ADD")
    post_add_states(m, f"{name}_POST_ADD", nxt, dims=s.dims, vectors=s.vectors, buffers=s.buffers, link=s.link,
                    index=s.control.emb_o, start_norm=[*s.feeder.start(nxt_norm), s.feeder.fused.eq(1)] if nxt_norm
                    else [], loads_norm=nxt_norm is not None)


def _norm_state(m: Module, s: ScheduleIn, name: str, key: str, nxt: str) -> None:
    """Run norm site `key` from the residual memory, or drain it when a residual update has loaded it."""
    with m.State(name):
        with m.If(~s.feeder.running):
            m.d.sync += s.feeder.start(key)
        with m.Elif(s.feeder.done):
            m.d.sync += [s.feeder.running.eq(0), s.feeder.fused.eq(0)]
            m.next = nxt
        m.d.comb += s.vectors.resid_rd.addr.eq(s.feeder.n_in)


def _feeding_norm(s: ScheduleIn, start: MvStart, key: str) -> MvStart:
    """A residual update that also loads the norm unit `key`: its norm state then only drains it."""
    return start.plus([*s.feeder.start(key), s.feeder.fused.eq(1)])


def _mv_state(m: Module, s: ScheduleIn, name: str, nxt: str, start: MvStart) -> None:
    """Start a product and wait for it; an adapted projection first forms t16 = rescale(A a) (LORA_A), then runs
    with its B t16 term on."""
    slot_of = {f"layers.{slot.layer}.{slot.site}": n for n, slot in enumerate(s.lora.slots)}
    if start.tensor in slot_of:
        with m.State(name):
            m.d.sync += [*s.product.start(Mode.LORA_A, rows=s.lora.rank, chunks=start.chunks, mode=Mode.LORA_A,
                                          src=start.src), s.lora.sel.eq(slot_of[start.tensor])]
            m.next = name + "_LORA_A_WAIT"
        with m.State(name + "_LORA_A_WAIT"), m.If(s.epilogue.mv_done):
            m.next = name + "_MAIN"
        name = name + "_MAIN"
        start = start.plus([s.product.lora_on.eq(1)])
    with m.State(name):
        m.d.sync += start
        m.next = name + "_WAIT"
    with m.State(name + "_WAIT"), m.If(s.epilogue.mv_done):
        m.next = nxt


def _head_norm_state(m: Module, s: ScheduleIn, name: str, layer: int, is_k: bool, count: int, nxt: str) -> None:
    """Normalise each head of raw q (raw k) in place: started once q's rotation has ended (k's norm follows the K
    projection, while q may still be rotating, and the norm's driver takes the first reader of raw q and of raw k,
    which RoPE reads too), then waited for. Both waits are what plan.py counts."""
    with m.State(name), m.If(~s.rope.running):
        m.d.sync += s.head_norm.start(layer, is_k, count)
        m.next = name + "_WAIT"
    with m.State(name + "_WAIT"), m.If(~s.head_norm.running):
        m.next = nxt


def _rope_state(m: Module, s: ScheduleIn, name: str, is_k: bool, pairs: int, nxt: str) -> None:
    """Start a rotation once the previous one has ended, and go on while it runs."""
    with m.State(name), m.If(~s.rope.running):
        m.d.sync += s.rope.start(is_k, pairs)
        m.next = nxt


def _copy_state(m: Module, s: ScheduleIn, name: str, nxt: str, count: int, *, is_k: bool) -> None:
    """Learned positions: q and k need no rotation, only moving from raw_q / raw_k into place."""
    raw_rd = s.vectors.rk1 if is_k else s.vectors.rq1
    index = Signal(range(count + 1), name=f"{name.lower()}_index")
    with m.State(name):
        m.d.comb += raw_rd.addr.eq(index)
        with m.If(index == count):
            m.d.sync += index.eq(0)
            m.next = nxt
        with m.Else():
            m.d.sync += index.eq(index + 1)
            if is_k:
                k_write(m, s.dims, s.kv, s.control, index, raw_rd.data, 1)
            else:
                q_write(m, s.dims, s.buffers, index, raw_rd.data, 1)


def _softmax_state(m: Module, s: ScheduleIn, name: str, nxt: str) -> None:
    """Words of probabilities of one head into `probs` (softmax_lanes divides lanes); the lanes of the last
    word past the row's end are written 0, so that the weighted sum never reads a stale probability."""
    sm = s.units.softmax
    k = Signal(range(s.dims.c_ctx * s.dims.lanes // sm.lanes + 1), name=f"{name.lower()}_k")
    with m.State(name):
        m.d.comb += sm.o.ready.eq(1)
        with m.If(sm.o.valid):
            lane_group_write(m, s.buffers.wr["probs"], k, sm.o.payload.probs, s.dims.lanes,
                             clear_above=sm.o.payload.last)
            m.d.sync += k.eq(k + 1)
            with m.If(sm.o.payload.last):
                m.d.sync += k.eq(0)
                m.next = nxt


def _embed_states(m: Module, s: ScheduleIn, store: object, scale: object, row: Signal, prefix: str, nxt: str, *,
                  add: bool, to_norm: tuple[Signal, Signal, Signal] | None) -> None:
    """Row `row` of a table into the residual: rescale(code << shift, mult[row], shift[row]).

    The token embedding writes the residual; learned positions (add=True) add to it. The last of these passes
    also hands each element written to the first norm unit (to_norm: its value, its strobe, its count)."""
    lanes, d, rescale = s.dims.lanes, s.dims.d, s.units.emb_rescale
    resid_rd = s.vectors.resid_rd
    emb_i, emb_o = s.control.emb_i, s.control.emb_o
    chunks = s.dims.chunks(d)
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
            if add:
                total = Signal(signed(18), name=f"{prefix.lower()}_sum")
                m.d.comb += [resid_rd.addr.eq(emb_o), total.eq(resid_rd.data + rescale.o.payload),
                             written.eq(saturate(total, 16))]
            else:
                m.d.comb += written.eq(rescale.o.payload)
            residual_element(m, s.vectors, emb_o, written, to_norm)
        with m.If(emb_o == d):
            m.d.sync += [emb_i.eq(0), emb_o.eq(0)]
            m.next = nxt
        with m.Elif((lane == lanes) & (emb_i < d)):  # word used up: the rescale keeps what is in flight
            m.next = f"{prefix}_READ"

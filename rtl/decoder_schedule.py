"""The decoder's schedule: one FSM whose states a Python loop over the QModel unrolls.

IDLE takes a token; the embedding (and learned positions) fill the residual; each layer runs its
norm, Q / K / V with the rotation beside them, each head's scores, softmax and weighted sum, then
O, the MLP norm, gate / up and down; the final norm, the head and the argmax end the token. The
order and the cycles of every step are rtl/plan.py's schedule (a test holds them equal).
"""

from __future__ import annotations

from amaranth.hdl import Mux, Signal, signed

from .datapath import Datapath, Mode, MvStart, Source
from .decoder_side import k_write, norm_start, q_write
from .rescale import saturate
from .word_runs import lane_group_write


def start_mv(dp: Datapath, *args: object, **kwargs: object) -> MvStart:
    return dp.product.start(*args, **kwargs)


def build_schedule(dp: Datapath) -> object:
    """The token-level FSM (-> it, for testbenches: the schedule state)."""
    m, cfg = dp.m, dp.qm.config
    dp.out_token, token_ready = Signal(len(dp.token)), Signal()
    m.d.comb += dp.argmax.o.ready.eq(1)
    with m.If(dp.argmax.o.valid):
        m.d.sync += [dp.out_token.eq(dp.argmax.o.payload), token_ready.eq(1)]
    dp.slot_of = {f"layers.{s.layer}.{s.site}": n for n, s in enumerate(dp.lora.slots)}
    with m.FSM(name="schedule") as fsm:
        _idle_state(dp)
        to_norm = (dp.resid_new[0], dp.resid_took, dp.resid_beat)
        learned = dp.pos_store is not None
        _embed_states(dp, dp.embed, dp.embed_scale, dp.token, "EMBED", "POS_READ" if learned else "L0_START",
                      add=False, to_norm=None if learned else to_norm)
        if learned:
            _embed_states(dp, dp.pos_store, dp.pos_scale, dp.position, "POS", "L0_START", add=True,
                          to_norm=to_norm)
        for i in range(cfg.n_layers):
            with m.State(f"L{i}_START"):  # this position's K and V go to its slot of the ring (windowed), else to it
                window = dp.windows[i]
                m.d.sync += [dp.layer_sel.eq(i), dp.kv_slot.eq(dp.position if window is None else dp.ring[window])]
                m.next = f"L{i}_NORM_MLP_RUN" if cfg.parallel_residual else f"L{i}_NORM_ATTN_RUN"
            if cfg.parallel_residual:
                _parallel_mlp_states(dp, i)
            _attention_states(dp, i)
            for h in range(cfg.n_heads):
                _head_states(dp, i, h)
            _mlp_states(dp, i)
        _norm_state(dp, "FINAL_NORM", "final", "HEAD")
        _mv_state(dp, "HEAD", "ARGMAX", start_mv(dp, "head", rows=cfg.vocab_size, chunks=dp.chunks(dp.d),
                                                 mode=Mode.LOGITS, src=Source.ACT))
        with m.State("ARGMAX"), m.If(token_ready):
            m.d.sync += token_ready.eq(0)
            m.next = "EMIT"
        with m.State("EMIT"):
            m.d.comb += [dp.out.valid.eq(1), dp.out.payload.eq(dp.out_token)]
            with m.If(dp.out.ready):
                m.d.sync += [dp.position.eq(dp.position + 1), dp.tokens_done.eq(dp.tokens_done + 1), dp.busy.eq(0)]
                m.d.sync += [slot.eq(Mux(slot == w - 1, 0, slot + 1)) for w, slot in dp.ring.items()]  # p + 1 mod w
                m.next = "IDLE"
    return fsm


def _idle_state(dp: Datapath) -> None:
    """Take a token (a new sequence resets the position and the flags); refuse one out of range or past the
    context with a sticky flag, else start the embedding, whose last pass loads the first norm."""
    m, tokens = dp.m, dp.tokens
    with m.State("IDLE"):
        m.d.comb += tokens.ready.eq(1)
        with m.If(tokens.valid):
            m.d.sync += dp.busy.eq(1)
            new_pos = Mux(tokens.payload.new_seq, 0, dp.position)
            with m.If(tokens.payload.new_seq):
                m.d.sync += [dp.position.eq(0), dp.context_full.eq(0), dp.bad_token.eq(0)]
                m.d.sync += [slot.eq(0) for slot in dp.ring.values()]
            with m.If(tokens.payload.token >= dp.qm.config.vocab_size):
                m.d.sync += [dp.bad_token.eq(1), dp.busy.eq(0)]
            with m.Elif(new_pos >= dp.ctx):
                m.d.sync += [dp.context_full.eq(1), dp.busy.eq(0)]
            with m.Else():
                m.d.sync += [dp.token.eq(tokens.payload.token), dp.emb_i.eq(0), dp.emb_o.eq(0),
                             *norm_start(dp, first_norm(dp, 0)), dp.norm_fused.eq(1)]
                m.next = "EMBED_READ"


def first_norm(dp: Datapath, i: int) -> str:
    """The norm site a residual update into layer i loads: the attention's, or a parallel block's MLP norm (its
    attention norm then runs from the residual memory: both read the block's input)."""
    cfg = dp.qm.config
    return f"mlp{i}" if cfg.parallel_residual and not cfg.shared_norm else f"attn{i}"


def _parallel_mlp_states(dp: Datapath, i: int) -> None:
    """A parallel block's MLP before its attention: the MLP norm, gate / up into the hidden buffer, which
    attention leaves alone; DOWN runs after O. With one shared norm, the attention reads the same activations,
    which gate and up leave in place; with two, the attention norm then reads the residual, still the block's
    input. The sums are the reference's: saturate(saturate(x + o) + down)."""
    _norm_state(dp, f"L{i}_NORM_MLP_RUN", first_norm(dp, i), f"L{i}_GATE" if dp.gated else f"L{i}_UP")
    _gate_up_states(dp, i, f"L{i}_Q" if dp.qm.config.shared_norm else f"L{i}_NORM_ATTN_RUN")


def _gate_up_states(dp: Datapath, i: int, nxt: str) -> None:
    """Layer i's gate (gated MLPs) and up projections from the act buffer into the hidden buffer, then `nxt`."""
    n, ffn, c_d = f"layers.{i}", dp.qm.config.ffn, dp.chunks(dp.d)
    if dp.gated:
        _mv_state(dp, f"L{i}_GATE", f"L{i}_UP", start_mv(dp, f"{n}.gate", rows=ffn, chunks=c_d, mode=Mode.GATE,
                                                         src=Source.ACT))
    _mv_state(dp, f"L{i}_UP", nxt, start_mv(dp, f"{n}.up", rows=ffn, chunks=c_d, mode=Mode.UP, src=Source.ACT))


def _attention_states(dp: Datapath, i: int) -> None:
    """Layer i up to its heads: the norm (unless a shared one ran), Q, K and V, with q and k rotated (or copied)
    into place."""
    m, n, c_d = dp.m, f"layers.{i}", dp.chunks(dp.d)
    if not dp.qm.config.shared_norm:
        _norm_state(dp, f"L{i}_NORM_ATTN_RUN", f"attn{i}", f"L{i}_Q")
    q = start_mv(dp, f"{n}.q", rows=dp.qdim, chunks=c_d, mode=Mode.Q, src=Source.ACT)
    k = start_mv(dp, f"{n}.k", rows=dp.kvdim, chunks=c_d, mode=Mode.K, src=Source.ACT)
    if dp.rope is not None:
        _mv_state(dp, f"L{i}_Q", f"L{i}_ROPE_Q", q)
        _rope_state(dp, f"L{i}_ROPE_Q", False, dp.qdim // 2, f"L{i}_K")
        _mv_state(dp, f"L{i}_K", f"L{i}_ROPE_K", k)
        _rope_state(dp, f"L{i}_ROPE_K", True, dp.kvdim // 2, f"L{i}_V")
    else:
        _mv_state(dp, f"L{i}_Q", f"L{i}_COPY_Q", q)
        _copy_state(dp, f"L{i}_COPY_Q", f"L{i}_K", dp.qdim, is_k=False)
        _mv_state(dp, f"L{i}_K", f"L{i}_COPY_K", k)
        _copy_state(dp, f"L{i}_COPY_K", f"L{i}_V", dp.kvdim, is_k=True)
    _mv_state(dp, f"L{i}_V", f"L{i}_ROPE_WAIT", start_mv(dp, f"{n}.v", rows=dp.kvdim, chunks=c_d, mode=Mode.V,
                                                         src=Source.ACT))
    with m.State(f"L{i}_ROPE_WAIT"), m.If(~dp.rope_running):  # q and this position's k are in place
        m.next = f"L{i}_H0_SCORES"


def _head_states(dp: Datapath, i: int, h: int) -> None:
    """Head h of layer i: scores over the positions so far, softmax, weighted sum of V into the act buffer.

    A windowed layer (window w) runs them over the min(position + 1, w) slots of its ring, in slot order: the
    softmax and the weighted sum are sums over the keys, the same in any order."""
    m, hd, lanes, window = dp.m, dp.hd, dp.lanes, dp.windows[i]
    g = h // (dp.qm.config.n_heads // dp.qm.config.n_kv_heads)
    keys = dp.position + 1 if window is None else Mux(dp.position < window, dp.position + 1, window)
    words = (keys + lanes - 1) // lanes  # of probabilities: the weighted sum's chunks
    with m.State(f"L{i}_H{h}_SCORES"):
        m.d.sync += dp.head.eq(h)
        m.d.sync += start_mv(dp, Mode.SCORES, rows=keys, chunks=hd // lanes, mode=Mode.SCORES,
                             src=Source.Q, code_base=i * dp.k_layer + (g * hd) // lanes, stride=dp.c_kv,
                             act_base=(h * hd) // lanes)
        m.next = f"L{i}_H{h}_SCORES_WAIT"
    with m.State(f"L{i}_H{h}_SCORES_WAIT"), m.If(dp.mv_done):
        m.next = f"L{i}_H{h}_SOFTMAX"
    _softmax_state(dp, f"L{i}_H{h}_SOFTMAX", f"L{i}_H{h}_PV")
    nxt = f"L{i}_H{h + 1}_SCORES" if h + 1 < dp.qm.config.n_heads else f"L{i}_O"
    with m.State(f"L{i}_H{h}_PV"):
        m.d.sync += start_mv(dp, Mode.PV, rows=hd, chunks=words, mode=Mode.PV,
                             src=Source.PROBS, code_base=i * dp.v_layer + g * hd // dp.attn_rows * dp.c_ctx,
                             stride=dp.c_ctx)
        m.next = f"L{i}_H{h}_PV_WAIT"
    with m.State(f"L{i}_H{h}_PV_WAIT"), m.If(dp.mv_done):
        m.next = nxt


def _mlp_states(dp: Datapath, i: int) -> None:
    """Layer i after its heads: O into the residual (loading the MLP norm), the norm, gate / up, down (loading the
    next layer's first norm, or the final one). A parallel block ran its norm, gate and up before the attention:
    O only adds."""
    n, cfg = f"layers.{i}", dp.qm.config
    nxt_layer = f"L{i + 1}_START" if i + 1 < cfg.n_layers else "FINAL_NORM"
    o = start_mv(dp, f"{n}.o", rows=dp.d, chunks=dp.chunks(dp.qdim), mode=Mode.RESID, src=Source.ACT)
    if cfg.parallel_residual:
        _mv_state(dp, f"L{i}_O", f"L{i}_DOWN", o)
    else:
        _mv_state(dp, f"L{i}_O", f"L{i}_NORM_MLP", _feeding_norm(dp, o, f"mlp{i}"))
        _norm_state(dp, f"L{i}_NORM_MLP", f"mlp{i}", f"L{i}_GATE" if dp.gated else f"L{i}_UP")
        _gate_up_states(dp, i, f"L{i}_DOWN")
    down = start_mv(dp, f"{n}.down", rows=dp.d, chunks=dp.chunks(cfg.ffn), mode=Mode.RESID, src=Source.HID)
    _mv_state(dp, f"L{i}_DOWN", nxt_layer,
              _feeding_norm(dp, down, first_norm(dp, i + 1) if i + 1 < cfg.n_layers else "final"))


def _norm_state(dp: Datapath, name: str, key: str, nxt: str) -> None:
    """Run norm site `key` from the residual memory, or drain it when a residual update has loaded it."""
    m = dp.m
    with m.State(name):
        with m.If(~dp.norm_running):
            m.d.sync += norm_start(dp, key)
        with m.Elif(dp.norm_done):
            m.d.sync += [dp.norm_running.eq(0), dp.norm_fused.eq(0)]
            m.next = nxt
        m.d.comb += dp.resid_rd.addr.eq(dp.n_in)


def _feeding_norm(dp: Datapath, start: MvStart, key: str) -> MvStart:
    """A residual update that also loads the norm unit `key`: its norm state then only drains it."""
    return start.plus([*norm_start(dp, key), dp.norm_fused.eq(1)])


def _mv_state(dp: Datapath, name: str, nxt: str, start: MvStart) -> None:
    """Start a product and wait for it; an adapted projection first forms t16 = rescale(A a) (LORA_A), then runs
    with its B t16 term on."""
    m = dp.m
    if start.tensor in dp.slot_of:
        with m.State(name):
            m.d.sync += [*start_mv(dp, Mode.LORA_A, rows=dp.lora.rank, chunks=start.chunks, mode=Mode.LORA_A,
                                   src=start.src), dp.lora.sel.eq(dp.slot_of[start.tensor])]
            m.next = name + "_LORA_A_WAIT"
        with m.State(name + "_LORA_A_WAIT"), m.If(dp.mv_done):
            m.next = name + "_MAIN"
        name = name + "_MAIN"
        start = start.plus([dp.lora_on.eq(1)])
    with m.State(name):
        m.d.sync += start
        m.next = name + "_WAIT"
    with m.State(name + "_WAIT"), m.If(dp.mv_done):
        m.next = nxt


def _rope_state(dp: Datapath, name: str, is_k: bool, pairs: int, nxt: str) -> None:
    """Start a rotation once the previous one has ended, and go on while it runs."""
    with dp.m.State(name), dp.m.If(~dp.rope_running):
        dp.m.d.sync += [dp.rope_running.eq(1), dp.rope_is_k.eq(is_k), dp.rope_pairs.eq(pairs), dp.pair_in.eq(0),
                        dp.pair_out.eq(0)]
        dp.m.next = nxt


def _copy_state(dp: Datapath, name: str, nxt: str, count: int, *, is_k: bool) -> None:
    """Learned positions: q and k need no rotation, only moving from raw_q / raw_k into place."""
    m = dp.m
    raw_rd = dp.rk1 if is_k else dp.rq1
    index = Signal(range(count + 1), name=f"{name.lower()}_index")
    with m.State(name):
        m.d.comb += raw_rd.addr.eq(index)
        with m.If(index == count):
            m.d.sync += index.eq(0)
            m.next = nxt
        with m.Else():
            m.d.sync += index.eq(index + 1)
            (k_write if is_k else q_write)(dp, index, raw_rd.data, 1)


def _softmax_state(dp: Datapath, name: str, nxt: str) -> None:
    """Words of probabilities of one head into `probs` (softmax_lanes divides lanes); the lanes of the last
    word past the row's end are written 0, so that the weighted sum never reads a stale probability."""
    m, sm = dp.m, dp.softmax
    k = Signal(range(dp.c_ctx * dp.lanes // sm.lanes + 1), name=f"{name.lower()}_k")
    with m.State(name):
        m.d.comb += sm.o.ready.eq(1)
        with m.If(sm.o.valid):
            lane_group_write(m, dp.wr["probs"], k, sm.o.payload.probs, dp.lanes, clear_above=sm.o.payload.last)
            m.d.sync += k.eq(k + 1)
            with m.If(sm.o.payload.last):
                m.d.sync += k.eq(0)
                m.next = nxt


def _embed_states(dp: Datapath, store: object, scale: object, row: Signal, prefix: str, nxt: str, *, add: bool,
                  to_norm: tuple[Signal, Signal, Signal] | None) -> None:
    """Row `row` of a table into the residual: rescale(code << shift, mult[row], shift[row]).

    The token embedding writes the residual; learned positions (add=True) add to it. The last of these passes
    also hands each element written to the first norm unit (to_norm: its value, its strobe, its count)."""
    m, lanes, d, rescale, resid = dp.m, dp.lanes, dp.d, dp.emb_rescale, dp.resid
    emb_i, emb_o = dp.emb_i, dp.emb_o
    chunks = dp.chunks(d)
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
                m.d.comb += [dp.resid_rd.addr.eq(emb_o), total.eq(dp.resid_rd.data + rescale.o.payload),
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

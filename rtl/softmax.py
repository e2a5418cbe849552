"""Softmax: one row of int scores to Q15 probabilities, bit-exact with `quant.blocks.softmax` (docs/numerics.md §6).

    best  = max(s);  z_t = min(255, round_shift((best - s_t) * sm_mult, sm_shift));  e_t = EXP[z_t]
    total = sum e_t; r = floor(2**30 / total);  p_t = round_shift(e_t * r, 15)

The maximum is only known after the whole row, so the row is buffered (written once, read twice):

1. LOAD: accept the scores (a beat of up to `in_lanes` per cycle), store them (`lanes` to a word),
   track the maximum (the beat's, then a cycle later the row's).
2. EXP: read a word of scores back per cycle, compute each z (a constant multiply, pipelined, on
   only as many bits of best - score as can stay below the table's saturation), look EXP up (a
   registered case table per lane), write the e_t over the scores they came from (one memory, not two) and
   accumulate the total.
3. DIV: r = floor(2**30 / total) by the iterative `Reciprocal` (16 cycles: total >= 2**15 because
   the maximum has z = 0, so the quotient is at most 2**15).
4. OUT: read a word of e_t back per cycle and stream a word of p_t, honouring backpressure.

Cycles per row of n scores in w = ceil(n / lanes) words, without idle input or backpressure:
b + 2 * w + 21 from one row's first beat accepted to the next row's first beat accepted (b beats in
LOAD, w + 3 in EXP, 18 in DIV: hand-over, 16 divider steps, take; w in OUT). The first word of
probabilities is taken w + 24 cycles after the row's last score was accepted, then one per cycle
(the last 2 * w + 23 cycles after it); the next row is accepted while the last two words drain.
Backpressure stalls OUT only; EXP of the next row waits until the read port no longer holds a
probability-to-be.

One unit serves several sites (a decoder's layers, whose scales differ): `sm_mult` and
`sm_shift` may be lists, one entry per site, and the `site` input chooses the row's
constants (held from a row's first score to its last probability). The multiply is then by
a selected constant, and the shift a choice among the sites' distinct shifts.

A row longer than max_len keeps its first max_len scores: the extra ones are accepted and
dropped (the row still ends at `last`, and gives max_len probabilities), and the sticky
`overflow` output is set until reset.
"""

from __future__ import annotations

from collections.abc import Sequence

from amaranth.hdl import Cat, Elaboratable, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..quant.tables import EXP_BITS, PROB_BITS, RECIP_BITS, exp_table
from .reciprocal import Reciprocal
from .word_runs import write_run

MULT_BITS = 15  # sm_mult is an unsigned 15-bit multiplier (docs/numerics.md §1)
MAX_SHIFT = 62
Z_MAX = 255  # the EXP table has 256 entries
E_BITS = EXP_BITS + 1  # EXP[0] = 2**15 needs 16 unsigned bits
P_BITS = 16  # Q15 probability, 0..2**15


def score_layout(score_bits: int, in_lanes: int = 1) -> data.StructLayout:
    """A beat of a row's scores: `count` of them in scores[0..count), in order; `last` ends the row. A beat starts
    at a multiple of its size within the row (the decoder's epilogue hands aligned beats), or holds one score."""
    return data.StructLayout({"scores": data.ArrayLayout(signed(score_bits), in_lanes), "count": range(1, in_lanes + 1),
                              "last": 1})


def prob_layout(lanes: int = 1) -> data.StructLayout:
    return data.StructLayout({"probs": data.ArrayLayout(unsigned(P_BITS), lanes), "last": 1})


def saturating_delta(sm_mult: int, sm_shift: int) -> int:
    """The smallest `best - score` whose table index saturates: round_shift(delta * sm_mult, sm_shift) >= 255.

    Every larger delta gives z = 255 too, so the multiply only needs this many bits of delta.
    """
    return -(-((Z_MAX << sm_shift) - (1 << (sm_shift - 1))) // sm_mult)


class Softmax(wiring.Component):
    """Stream of scores (`last` on a row's final one) in; words of `lanes` Q15 probabilities out.

    Output word k holds the probabilities of scores k*lanes .. k*lanes + lanes - 1 of the row;
    lanes past the row's end are 0. The exponent and output passes handle a word per cycle.
    """

    def __init__(self, max_len: int, sm_mult: int | Sequence[int], sm_shift: int | Sequence[int], score_bits: int = 32,
                 lanes: int = 1, in_lanes: int = 1) -> None:
        if max_len < 1:
            self._MustUse__silence = True  # a refused component is not an unused one
            raise ValueError(f"max_len must be at least 1, got {max_len}")
        mults = [sm_mult] if isinstance(sm_mult, int) else list(sm_mult)
        shifts = [sm_shift] if isinstance(sm_shift, int) else list(sm_shift)
        if not mults or len(mults) != len(shifts):
            self._MustUse__silence = True
            raise ValueError(f"sm_mult and sm_shift must give one value per site, got {len(mults)} and {len(shifts)}")
        for mult in mults:
            if not 1 <= mult < 1 << MULT_BITS:
                self._MustUse__silence = True
                raise ValueError(f"sm_mult must be between 1 and {(1 << MULT_BITS) - 1}, got {mult}")
        for shift in shifts:
            if not 1 <= shift <= MAX_SHIFT:
                self._MustUse__silence = True
                raise ValueError(f"sm_shift must be between 1 and {MAX_SHIFT}, got {shift}")
        if not 1 <= score_bits <= 64:
            self._MustUse__silence = True
            raise ValueError(f"score_bits must be between 1 and 64, got {score_bits}")
        if isinstance(lanes, bool) or not isinstance(lanes, int) or not 1 <= lanes <= 64:
            self._MustUse__silence = True
            raise ValueError(f"lanes must be an int from 1 to 64, got {lanes!r}")
        if isinstance(in_lanes, bool) or not isinstance(in_lanes, int) or in_lanes < 1 or lanes % in_lanes:
            self._MustUse__silence = True
            raise ValueError(f"in_lanes must be an int that divides lanes ({lanes}), got {in_lanes!r}")
        self.max_len = max_len
        self.sm_mult = sm_mult
        self.sm_shift = sm_shift
        self.sites = list(zip(mults, shifts, strict=True))  # (mult, shift) per site
        self.score_bits = score_bits
        self.lanes, self.in_lanes = lanes, in_lanes
        super().__init__({
            "site": In(range(max(2, len(self.sites)))),  # whose constants this row uses (ignored with one site)
            "i": In(stream.Signature(score_layout(score_bits, in_lanes))),
            "o": Out(stream.Signature(prob_layout(lanes))),
            "overflow": Out(1),  # sticky: some row had more than max_len scores
        })

    def elaborate(self, platform: object) -> Elaboratable:
        m = Module()
        n_max, sb, lanes = self.max_len, self.score_bits, self.lanes
        words = -(-n_max // lanes)
        total_bits = ((1 << EXP_BITS) * n_max).bit_length()  # total <= 2**15 * max_len
        width = max(sb, E_BITS)

        # one lane per score; e_t (uint16) later overwrites the score it came from
        m.submodules.buf = buf = Memory(shape=data.ArrayLayout(unsigned(width), lanes), depth=words, init=[])
        rd = buf.read_port()  # not transparent: writes trail reads, never the same word in one cycle
        wr = buf.write_port(granularity=1)
        # EXP per lane as a registered case table: logic, like a ROM read port with a cycle of latency (a
        # multi-port ROM would cost a block RAM per two lanes, the scarcest resource on the boards)
        exp_values = [int(v) for v in exp_table().tolist()]
        exp_z = [Signal(8, name=f"exp_z{k}") for k in range(lanes)]
        exp_e = [Signal(E_BITS, name=f"exp_e{k}") for k in range(lanes)]
        for z_sig, e_sig in zip(exp_z, exp_e, strict=True):
            with m.Switch(z_sig):
                for z_value, e_value in enumerate(exp_values):
                    if e_value:  # EXP[z] = 0 past z = 177: the default arm
                        with m.Case(z_value):
                            m.d.sync += e_sig.eq(e_value)
                with m.Default():
                    m.d.sync += e_sig.eq(0)
        m.submodules.recip = div = Reciprocal(total_bits, RECIP_BITS, EXP_BITS)  # quotient: 16 bits, <= 2**15

        count = Signal(range(n_max + 1))  # scores stored in this row: n once loaded
        n_words = Signal(range(words + 1))  # ceil(count / lanes)
        best = Signal(signed(sb))
        total = Signal(total_bits)
        recip = Signal(div.quotient_bits)  # uint16, <= 2**15
        m.d.comb += n_words.eq((count + lanes - 1) // lanes)

        # --- output pipeline (OUT): address -> read data (p1) -> o register; it also drains during LOAD/EXP
        advance = Signal()
        out_addr = Signal(range(words + 1))
        out_issue = Signal()  # FSM: a read of word out_addr is issued in this cycle
        p1 = Signal()  # rd.data holds e words for the output
        p1_last = Signal()
        m.d.comb += advance.eq(~self.o.valid | self.o.ready)
        with m.If(advance):
            m.d.sync += [p1.eq(out_issue), p1_last.eq(out_issue & (out_addr == n_words - 1)),
                         self.o.valid.eq(p1), self.o.payload.last.eq(p1_last)]
        for k in range(lanes):
            product = Signal(E_BITS + div.quotient_bits, name=f"product{k}")  # e * r <= 2**30
            rounded = Signal(len(product) + 1, name=f"rounded{k}")
            m.d.comb += [product.eq(rd.data[k][:E_BITS] * recip),
                         rounded.eq(product + (1 << (RECIP_BITS - PROB_BITS - 1)))]
            with m.If(advance):
                m.d.sync += self.o.payload.probs[k].eq(rounded[RECIP_BITS - PROB_BITS:])

        # --- EXP pipeline: read address -> scores (v1) -> products (v2) -> EXP ROM data (v3) -> write back
        exp_addr = Signal(range(words + 1))  # next word to read
        exp_issue = Signal()
        wr_addr = Signal(range(words + 1))  # next word of e to write
        v1, v2, v3 = Signal(), Signal(), Signal()
        # best - score < 2**sb: a larger saturating delta never comes, so it is held at 2**sb
        saturating = [min(saturating_delta(mult, shift), 1 << sb) for mult, shift in self.sites]
        delta_bits = min(sb, max(1, (max(saturating) - 1).bit_length()))  # the deltas below saturation
        shifts = sorted({shift for _, shift in self.sites})
        mult, shift, saturate_at = Signal(MULT_BITS), Signal(range(MAX_SHIFT + 1)), Signal(range(max(saturating) + 1))
        with m.Switch(self.site if len(self.sites) > 1 else 0):  # this row's constants
            for index, ((site_mult, site_shift), site_saturation) in enumerate(zip(self.sites, saturating, strict=True)):
                with m.Case(index):
                    m.d.comb += [mult.eq(site_mult), shift.eq(site_shift), saturate_at.eq(site_saturation)]
        live = Signal(lanes)  # v3: which lanes of the word hold scores of this row
        live1, live2 = Signal(lanes), Signal(lanes)
        e_sum = 0
        for k in range(lanes):
            delta = Signal(sb, name=f"delta{k}")  # best - score >= 0, < 2**score_bits
            saturated = Signal(name=f"saturated{k}")
            scaled = Signal(delta_bits + MULT_BITS, name=f"scaled{k}")  # delta * sm_mult, below saturation
            scaled_bits = max(delta_bits + MULT_BITS, max(shifts)) + 1
            biased = Signal(scaled_bits, name=f"biased{k}")  # + 2**(sm_shift - 1)
            shifted = Signal(scaled_bits - min(shifts), name=f"shifted{k}")
            z = Signal(8, name=f"z{k}")
            with m.Switch(shift):
                for s in shifts:
                    with m.Case(s):
                        m.d.comb += [biased.eq(scaled + (1 << (s - 1))), shifted.eq(biased[s:])]
            m.d.comb += [
                delta.eq(best - rd.data[k][:sb].as_signed()),
                z.eq(Mux(saturated | (shifted > Z_MAX), Z_MAX, shifted)),
                exp_z[k].eq(z),
                wr.data[k].eq(Mux(live[k], exp_e[k], 0)),  # lanes past the row's end: e = 0, so p = 0
            ]
            m.d.sync += [scaled.eq(delta[:delta_bits] * mult), saturated.eq(delta >= saturate_at)]
            e_sum = e_sum + Mux(live[k], exp_e[k], 0)
        m.d.comb += [wr.addr.eq(wr_addr), rd.en.eq(0)]  # held unless a state reads (its init is 1)
        first_lane = exp_addr * lanes
        m.d.sync += [v1.eq(exp_issue), v2.eq(v1), v3.eq(v2), live2.eq(live1), live.eq(live2)]
        with m.If(exp_issue):
            m.d.sync += live1.eq(Cat(*[(first_lane + k) < count for k in range(lanes)]))

        # the running maximum a cycle behind the beat's: final the cycle after the last beat, before EXP's
        # first score leaves the read port (in one cycle, the two compares were the ECP5 critical path)
        beat_top, beat_first, beat_held = Signal(signed(sb)), Signal(), Signal()
        m.d.sync += beat_held.eq(0)
        with m.If(beat_held & (beat_first | (beat_top > best))):
            m.d.sync += best.eq(beat_top)

        with m.FSM():
            with m.State("LOAD"):
                beat, in_lanes = self.i.payload, self.in_lanes
                m.d.comb += self.i.ready.eq(1)
                # the beat's scores that are kept (the row's first max_len), and the largest of them
                kept = [Signal(name=f"kept{e}") for e in range(in_lanes)]
                m.d.comb += [kept[e].eq((e < beat.count) & (count + e < n_max)) for e in range(in_lanes)]
                top = beat.scores[0]
                for e in range(1, in_lanes):
                    top = Mux(kept[e] & (beat.scores[e] > top), beat.scores[e], top)
                n_kept = Signal(range(in_lanes + 1))  # the kept scores are a prefix of the beat
                m.d.comb += n_kept.eq(sum(kept[e] for e in range(in_lanes)))
                write_run(m, wr, count, beat.scores, n_kept, self.i.valid & kept[0], lanes)
                with m.If(self.i.valid):
                    with m.If(kept[0]):
                        m.d.sync += [count.eq(count + n_kept), beat_top.eq(top), beat_first.eq(count == 0),
                                     beat_held.eq(1)]
                    with m.If(count + beat.count > n_max):
                        m.d.sync += self.overflow.eq(1)  # dropped
                    with m.If(beat.last):
                        m.d.sync += [exp_addr.eq(0), wr_addr.eq(0), total.eq(0)]
                        m.next = "EXP"

            with m.State("EXP"):
                # the read port may still hold the previous row's last e for the output: wait for it to drain
                m.d.comb += [exp_issue.eq(~p1 & (exp_addr < n_words)), rd.addr.eq(exp_addr), rd.en.eq(~p1)]
                with m.If(exp_issue):
                    m.d.sync += exp_addr.eq(exp_addr + 1)
                with m.If(v3):
                    m.d.comb += wr.en.eq((1 << lanes) - 1)
                    m.d.sync += [wr_addr.eq(wr_addr + 1), total.eq(total + e_sum)]
                    with m.If(wr_addr == n_words - 1):
                        m.next = "DIV_SEND"

            with m.State("DIV_SEND"):
                m.d.comb += [div.i.valid.eq(1), div.i.payload.eq(total)]
                with m.If(div.i.ready):
                    m.next = "DIV_WAIT"

            with m.State("DIV_WAIT"):
                m.d.comb += div.o.ready.eq(1)
                with m.If(div.o.valid):
                    m.d.sync += [recip.eq(div.o.payload), out_addr.eq(0)]
                    m.next = "OUT"

            with m.State("OUT"):
                m.d.comb += [out_issue.eq(advance), rd.addr.eq(out_addr), rd.en.eq(advance)]
                with m.If(advance):
                    m.d.sync += out_addr.eq(out_addr + 1)
                    with m.If(out_addr == n_words - 1):
                        m.d.sync += count.eq(0)
                        m.next = "LOAD"
        return m

"""Softmax: one row of int scores to Q15 probabilities, bit-exact with `quant.blocks.softmax` (docs/numerics.md §6).

    best  = max(s);  z_t = min(255, round_shift((best - s_t) * sm_mult, sm_shift));  e_t = EXP[z_t]
    total = sum e_t; r = floor(2**30 / total);  p_t = round_shift(e_t * r, 15)

The maximum is only known after the whole row, so the row is buffered (written once, read twice):

1. LOAD: accept the scores (one per cycle), store them, track the maximum.
2. EXP: read each score back, compute z (a constant multiply, pipelined), look EXP up in a ROM,
   write e_t over the score it came from (one memory, not two) and accumulate the total.
3. DIV: r = floor(2**30 / total) by the iterative `Reciprocal` (16 cycles: total >= 2**15 because
   the maximum has z = 0, so the quotient is at most 2**15).
4. OUT: read each e_t back and stream p_t, honouring backpressure.

Cycles per row of n scores, without idle input or backpressure: 3 * n + 21 from one row's first
score accepted to the next row's first score accepted (n in LOAD, n + 3 in EXP, 18 in DIV: hand-over,
16 divider steps, take; n in OUT). The first probability is taken n + 24 cycles after the row's last
score was accepted, then one per cycle (the last 2 * n + 23 cycles after it); the next row is
accepted while the last two probabilities drain. Backpressure stalls OUT only; EXP of the next row
waits until the read port no longer holds a probability-to-be.

A row longer than max_len keeps its first max_len scores: the extra ones are accepted and
dropped (the row still ends at `last`, and gives max_len probabilities), and the sticky
`overflow` output is set until reset.
"""

from __future__ import annotations

from amaranth.hdl import Elaboratable, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..quant.tables import EXP_BITS, PROB_BITS, RECIP_BITS, exp_table
from .reciprocal import Reciprocal

MULT_BITS = 15  # sm_mult is an unsigned 15-bit multiplier (docs/numerics.md §1)
MAX_SHIFT = 62
Z_MAX = 255  # the EXP table has 256 entries
E_BITS = EXP_BITS + 1  # EXP[0] = 2**15 needs 16 unsigned bits
P_BITS = 16  # Q15 probability, 0..2**15


def score_layout(score_bits: int) -> data.StructLayout:
    return data.StructLayout({"score": signed(score_bits), "last": 1})


def prob_layout() -> data.StructLayout:
    return data.StructLayout({"prob": unsigned(P_BITS), "last": 1})


class Softmax(wiring.Component):
    """Stream of scores (`last` on a row's final one) in, stream of as many Q15 probabilities out."""

    def __init__(self, max_len: int, sm_mult: int, sm_shift: int, score_bits: int = 32) -> None:
        if max_len < 1:
            self._MustUse__silence = True  # a refused component is not an unused one
            raise ValueError(f"max_len must be at least 1, got {max_len}")
        if not 1 <= sm_mult < 1 << MULT_BITS:
            self._MustUse__silence = True
            raise ValueError(f"sm_mult must be between 1 and {(1 << MULT_BITS) - 1}, got {sm_mult}")
        if not 1 <= sm_shift <= MAX_SHIFT:
            self._MustUse__silence = True
            raise ValueError(f"sm_shift must be between 1 and {MAX_SHIFT}, got {sm_shift}")
        if not 1 <= score_bits <= 64:
            self._MustUse__silence = True
            raise ValueError(f"score_bits must be between 1 and 64, got {score_bits}")
        self.max_len = max_len
        self.sm_mult = sm_mult
        self.sm_shift = sm_shift
        self.score_bits = score_bits
        super().__init__({
            "i": In(stream.Signature(score_layout(score_bits))),
            "o": Out(stream.Signature(prob_layout())),
            "overflow": Out(1),  # sticky: some row had more than max_len scores
        })

    def elaborate(self, platform: object) -> Elaboratable:
        m = Module()
        n_max, sb = self.max_len, self.score_bits
        total_bits = ((1 << EXP_BITS) * n_max).bit_length()  # total <= 2**15 * max_len

        # one word per score; e_t (uint16) later overwrites the score it came from
        m.submodules.buf = buf = Memory(shape=unsigned(max(sb, E_BITS)), depth=n_max, init=[])
        rd = buf.read_port()  # not transparent: writes trail reads, never the same row in one cycle
        wr = buf.write_port()
        m.submodules.exp = rom = Memory(shape=unsigned(E_BITS), depth=Z_MAX + 1, init=exp_table().tolist())
        rom_rd = rom.read_port()
        m.submodules.recip = div = Reciprocal(total_bits, RECIP_BITS, EXP_BITS)  # quotient: 16 bits, <= 2**15

        count = Signal(range(n_max + 1))  # scores stored in this row: n once loaded
        best = Signal(signed(sb))
        total = Signal(total_bits)
        recip = Signal(div.quotient_bits)  # uint16, <= 2**15

        # --- output pipeline (OUT): address -> read data (p1) -> o register; it also drains during LOAD/EXP
        advance = Signal()
        out_addr = Signal(range(n_max + 1))
        out_issue = Signal()  # FSM: a read of e[out_addr] is issued in this cycle
        p1 = Signal()  # rd.data holds an e_t for the output
        p1_last = Signal()
        product = Signal(E_BITS + div.quotient_bits)  # e * r <= 2**30
        rounded = Signal(len(product) + 1)
        m.d.comb += [
            advance.eq(~self.o.valid | self.o.ready),
            product.eq(rd.data[:E_BITS] * recip),
            rounded.eq(product + (1 << (RECIP_BITS - PROB_BITS - 1))),
        ]
        with m.If(advance):
            m.d.sync += [
                p1.eq(out_issue),
                p1_last.eq(out_issue & (out_addr == count - 1)),
                self.o.valid.eq(p1),
                self.o.payload.prob.eq(rounded[RECIP_BITS - PROB_BITS:]),
                self.o.payload.last.eq(p1_last),
            ]

        # --- EXP pipeline: read address -> score (v1) -> product register (v2) -> EXP ROM data (v3) -> write back
        exp_addr = Signal(range(n_max + 1))  # next score to read
        exp_issue = Signal()
        wr_addr = Signal(range(n_max + 1))  # next e to write
        v1, v2, v3 = Signal(), Signal(), Signal()
        delta = Signal(sb)  # best - score >= 0, < 2**score_bits
        scaled = Signal(sb + MULT_BITS)  # delta * sm_mult
        scaled_bits = max(sb + MULT_BITS, self.sm_shift) + 1
        biased = Signal(scaled_bits)  # + 2**(sm_shift - 1)
        shifted = Signal(scaled_bits - self.sm_shift)
        z = Signal(8)
        m.d.comb += [
            delta.eq(best - rd.data[:sb].as_signed()),
            biased.eq(scaled + (1 << (self.sm_shift - 1))),
            shifted.eq(biased[self.sm_shift:]),
            z.eq(Mux(shifted > Z_MAX, Z_MAX, shifted)),
            rom_rd.addr.eq(z),
            wr.addr.eq(wr_addr),
            wr.data.eq(rom_rd.data),
            rd.en.eq(0),  # held unless a state reads (its init is 1): the output may still need the data
        ]
        m.d.sync += [v1.eq(exp_issue), v2.eq(v1), v3.eq(v2), scaled.eq(delta * self.sm_mult)]

        with m.FSM():
            with m.State("LOAD"):
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid):
                    with m.If(count < n_max):
                        m.d.comb += [wr.addr.eq(count), wr.data.eq(self.i.payload.score), wr.en.eq(1)]
                        m.d.sync += count.eq(count + 1)
                        with m.If((count == 0) | (self.i.payload.score > best)):
                            m.d.sync += best.eq(self.i.payload.score)
                    with m.Else():
                        m.d.sync += self.overflow.eq(1)  # dropped
                    with m.If(self.i.payload.last):
                        m.d.sync += [exp_addr.eq(0), wr_addr.eq(0), total.eq(0)]
                        m.next = "EXP"

            with m.State("EXP"):
                # the read port may still hold the previous row's last e for the output: wait for it to drain
                m.d.comb += [exp_issue.eq(~p1 & (exp_addr < count)), rd.addr.eq(exp_addr), rd.en.eq(~p1)]
                with m.If(exp_issue):
                    m.d.sync += exp_addr.eq(exp_addr + 1)
                with m.If(v3):
                    m.d.comb += wr.en.eq(1)
                    m.d.sync += [wr_addr.eq(wr_addr + 1), total.eq(total + rom_rd.data)]
                    with m.If(wr_addr == count - 1):
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
                    with m.If(out_addr == count - 1):
                        m.d.sync += count.eq(0)
                        m.next = "LOAD"
        return m

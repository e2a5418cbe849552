"""Norm unit: integer RMSNorm / LayerNorm of one int16 residual vector to int12 (docs/numerics.md §4).

u = x (rms) or d*x - sum(x) (layer); ss = sum(u^2) + eps_q; e = max(0, bit_length(ss) - 10) rounded up
to even; r = RSQRT[ss >> e]; t = round_shift(u * r, e/2 + 8) (int17); out = rescale(t, mult[j], shift[j], 8)
(12 bits at a site whose out_bits says so: every norm of a compiled model).
The vector is kept in a RAM of `lanes`-element words while the per-vector quantities are accumulated,
then read back a word per cycle: once, or twice for LayerNorm (its sum of squares needs the mean).

One unit serves every norm of the model: each norm site has its own eps_q and per-channel
(mult, shift), chosen by the `site` input, and the decoder runs one norm at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from amaranth.hdl import Cat, Const, Elaboratable, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..quant.fixedpoint import MAX_SHIFT, bits_for
from ..quant.tables import RSQRT_BITS, RSQRT_INDEX_BITS, rsqrt_table
from .rescale import MULT_BITS, SHIFT_BITS, Rescale, saturate
from .word_runs import write_run

X_BITS = 16  # the int16 residual
T_BITS = 17  # t = u / sqrt(ss) in Q15, slightly past 2**15 (§4)
OUT_BITS = 8  # a site's output saturates here unless it says wider (a compiled model's norms: 12)
SUM_BITS = 63  # ss is checked int63 by the reference: 0 < ss < 2**62
INPUT_STAGE = 1  # each input beat is registered before the RAM takes it


def max_sum_of_squares(d: int, kind: str) -> int:
    """The exact largest sum(u^2) over int16 vectors of length d.

    rms: every x = -2**15. layer: sum u^2 = d * (d * sum x^2 - (sum x)^2) is convex in x, so it peaks at
    a corner of the box: k elements at 2**15 - 1 and d - k at -2**15 give d * k * (d - k) * (2**16 - 1)**2,
    largest at k = d // 2. This is about 4x below §4's compile-time `worst` (which uses |u| <= 2d * 2**15),
    so every model the compiler accepts (LayerNorm up to d = 1289) fits.
    """
    if kind == "rms":
        return d << (2 * (X_BITS - 1))
    return d * (d // 2) * (d - d // 2) * ((1 << X_BITS) - 1) ** 2


class NormSite(NamedTuple):
    """The constants of one norm (numerics §4): eps in sum-of-squares units and the per-channel rescale."""

    eps_q: int
    mult: Sequence[int]
    shift: Sequence[int]
    out_bits: int = OUT_BITS  # 12 for a compiled model's norms; 8 for one saved before QNorm.out_bits


def coef_words(sites: Sequence[NormSite], d: int, lanes: int) -> list[list[int]]:
    """The coefficient ROM: per site, ceil(d / lanes) words of `lanes` (shift << 15 | mult) fields; padding lanes
    hold any valid multiplier. The board fit check counts the same words."""
    words = -(-d // lanes)
    table = []
    for site in sites:
        coefs = [(int(s) << MULT_BITS) | int(mu) for mu, s in zip(site.mult, site.shift, strict=True)]
        coefs += [(1 << MULT_BITS) | 1] * (words * lanes - d)
        table += [coefs[k * lanes:(k + 1) * lanes] for k in range(words)]
    return table


def input_layout(in_lanes: int) -> data.StructLayout:
    """A beat of the residual vector: `count` elements in values[0..count), the vector's next ones."""
    return data.StructLayout({"values": data.ArrayLayout(signed(X_BITS), in_lanes), "count": range(1, in_lanes + 1)})


class NormUnit(wiring.Component):
    """Stream of d int16 residual elements in, words of `lanes` normalised elements (int12; `out_bits` per site) out, per vector.

    The elements come in beats of up to `in_lanes` (which divides lanes): within one vector every beat
    is full but the last, or every beat holds one element (the decoder's epilogue, wide or not).

    `site` selects the norm's constants; it must hold from a vector's first input to its last output.
    Output word k holds elements k*lanes .. k*lanes + lanes - 1; lanes past d are 0. Vectors are
    processed one at a time; `i.ready` is low from the last element of a vector until the last output
    word of that vector has been taken. With w = ceil(d / lanes) and without idle input or
    backpressure, one vector takes d + w + 15 cycles (rms) or d + 2w + 16 cycles (layer) from its
    first input to the first input of the next:

    - load, d cycles (one per beat) and one more: each beat registered (INPUT_STAGE), then written into the
      RAM; rms squares and sums x on the way, layer sums x.
    - layer only, w cycles: read x back, u = d*x - sum, square and sum a word of u per cycle.
    - 6 cycles (rms) or 7 (layer): drain the squarer, priority-encode ss, index the RSQRT ROM, register
      its word.
    - w + 8 cycles: read x and (mult, shift) back, u * r, rounding shift by e/2 + 8, per-channel rescale
      (Rescale, 5 stages); the output words come one per cycle.

    Latency: the first output word is valid 16 cycles (rms) or w + 17 cycles (layer) after the cycle
    that takes the last input. Backpressure stalls the output pipeline as a whole; `o.valid` never waits
    on `o.ready`.
    """

    def __init__(self, d: int, kind: str, sites: Sequence[NormSite], *, lanes: int = 1, in_lanes: int = 1) -> None:
        try:
            if not sites:
                raise ValueError("a norm unit needs at least one site")
            if isinstance(lanes, bool) or not isinstance(lanes, int) or not 1 <= lanes <= 64:
                raise ValueError(f"lanes must be an int from 1 to 64, got {lanes!r}")
            if isinstance(in_lanes, bool) or not isinstance(in_lanes, int) or in_lanes < 1 or lanes % in_lanes:
                raise ValueError(f"in_lanes must be an int that divides lanes ({lanes}), got {in_lanes!r}")
            for index, site in enumerate(sites):
                try:
                    self._validate(d, kind, *site)
                except ValueError as err:
                    raise ValueError(f"site {index}: {err}" if len(sites) > 1 else str(err)) from None
        except ValueError:
            self._MustUse__silence = True  # a refused component is not an unused one
            raise
        self.d, self.kind, self.lanes, self.in_lanes = d, kind, lanes, in_lanes
        self.sites = [NormSite(int(s.eps_q), [int(v) for v in s.mult], [int(v) for v in s.shift], int(s.out_bits))
                      for s in sites]
        self.out_bits = max(site.out_bits for site in self.sites)
        super().__init__({
            "i": In(stream.Signature(input_layout(in_lanes))),
            "site": In(range(max(2, len(sites)))),
            "o": Out(stream.Signature(data.ArrayLayout(signed(self.out_bits), lanes))),
        })

    @staticmethod
    def _validate(d: int, kind: str, eps_q: int, mult: Sequence[int], shift: Sequence[int], out_bits: int) -> None:
        if kind not in ("rms", "layer"):
            raise ValueError(f"kind must be 'rms' or 'layer', got {kind!r}")
        if d < 2:
            raise ValueError(f"d must be at least 2, got {d}")
        if eps_q < 1:
            raise ValueError(f"eps_q must be at least 1, got {eps_q}")
        if not OUT_BITS <= out_bits <= T_BITS:
            raise ValueError(f"out_bits must be between {OUT_BITS} and {T_BITS}, got {out_bits}")
        if len(mult) != d or len(shift) != d:
            raise ValueError(f"mult and shift must have d = {d} entries each, got {len(mult)} and {len(shift)}")
        for j, v in enumerate(mult):
            if not 1 <= int(v) < 1 << MULT_BITS:
                raise ValueError(f"mult[{j}] must be in [1, 2**{MULT_BITS}), got {int(v)}")
        for j, v in enumerate(shift):
            if not 1 <= int(v) <= MAX_SHIFT:
                raise ValueError(f"shift[{j}] must be in [1, {MAX_SHIFT}], got {int(v)}")
        ss_max = max_sum_of_squares(d, kind) + eps_q
        if ss_max >= 1 << (SUM_BITS - 1):
            raise ValueError(f"{kind} norm with d = {d} and eps_q = {eps_q}: the sum of squares can reach {ss_max}, "
                             f"which does not fit int{SUM_BITS}")

    def elaborate(self, platform: object) -> Elaboratable:
        m = Module()
        d, layer, lanes = self.d, self.kind == "layer", self.lanes
        words = -(-d // lanes)
        n_sites = len(self.sites)

        # widths, from the worst case for d and the largest eps_q
        eps_max = max(site.eps_q for site in self.sites)
        x_max = 1 << (X_BITS - 1)  # |x| <= 2**15
        u_max = 2 * d * x_max if layer else x_max  # |d*x - sum| < d * 2**16
        u_bits = bits_for(u_max) if layer else X_BITS
        total_bits = bits_for(d * x_max)  # sum x
        sq_sum_bits = (max(lanes, self.in_lanes) * u_max * u_max).bit_length()  # a word's (a beat's) sum of squares
        ss_max = max_sum_of_squares(d, self.kind) + eps_max
        ss_bits = ss_max.bit_length()  # sum u^2 + eps_q, unsigned, <= 62
        assert ss_bits <= SUM_BITS - 1, "checked in __init__"
        bl_bits = (ss_bits + 1).bit_length()  # bit_length(ss) in 0..ss_bits
        e_half_max = max(0, (ss_bits - RSQRT_INDEX_BITS + 1) >> 1)  # e/2
        rshift_max = e_half_max + 8  # e/2 + 8
        prod_bits = bits_for(u_max << RSQRT_BITS)  # u * r, r <= 2**23
        round_bits = max(prod_bits, rshift_max + 1) + 1  # u * r + 2**(e/2 + 7)

        # storage: x in words of `lanes`, the per-channel (mult, shift) of every site in words of `lanes`
        m.submodules.x_ram = x_ram = Memory(shape=data.ArrayLayout(signed(X_BITS), lanes), depth=words, init=[])
        x_wr = x_ram.write_port(granularity=1)
        x_rd = x_ram.read_port()
        coef_layout = data.ArrayLayout(unsigned(MULT_BITS + SHIFT_BITS), lanes)
        coef_init = coef_words(self.sites, d, lanes)
        m.submodules.coef_rom = coef_rom = Memory(shape=coef_layout, depth=n_sites * words, init=coef_init)
        coef_rd = coef_rom.read_port()
        rsqrt_init = [int(v) for v in rsqrt_table().tolist()]
        m.submodules.rsqrt_rom = rsqrt_rom = Memory(shape=unsigned(RSQRT_BITS + 1), depth=1 << RSQRT_INDEX_BITS,
                                                    init=rsqrt_init)
        r_rd = rsqrt_rom.read_port()
        rescales = [Rescale(T_BITS, self.out_bits) for _ in range(lanes)]
        for k, rescale in enumerate(rescales):
            m.submodules[f"rescale{k}"] = rescale
        m.d.comb += self.o.valid.eq(rescales[0].o.valid)  # the lanes move in lockstep
        narrower = {w: [i for i, s in enumerate(self.sites) if s.out_bits == w]  # sites saturating again, narrower
                    for w in {s.out_bits for s in self.sites} - {self.out_bits}}
        for k, rescale in enumerate(rescales):
            y = out = rescale.o.payload
            for width, indices in narrower.items():
                out = Mux(self.site.matches(*indices), saturate(y, width), out)
            m.d.comb += [rescale.o.ready.eq(self.o.ready), self.o.payload[k].eq(out)]

        eps = Signal(range(eps_max + 1))
        with m.Switch(self.site):
            for index, site in enumerate(self.sites):
                with m.Case(index):
                    m.d.comb += eps.eq(site.eps_q)

        j = Signal(range(max(d, words) + 1))  # element (load) or word (read passes) counter of the current pass
        n_out = Signal(range(words))  # output words taken in the current vector
        total = Signal(signed(total_bits))  # sum x (layer)
        ss = Signal(ss_bits)  # sum u^2 so far; eps_q is added when the encoder reads it
        ss_eps = Signal(ss_bits)
        m.d.comb += ss_eps.eq(ss + eps)

        def u_of(x: object) -> Signal:
            u = Signal(signed(u_bits))  # |u| <= u_max
            m.d.comb += u.eq(x * d - total if layer else x)
            return u

        # squarer: a word of u (rms: one element) -> register -> sum of squares -> accumulate into ss
        sq_lanes = lanes if layer else self.in_lanes
        sq_in = [Signal(signed(u_bits), name=f"sq_in{k}") for k in range(sq_lanes)]
        sq_u = [Signal(signed(u_bits), name=f"sq_u{k}") for k in range(sq_lanes)]
        sq_in_valid, sq_u_valid = Signal(), Signal()
        sq, sq_valid = Signal(sq_sum_bits), Signal()
        m.d.sync += [*(a.eq(b) for a, b in zip(sq_u, sq_in, strict=True)), sq_u_valid.eq(sq_in_valid),
                     sq.eq(sum(u * u for u in sq_u)), sq_valid.eq(sq_u_valid)]
        with m.If(sq_valid):
            m.d.sync += ss.eq(ss + sq)
        rd_valid = Signal()  # layer: x_rd.data holds a word of the squares pass
        rd_word = Signal(range(words))  # ... and which word
        m.d.sync += rd_valid.eq(0)
        u_rd = [u_of(x_rd.data[k]) for k in range(lanes)]
        if layer:
            for k in range(lanes):  # lanes past d square to nothing
                live = (rd_word * lanes + k) < d if (words * lanes > d) else 1
                m.d.comb += sq_in[k].eq(Mux(live, u_rd[k], 0))
            m.d.comb += sq_in_valid.eq(rd_valid)

        # rsqrt: priority encoder, even exponent, table index
        bl = Signal(bl_bits)  # bit_length(ss)
        for b in range(ss_bits):
            with m.If(ss_eps[b]):
                m.d.comb += bl.eq(b + 1)  # the highest set bit wins
        e_half = Signal(range(e_half_max + 1))  # e/2: e = max(0, bl - 10) rounded up to even
        index = Signal(RSQRT_INDEX_BITS)  # m = ss >> e, 1..1023
        rshift = Signal(range(rshift_max + 1))  # e/2 + 8
        half = Signal(round_bits)  # 2**(e/2 + 7)
        m.d.comb += r_rd.addr.eq(index)  # index is fixed from two cycles before the output pass to its end
        # the block RAM's word registered before its multiplier: block RAM (no output register) -> DSP -> carry
        # chain in one cycle was the ECP5 critical path
        r = Signal.like(r_rd.data)
        m.d.sync += r.eq(r_rd.data)

        # output pipeline: issue -> RAM/ROM read -> u * r -> rounding shift -> Rescale (5 stages), a word per cycle
        advance = Signal()
        m.d.comb += advance.eq(rescales[0].i.ready)
        issue = Signal()
        v_read, v_prod = Signal(), Signal()
        live_read, live_prod = Signal(lanes), Signal(lanes)  # lanes that hold elements of the vector
        m.d.comb += [coef_rd.addr.eq(self.site * words + j), coef_rd.en.eq(advance)]
        coef = Signal(coef_layout)
        with m.If(advance):
            m.d.sync += [v_read.eq(issue), v_prod.eq(v_read), live_prod.eq(live_read), coef.eq(coef_rd.data)]
            m.d.sync += live_read.eq(Cat(*[(j * lanes + k) < d for k in range(lanes)]))
            with m.If(issue):
                m.d.sync += j.eq(j + 1)
        for k, rescale in enumerate(rescales):
            prod = Signal(signed(prod_bits), name=f"prod{k}")  # u * r
            rounded = Signal(signed(round_bits), name=f"rounded{k}")
            m.d.comb += rounded.eq((prod + half) >> rshift)
            with m.If(advance):
                m.d.sync += [
                    prod.eq(u_rd[k] * r),
                    rescale.i.valid.eq(v_prod),
                    rescale.i.payload.value.eq(Mux(live_prod[k], rounded, 0)),  # fits int17 (§4); padding: 0
                    rescale.i.payload.mult.eq(coef[k][:MULT_BITS]),
                    rescale.i.payload.shift.eq(coef[k][MULT_BITS:]),
                ]

        # the input beat is registered before it is written and squared (INPUT_STAGE): what feeds it (the
        # residual memory's read, chosen by the schedule) and the RAM's write port are far apart on the die: the
        # schedule state to the norm's input RAM in one cycle was the routed 4 x 32 build's critical path (20.7 ns)
        beat = Signal.like(self.i.payload, reset_less=True)
        b_valid = Signal()
        taken = Signal(range(d + self.in_lanes + 1))  # elements of this vector accepted into the register
        loading = Signal()
        m.d.comb += self.i.ready.eq(loading & (taken < d))
        m.d.sync += b_valid.eq(self.i.valid & self.i.ready)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [beat.eq(self.i.payload), taken.eq(taken + self.i.payload.count)]

        with m.FSM():
            with m.State("LOAD"):
                in_lanes = self.in_lanes
                m.d.comb += loading.eq(1)
                real = [Signal(name=f"real{e}") for e in range(in_lanes)]  # values[e] is an element
                m.d.comb += [real[e].eq(e < beat.count) for e in range(in_lanes)]
                write_run(m, x_wr, j, beat.values, beat.count, b_valid, lanes)
                if not layer:
                    m.d.comb += [sq_in[e].eq(Mux(real[e], beat.values[e], 0)) for e in range(in_lanes)]
                    m.d.comb += sq_in_valid.eq(b_valid)
                with m.If(b_valid):
                    m.d.sync += j.eq(j + beat.count)
                    if layer:
                        m.d.sync += total.eq(total + sum(Mux(real[e], beat.values[e], 0) for e in range(in_lanes)))
                    with m.If(j + beat.count >= d):
                        m.d.sync += j.eq(0)
                        m.next = "SQUARES" if layer else "DRAIN"
            if layer:
                with m.State("SQUARES"):
                    m.d.comb += x_rd.addr.eq(j)
                    m.d.sync += [rd_valid.eq(1), rd_word.eq(j), j.eq(j + 1)]
                    with m.If(j == words - 1):
                        m.d.sync += j.eq(0)
                        m.next = "DRAIN"
            with m.State("DRAIN"), m.If(~(rd_valid | sq_u_valid | sq_valid)):
                m.next = "ENCODE"
            with m.State("ENCODE"):
                m.d.sync += e_half.eq(Mux(bl > RSQRT_INDEX_BITS, (bl - (RSQRT_INDEX_BITS - 1)) >> 1, 0))
                m.next = "INDEX"
            with m.State("INDEX"):
                m.d.sync += [
                    index.eq(ss_eps >> Cat(Const(0, 1), e_half)),
                    rshift.eq(e_half + 8),
                    half.eq(Const(1, 1) << (e_half + 7)),
                ]
                m.next = "ROM"
            with m.State("ROM"):  # the RSQRT word is read; the next cycle it is in r, a register beside the DSP
                m.next = "OUT"
            with m.State("OUT"):
                m.d.comb += [
                    issue.eq(j != words),
                    x_rd.addr.eq(j),
                    x_rd.en.eq(advance),
                ]
                with m.If(self.o.valid & self.o.ready):
                    m.d.sync += n_out.eq(n_out + 1)
                    with m.If(n_out == words - 1):
                        m.d.sync += [n_out.eq(0), j.eq(0), total.eq(0), ss.eq(0), taken.eq(0)]
                        m.next = "LOAD"
        return m

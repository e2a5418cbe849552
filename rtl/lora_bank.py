"""LoraBank: every LoRA adapter slot's A and B in writable SRAM, with its four scale registers.

The host writes one 16-bit value per address through `write` (address map: rtl/lora_map.py);
the decoder only lets writes in between tokens (`accept`). While a projection runs, `sel`
names its slot: the engine reads a word of A at `a_addr` (synchronous, like a weight bank:
`lanes` int8 codes of one rank row), the epilogue reads `lanes_out` rows of B at `b_addr[e]`
(synchronous too: the row a cycle after `b_en`, held while it is low; small: LUT RAM with its
output register), and the slot's scales are on `a_mult` ... `b_shift`, registered: they follow `sel`
a cycle later (a slot multiplexer in front of a DSP was the ECP5 critical path; the scales are read
several cycles after a product starts).
What the adapter computes is docs/numerics.md §9.
"""

from __future__ import annotations

from amaranth.hdl import Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..quant.qmodel import QModel
from .lora_map import RESET, LoraSlot, lora_addr_bits, lora_address_map


def _split(value: object, bits: int) -> tuple[object, object]:
    """(low `bits` bits, the rest) of an address offset: strides are powers of two."""
    return (value[:bits] if bits else Const(0, 1)), value[bits:]


class LoraBank(wiring.Component):
    """The adapter slots of a build (empty when its LoRA rank is 0): host writes in, the running slot's A, B and
    scales out."""

    def __init__(self, qm: QModel, *, lanes: int, lanes_out: int) -> None:
        self.slots: list[LoraSlot] = lora_address_map(qm)
        self.rank = qm.lora.rank if self.slots else 0
        self.lanes, self.lanes_out = lanes, lanes_out
        self.memories: dict[str, Memory] = {}  # lora_a{n}, lora_b{n}: for testbenches
        for n, slot in enumerate(self.slots):
            self.memories[f"lora_a{n}"] = Memory(shape=data.ArrayLayout(signed(8), lanes),
                                                 depth=self.rank * -(-slot.in_features // lanes), init=[])
            self.memories[f"lora_b{n}"] = Memory(shape=data.ArrayLayout(signed(8), max(1, self.rank)),
                                                 depth=slot.out_features, init=[])
        rank, slots = max(1, self.rank), max(2, len(self.slots))
        b_rows = max([slot.out_features for slot in self.slots], default=1)
        a_words = max([self.rank * -(-slot.in_features // lanes) for slot in self.slots], default=1)
        super().__init__({
            "write": In(stream.Signature(data.StructLayout({"addr": unsigned(lora_addr_bits(qm)),
                                                            "data": unsigned(16)}))),
            "accept": In(1),  # writes go in only while this is high (between tokens)
            "sel": In(range(slots)),
            "a_addr": In(range(max(2, a_words))),
            "a_en": In(1),
            "a_data": Out(data.ArrayLayout(signed(8), lanes)),
            "b_addr": In(data.ArrayLayout(unsigned(max(1, (b_rows - 1).bit_length())), lanes_out)),
            "b_en": In(1),
            "b_data": Out(data.ArrayLayout(data.ArrayLayout(signed(8), rank), lanes_out)),
            "a_mult": Out(15), "a_shift": Out(6), "b_mult": Out(15), "b_shift": Out(6),
        })

    def elaborate(self, platform: object) -> Module:
        m = Module()
        m.d.comb += self.write.ready.eq(self.accept)
        # a host write is registered before its decode, and the decode before the memories (2 cycles): the
        # link's executor, the slot decode and a LoRA A write enable across the die in one cycle were the routed
        # int4 4 x 32 build's critical path (23.8 ns, Fmax 42.0 MHz, 2026-12-07); writes come between tokens
        we = Signal()
        laddr, ldata = Signal.like(self.write.payload.addr), Signal.like(self.write.payload.data)
        m.d.sync += [we.eq(self.write.valid & self.accept), laddr.eq(self.write.payload.addr),
                     ldata.eq(self.write.payload.data)]
        scales = {name: Signal.like(getattr(self, name), name=f"sel_{name}") for name in RESET}
        m.d.sync += [getattr(self, name).eq(scale) for name, scale in scales.items()]
        for n, slot in enumerate(self.slots):
            a_rd, b_rd = self._slot_memories(m, n, slot, we, laddr, ldata)
            regs = self._slot_registers(m, n, slot, we, laddr, ldata)
            with m.If(self.sel == n):
                m.d.comb += self.a_data.eq(a_rd.data)
                m.d.comb += [self.b_data[e].eq(port.data) for e, port in enumerate(b_rd)]
                m.d.comb += [scales[name].eq(regs[name]) for name in RESET]
        return m

    def _slot_memories(self, m: Module, n: int, slot: LoraSlot, we: Signal, laddr: Signal,
                       ldata: Signal) -> tuple[object, list]:
        """Slot n's A (word j * chunks + k // lanes, lane k % lanes) and B (word o, element j), with their host
        write decode; padding addresses of the power-of-two strides write nothing."""
        lanes, rank = self.lanes, self.rank
        c_in = -(-slot.in_features // lanes)
        a_mem, b_mem = self.memories[f"lora_a{n}"], self.memories[f"lora_b{n}"]
        m.submodules[f"a{n}"], m.submodules[f"b{n}"] = a_mem, b_mem
        a_rd = a_mem.read_port()
        m.d.comb += [a_rd.addr.eq(self.a_addr), a_rd.en.eq(self.a_en)]
        b_rd = [b_mem.read_port() for _ in range(self.lanes_out)]
        m.d.comb += [port.addr.eq(self.b_addr[e]) for e, port in enumerate(b_rd)]
        m.d.comb += [port.en.eq(self.b_en) for port in b_rd]
        a_wr, b_wr = a_mem.write_port(granularity=1), b_mem.write_port(granularity=1)
        a_off = Signal(range(rank * slot.a_stride), name=f"slot{n}_a_off")
        m.d.comb += a_off.eq(laddr - slot.a_base)
        k, j = _split(a_off, (slot.a_stride - 1).bit_length())
        a_in = (laddr < slot.b_base) if slot.a_base == 0 else (laddr >= slot.a_base) & (laddr < slot.b_base)
        if slot.in_features < slot.a_stride:  # padding addresses: ignored (constant compares upset lint)
            a_in &= k < slot.in_features
        lane, word_in_row = _split(k, (lanes - 1).bit_length())
        m.d.sync += [a_wr.addr.eq(j * c_in + word_in_row), a_wr.en.eq(Mux(we & a_in, 1 << lane, 0))]
        m.d.sync += [a_wr.data[e].eq(ldata[:8]) for e in range(lanes)]
        b_off = Signal(range(slot.out_features * slot.b_stride), name=f"slot{n}_b_off")
        m.d.comb += b_off.eq(laddr - slot.b_base)
        jb, o = _split(b_off, (slot.b_stride - 1).bit_length())
        b_in = (laddr >= slot.b_base) & (laddr < slot.reg_base)
        if rank < slot.b_stride:
            b_in &= jb < rank
        m.d.sync += [b_wr.addr.eq(o), b_wr.en.eq(Mux(we & b_in, 1 << jb, 0))]
        m.d.sync += [b_wr.data[e].eq(ldata[:8]) for e in range(rank)]
        return a_rd, b_rd

    def _slot_registers(self, m: Module, n: int, slot: LoraSlot, we: Signal, laddr: Signal,
                        ldata: Signal) -> dict[str, Signal]:
        """a_mult, a_shift, b_mult, b_shift of slot n, at reg_base + 0..3, reset to the all-zero adapter's."""
        regs = {}
        for index, (name, init) in enumerate(RESET.items()):
            regs[name] = reg = Signal(15 if name.endswith("mult") else 6, init=init, name=f"slot{n}_{name}")
            with m.If(we & (laddr == slot.reg_base + index)):
                m.d.sync += reg.eq(ldata[:len(reg)])
        return regs

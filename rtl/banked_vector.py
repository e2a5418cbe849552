"""A vector kept in `banks` element memories, so that any run of `banks` consecutive elements
is read, or written, in one cycle.

Element i lives in bank i % banks at word i // banks; a run starting anywhere touches each bank
once. The decoder's wide epilogue writes `count` rows of a projection per cycle into q, k, the
gate and the residual this way, and reads them back as runs (the residual's update, the gate for
the GLU) or one element at a time (RoPE's pairs, the norm). With one bank it is a plain memory.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib.memory import Memory


class BankedVector:
    """`size` elements of `shape` in `banks` memories; `readers` independent run readers (comb, LUT RAM).

    Drive `wr_base`, `wr_values[0..banks)`, `wr_count` and `wr_en` to write elements wr_base ..
    wr_base + wr_count - 1 from wr_values[0..wr_count); drive `rd_base[r]` and read element
    rd_base[r] + e in `rd_values[r][e]`.
    """

    def __init__(self, m: Module, name: str, shape: object, size: int, banks: int, readers: int = 1) -> None:
        assert banks >= 1 and not banks & (banks - 1), "banks is a power of two"
        self.banks, self.size, self.bits = banks, size, (banks - 1).bit_length()
        depth = -(-size // banks)
        self.memories = [Memory(shape=shape, depth=depth, init=[]) for _ in range(banks)]
        for b, mem in enumerate(self.memories):
            m.submodules[f"{name}{b}" if banks > 1 else name] = mem
        self.wr_base, self.wr_count, self.wr_en = Signal(range(size + 1)), Signal(range(banks + 1)), Signal()
        self.wr_values = [Signal(shape, name=f"{name}_wr_value{e}") for e in range(banks)]
        self.rd_base = [Signal(range(size + 1), name=f"{name}_rd_base{r}") for r in range(readers)]
        self.rd_values = [[Signal(shape, name=f"{name}_rd{r}_value{e}") for e in range(banks)] for r in range(readers)]
        write_ports = [mem.write_port() for mem in self.memories]
        for b, port in enumerate(write_ports):
            lane = self._lane(m, f"{name}_wr_lane{b}", self.wr_base, b)  # which value of the run bank b holds
            m.d.comb += [port.addr.eq((self.wr_base + lane) >> self.bits), port.en.eq(self.wr_en & (lane < self.wr_count)),
                         port.data.eq(self._pick(self.wr_values, lane))]
        for r in range(readers):
            ports = [mem.read_port(domain="comb") for mem in self.memories]
            for b, port in enumerate(ports):
                lane = self._lane(m, f"{name}_rd{r}_lane{b}", self.rd_base[r], b)
                m.d.comb += port.addr.eq((self.rd_base[r] + lane) >> self.bits)
            for e in range(banks):  # element rd_base + e is in bank (rd_base + e) % banks
                m.d.comb += self.rd_values[r][e].eq(self._pick([port.data for port in ports],
                                                               (self.rd_base[r] + e)[:self.bits] if banks > 1 else 0))

    def _lane(self, m: Module, name: str, base: Signal, bank: int) -> Signal:
        """(bank - base) mod banks: the place in a run from `base` of the element bank `bank` holds."""
        lane = Signal(range(max(2, self.banks)), name=name)
        if self.banks > 1:
            m.d.comb += lane.eq((bank + self.banks - base[:self.bits])[:self.bits])
        return lane

    @staticmethod
    def _pick(values: list, index: object) -> object:
        """values[index] as a mux tree (index may be a constant 0)."""
        if len(values) == 1:
            return values[0]
        result = values[0]
        for e in range(1, len(values)):
            result = Mux(index == e, values[e], result)
        return result

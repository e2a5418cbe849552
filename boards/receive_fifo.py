"""ReceiveFifo: the host link's receive FIFO, which keeps the UART line from ever stalling while a checked frame
waits for the executor (docs/protocol.md, "Bytes sent ahead").

Every byte from `i` is taken at once (its ready is always 1) into a FIFO of `depth` bytes, which the receiver reads
from `o`. A byte that finds the FIFO full is dropped (`dropped` strobes), and so is every later one while `lost` is
set; the receiver clears `lost` when it reports the overflow, once it has read all the FIFO held and the line has
been quiet. HostLink checks the depth (rx_depth).
"""

from amaranth.hdl import Module
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out


class ReceiveFifo(wiring.Component):
    i: In(stream.Signature(8))  # bytes from UartRx: always taken
    o: Out(stream.Signature(8))  # bytes to the receiver
    empty: Out(1)  # the receiver has read every byte the FIFO held
    lost: Out(1)  # bytes were dropped: none is taken until `clear`
    clear: In(1)  # strobe: the overflow is being reported, take bytes again
    dropped: Out(1)  # strobe: a byte from `i` found the FIFO full (or an overflow not yet reported)

    def __init__(self, depth: int) -> None:
        self.depth = depth
        super().__init__()

    def elaborate(self, platform: object) -> Module:
        m = Module()
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=8, depth=self.depth)
        m.d.comb += [self.i.ready.eq(1), fifo.w_data.eq(self.i.payload), self.o.valid.eq(fifo.r_rdy),
                     self.o.payload.eq(fifo.r_data), fifo.r_en.eq(self.o.ready), self.empty.eq(fifo.r_level == 0)]
        with m.If(self.clear):
            m.d.sync += self.lost.eq(0)
        # the write side, after the clear: a byte dropped in the cycle that clears `lost` sets it again
        with m.If(self.i.valid):
            with m.If(fifo.w_rdy & ~self.lost):
                m.d.comb += fifo.w_en.eq(1)
            with m.Else():
                m.d.sync += self.lost.eq(1)
                m.d.comb += self.dropped.eq(1)
        return m

"""HostLink: the host protocol (host/protocol.py) between the UART byte streams and the Decoder.

Three parts run side by side, so that a RESET can stop a GENERATE that is streaming tokens:
  receiver  parses frames from `rx` into one bank of a 2 x 256-byte buffer, checks the CRC, op
            and length of the whole frame, then hands it to the executor (or answers it with an
            ERROR itself); it owns the frame timeout and the garbage rule;
  executor  acts on one command at a time, driving the Decoder's `tokens` and `lora` ports and
            reading its `out` and `status`;
  sender    turns reply requests (the receiver's errors first, then the executor's replies)
            into frames on `tx`, one whole frame at a time, so replies never interleave.
The receiver fills the bank the executor is not reading, so a frame arriving during a FEED or
LORA is parsed and then waits for the executor (it is never acted on before its CRC is known).

While a checked frame waits, the line keeps going: every byte from `rx` is taken at once into a
receive FIFO of `rx_depth` bytes (receive_fifo.py; 512: one block RAM on the ECP5 and the iCE40,
room for the longest frame, 259 bytes, and more). Bytes it cannot hold are dropped until the line
has been quiet; then the frame cut short there (and any garbage) make one ERROR OVERFLOW: nothing
is lost without an error.

Two checks of the protocol's version 2 cost valid frames no cycle: the receiver follows the address each LORA word
goes to as its bytes arrive and remembers a word whose low 6 bits are 0 bound for a shift register (`lora_shifts`),
so CHECK refuses such a frame as a whole (ERROR BAD_LORA_SHIFT) before a word of it is written; and posting an ERROR
OVERFLOW sets STATUS's sticky overflow flag, which only RESET clears.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..host import protocol
from ..rtl.decoder import status_layout, token_layout
from .link_codes import REPLY_BYTES, REPLY_LAYOUT, Error, Op, Reply, crc8_step
from .receive_fifo import ReceiveFifo

RX_DEPTH = 512  # bytes the receive FIFO holds while a checked frame waits (docs/protocol.md, "Bytes sent ahead")


class HostLink(wiring.Component):
    """Protocol engine; `timeout` is the frame timeout in clock cycles (docs/protocol.md)."""

    def __init__(self, *, vocab: int, context: int, lanes: int, lora_addr_bits: int, timeout: int,
                 rx_depth: int = RX_DEPTH, lora_shifts: tuple[int, ...] | list[int] = ()) -> None:
        try:
            for name, value, low, high in (("vocab", vocab, 1, (1 << 16) - 1), ("context", context, 1, (1 << 16) - 1),
                                           ("lanes", lanes, 1, 255), ("lora_addr_bits", lora_addr_bits, 1, 24),
                                           ("timeout", timeout, 1, 1 << 32), ("rx_depth", rx_depth, 2, 1 << 16)):
                if not isinstance(value, int) or not low <= value <= high:
                    raise ValueError(f"{name} must be an integer from {low} to {high}, got {value!r}")
            for address in lora_shifts:  # the shift registers' addresses (rtl/lora_map.py shift_addresses)
                if not isinstance(address, int) or not 0 <= address < 1 << lora_addr_bits:
                    raise ValueError(f"lora_shifts must be addresses below 2**lora_addr_bits = {1 << lora_addr_bits}, "
                                     f"got {address!r}")
        except ValueError:
            self._MustUse__silence = True
            raise
        self.vocab, self.context, self.lanes, self.timeout, self.rx_depth = vocab, context, lanes, timeout, rx_depth
        self.lora_addr_bits, self.lora_shifts = lora_addr_bits, tuple(sorted(set(lora_shifts)))
        self.token_bits = max(1, (vocab - 1).bit_length())
        super().__init__({
            "rx": In(stream.Signature(8)),  # bytes from UartRx: always taken (ready is 1), into the receive FIFO
            "tx": Out(stream.Signature(8)),  # bytes to UartTx
            "tokens": Out(stream.Signature(token_layout(vocab))),
            "out": In(stream.Signature(unsigned(self.token_bits))),
            "status": In(status_layout()),
            "lora": Out(stream.Signature(data.StructLayout({"addr": unsigned(lora_addr_bits), "data": unsigned(16)}))),
            "generating": Out(1),  # a GENERATE is running
            "token_sent": Out(1),  # strobe: a TOKEN reply started
            "error_sent": Out(1),  # strobe: an ERROR reply started
            "dropped": Out(1),  # strobe: a byte from rx found the receive FIFO full (or an overflow not yet reported)
        })

    def elaborate(self, platform: object) -> Module:
        m = Module()
        m.submodules.buffer = buffer = Memory(shape=8, depth=512, init=[])  # two banks of a whole payload
        wr = buffer.write_port()
        rd = buffer.read_port()

        # -- wires between the three parts
        err_pending = Signal()  # receiver → sender: an ERROR reply with err_code is waiting
        err_code = Signal(Error, init=Error.BAD_CRC)
        cmd_valid, cmd_ready = Signal(), Signal()  # receiver → executor: a checked frame
        exec_idle = Signal()
        rep = Signal(REPLY_LAYOUT, init={"op": Reply.ACK})  # executor → sender: the reply to send while rep_valid
        rep_valid, rep_take = Signal(), Signal()
        m.d.comb += self.generating.eq(0)

        # -- receive FIFO: the line is never stalled; a byte it cannot hold starts an overflow
        m.submodules.rx_fifo = fifo = ReceiveFifo(self.rx_depth)
        wiring.connect(m, wiring.flipped(self.rx), fifo.i)
        lost = fifo.lost  # bytes were dropped: take none until the FIFO is read empty and the line is quiet
        m.d.comb += self.dropped.eq(fifo.dropped)

        # -- receiver -------------------------------------------------------------------
        quiet_count = Signal(range(self.timeout + 1))
        line_quiet = Signal()  # no byte on the line for the timeout (the count stops there)
        quiet = Signal()  # ... and the receiver has read all the FIFO holds
        m.d.comb += [line_quiet.eq(quiet_count == self.timeout), quiet.eq(line_quiet & fifo.empty)]
        with m.If(self.rx.valid):
            m.d.sync += quiet_count.eq(0)
        with m.Elif(~line_quiet):
            m.d.sync += quiet_count.eq(quiet_count + 1)

        op = Signal(Op, init=Op.RESET)
        length = Signal(8)
        count = Signal(8)
        crc = Signal(8)
        head = Signal(24)  # the first three payload bytes: GENERATE's N, LORA's address
        nonzero = Signal()  # some payload byte is not zero (GENERATE N >= 1)
        garbage = Signal()  # non-SYNC bytes dropped since the line was last quiet
        # LORA: the port address of the word being received (wrapping as the port does), whether it is a shift register
        # (registered: looked up a cycle after the address changes, used at the word's high byte), whether the word's
        # low byte leaves the 6 bits a shift register keeps 0, and whether any word so far would write 0 to one
        waddr = Signal(self.lora_addr_bits)
        at_shift = Signal()
        low_zero = Signal()
        zero_shift = Signal()
        m.d.sync += at_shift.eq(Cat(*[waddr == a for a in self.lora_shifts]).any() if self.lora_shifts else 0)
        overflowed = Signal()  # STATUS flag: an ERROR OVERFLOW was posted since the last RESET
        wbank = Signal()
        can_post = Signal()  # errors wait while a FEED or LORA runs, so replies stay in order
        m.d.comb += can_post.eq(exec_idle | self.generating)

        def post(code: Error) -> list:
            return [err_pending.eq(1), err_code.eq(code)]

        byte = fifo.o.payload
        got = fifo.o.valid  # a byte to parse (rx_ready below takes it)
        rx_ready = fifo.o.ready
        m.d.comb += [wr.addr.eq(Cat(count, wbank)), wr.data.eq(byte)]
        with m.FSM(name="receiver"):
            with m.State("IDLE"):
                m.d.comb += rx_ready.eq(1)
                with m.If(got):
                    with m.If(byte == protocol.SYNC):
                        m.d.sync += crc.eq(0)
                        m.next = "OP"
                    with m.Else():
                        m.d.sync += garbage.eq(1)
                with m.Elif(quiet & lost):
                    m.d.comb += fifo.clear.eq(1)
                    m.next = "OVERFLOW"
                with m.Elif(quiet & garbage & can_post & ~err_pending):
                    m.d.sync += [*post(Error.GARBAGE), garbage.eq(0)]
            with m.State("OP"):
                m.d.comb += rx_ready.eq(1)
                with m.If(got):
                    m.d.sync += [op.eq(byte), crc.eq(crc8_step(crc, byte))]
                    m.next = "LEN"
                with m.Elif(quiet & lost):
                    m.d.comb += fifo.clear.eq(1)
                    m.next = "OVERFLOW"
                with m.Elif(quiet):
                    m.next = "TIMEOUT"
            with m.State("LEN"):
                m.d.comb += rx_ready.eq(1)
                with m.If(got):
                    m.d.sync += [length.eq(byte), crc.eq(crc8_step(crc, byte)), count.eq(0), head.eq(0),
                                 nonzero.eq(0), zero_shift.eq(0)]
                    m.next = "CRC"
                    with m.If(byte != 0):
                        m.next = "PAYLOAD"
                with m.Elif(quiet & lost):
                    m.d.comb += fifo.clear.eq(1)
                    m.next = "OVERFLOW"
                with m.Elif(quiet):
                    m.next = "TIMEOUT"
            with m.State("PAYLOAD"):
                m.d.comb += rx_ready.eq(1)
                with m.If(got):
                    m.d.comb += wr.en.eq(1)
                    m.d.sync += [crc.eq(crc8_step(crc, byte)), count.eq(count + 1), nonzero.eq(nonzero | (byte != 0))]
                    for i in range(3):
                        with m.If(count == i):
                            m.d.sync += head[8 * i:8 * i + 8].eq(byte)
                    # LORA words: the low byte at an odd count from 3, the high byte after it; the address from count 2
                    with m.If(count == 2):
                        m.d.sync += waddr.eq(Cat(head[:16], byte))
                    with m.Elif(count[0]):
                        m.d.sync += low_zero.eq(byte[:6] == 0)
                    with m.Elif(count != 0):
                        m.d.sync += [zero_shift.eq(zero_shift | (at_shift & low_zero)), waddr.eq(waddr + 1)]
                    with m.If(count == length - 1):
                        m.next = "CRC"
                with m.Elif(quiet & lost):
                    m.d.comb += fifo.clear.eq(1)
                    m.next = "OVERFLOW"
                with m.Elif(quiet):
                    m.next = "TIMEOUT"
            with m.State("CRC"):
                m.d.comb += rx_ready.eq(1)
                with m.If(got):
                    m.d.sync += crc.eq(crc8_step(crc, byte))  # over the whole frame with its CRC: 0 if intact
                    m.next = "CHECK"
                with m.Elif(quiet & lost):
                    m.d.comb += fifo.clear.eq(1)
                    m.next = "OVERFLOW"
                with m.Elif(quiet):
                    m.next = "TIMEOUT"
            # a frame stopped part-way: it and any garbage before it make one error
            with m.State("TIMEOUT"), m.If(can_post & ~err_pending):
                m.d.sync += [*post(Error.TIMEOUT), garbage.eq(0)]
                m.next = "IDLE"
            # bytes were dropped after what the FIFO held: the frame cut short there and any garbage make one error
            with m.State("OVERFLOW"), m.If(can_post & ~err_pending):
                m.d.sync += [*post(Error.OVERFLOW), garbage.eq(0), overflowed.eq(1)]
                m.next = "IDLE"
            with m.State("CHECK"):
                known, length_ok, shift_ok = Signal(), Signal(), Signal(init=1)
                with m.Switch(op):
                    with m.Case(Op.RESET, Op.STATUS, Op.HELLO):
                        m.d.comb += [known.eq(1), length_ok.eq(length == 0)]
                    with m.Case(Op.FEED):
                        m.d.comb += [known.eq(1), length_ok.eq(~length[0] & (length >= 2))]
                    with m.Case(Op.GENERATE):
                        m.d.comb += [known.eq(1), length_ok.eq((length == 2) & nonzero)]
                    with m.Case(Op.LORA):
                        m.d.comb += [known.eq(1), length_ok.eq(length[0] & (length >= 5)), shift_ok.eq(~zero_shift)]
                with m.If((crc != 0) | ~known | ~length_ok | ~shift_ok), m.If(can_post & ~err_pending):
                    m.d.sync += post(Mux(crc != 0, Error.BAD_CRC, Mux(~known, Error.UNKNOWN_OP,
                                                                      Mux(~length_ok, Error.BAD_LENGTH,
                                                                          Error.BAD_LORA_SHIFT))))
                    m.next = "IDLE"
                with m.Elif(self.generating & (op != Op.RESET)), m.If(~err_pending):
                    m.d.sync += post(Error.BUSY)
                    m.next = "IDLE"
                with m.Else():
                    m.d.comb += cmd_valid.eq(1)
                    with m.If(cmd_ready):
                        m.d.sync += wbank.eq(~wbank)
                        m.next = "IDLE"

        # -- executor -------------------------------------------------------------------
        tb = self.token_bits
        fresh = Signal(init=1)  # the next token fed starts a new sequence
        have_pred = Signal()
        pred = Signal(tb)
        current = Signal(16)  # the token id being fed
        left = Signal(16)  # GENERATE: tokens still to send
        bank = Signal()
        end = Signal(8)  # payload length of the command being run
        ptr = Signal(8)
        low = Signal(8)
        word = Signal(16)
        lora_addr = Signal(24)
        m.d.comb += rd.addr.eq(Cat(ptr, bank))

        def reply(code: Reply, payload: Value | int = 0, length: int = 0) -> list:
            return [rep.op.eq(code), rep.length.eq(length), rep.payload.eq(payload)]

        def fail(code: Error) -> None:
            m.d.sync += [*reply(Reply.ERROR, code, 1), have_pred.eq(0)]
            m.next = "SEND"

        def no_output() -> None:
            """The decoder consumed `current` without output: out of vocabulary, or the context was full."""
            fail(Mux(current >= self.vocab, Error.BAD_TOKEN, Error.CONTEXT_FULL))

        def abort_on_reset(nxt: str) -> None:
            m.d.comb += cmd_ready.eq(op == Op.RESET)
            with m.If(cmd_valid & cmd_ready):
                m.d.sync += [*reply(Reply.ACK), fresh.eq(1), have_pred.eq(0), overflowed.eq(0)]
                m.next = nxt

        flags = Cat(self.status.context_full, self.status.bad_token, self.status.busy, overflowed, Const(0, 4))
        hello = Cat(Const(ord("H"), 8), Const(ord("W"), 8), Const(protocol.PROTOCOL_VERSION, 8),
                    Const(self.vocab, 16), Const(self.context, 16), Const(self.lanes, 8))
        with m.FSM(name="executor"):
            with m.State("IDLE"):
                m.d.comb += [exec_idle.eq(1), cmd_ready.eq(1)]
                with m.If(cmd_valid):
                    m.d.sync += [bank.eq(wbank), end.eq(length), ptr.eq(0)]
                    with m.Switch(op):
                        with m.Case(Op.RESET):
                            m.d.sync += [*reply(Reply.ACK), fresh.eq(1), have_pred.eq(0), overflowed.eq(0)]
                            m.next = "SEND"
                        with m.Case(Op.FEED):
                            m.next = "FEED_READ"
                        with m.Case(Op.GENERATE):
                            with m.If(~have_pred):
                                fail(Error.NO_PREDICTION)
                            with m.Else():
                                m.d.sync += [*reply(Reply.TOKEN, pred, 2), left.eq(head[:16])]
                                m.next = "GEN_TOKEN"
                        with m.Case(Op.LORA):
                            m.d.sync += [ptr.eq(3), lora_addr.eq(head)]
                            m.next = "LORA_READ"
                        with m.Case(Op.STATUS):
                            m.d.sync += reply(Reply.STATUS, Cat(self.status.tokens, self.status.cycles,
                                                                self.status.position, flags), 11)
                            m.next = "SEND"
                        with m.Case(Op.HELLO):
                            m.d.sync += reply(Reply.HELLO, hello, 8)
                            m.next = "SEND"
            # two bytes from the buffer (read port: one cycle), then the token is checked and fed
            with m.State("FEED_READ"):
                m.d.sync += ptr.eq(ptr + 1)
                m.next = "FEED_LOW"
            with m.State("FEED_LOW"):
                m.d.sync += [low.eq(rd.data), ptr.eq(ptr + 1)]
                m.next = "FEED_HIGH"
            with m.State("FEED_HIGH"):
                value = Cat(low, rd.data)
                m.d.sync += current.eq(value)
                m.next = "FEED_OFFER"
                if tb < 16:
                    with m.If(value[tb:] != 0):  # does not fit the token port: never fed
                        fail(Error.BAD_TOKEN)
            with m.State("FEED_OFFER"):
                m.d.comb += [self.tokens.valid.eq(1), self.tokens.payload.token.eq(current),
                             self.tokens.payload.new_seq.eq(fresh)]
                with m.If(self.tokens.ready):
                    m.d.sync += fresh.eq(0)
                    m.next = "FEED_WAIT"
            with m.State("FEED_WAIT"):
                m.d.comb += self.out.ready.eq(1)
                with m.If(self.out.valid):
                    m.d.sync += [pred.eq(self.out.payload), have_pred.eq(1)]
                    with m.If(ptr == end):
                        m.d.sync += reply(Reply.ACK)
                        m.next = "SEND"
                    with m.Else():
                        m.next = "FEED_READ"
                with m.Elif(~self.status.busy):
                    no_output()
            # GENERATE: send the prediction, feed it, its output is the next prediction
            with m.State("GEN_TOKEN"):
                m.d.comb += [self.generating.eq(1), rep_valid.eq(1)]
                with m.If(rep_take):
                    m.d.sync += [current.eq(pred), left.eq(left - 1)]
                    m.next = "GEN_OFFER"
                abort_on_reset("SEND")
            with m.State("GEN_OFFER"):  # the decoder is idle here, so this lasts one cycle
                m.d.comb += [self.generating.eq(1), self.tokens.valid.eq(1), self.tokens.payload.token.eq(pred),
                             self.tokens.payload.new_seq.eq(fresh)]
                with m.If(self.tokens.ready):
                    m.d.sync += fresh.eq(0)
                    m.next = "GEN_WAIT"
            with m.State("GEN_WAIT"):
                m.d.comb += [self.generating.eq(1), self.out.ready.eq(1)]
                with m.If(self.out.valid):
                    m.d.sync += pred.eq(self.out.payload)
                    with m.If(left == 0):
                        m.d.sync += reply(Reply.ACK)
                        m.next = "SEND"
                    with m.Else():
                        m.d.sync += reply(Reply.TOKEN, self.out.payload, 2)
                        m.next = "GEN_TOKEN"
                with m.Elif(~self.status.busy):
                    no_output()
                abort_on_reset("DRAIN")
            with m.State("DRAIN"):  # RESET during GENERATE: the token in flight finishes, unused
                m.d.comb += self.out.ready.eq(1)
                with m.If(self.out.valid | ~self.status.busy):
                    m.next = "SEND"
            # LORA: address from the frame's first three bytes, then one word per write
            with m.State("LORA_READ"):
                m.d.sync += ptr.eq(ptr + 1)
                m.next = "LORA_LOW"
            with m.State("LORA_LOW"):
                m.d.sync += [low.eq(rd.data), ptr.eq(ptr + 1)]
                m.next = "LORA_HIGH"
            with m.State("LORA_HIGH"):
                m.d.sync += word.eq(Cat(low, rd.data))
                m.next = "LORA_WRITE"
            with m.State("LORA_WRITE"):
                m.d.comb += [self.lora.valid.eq(1), self.lora.payload.addr.eq(lora_addr),
                             self.lora.payload.data.eq(word)]
                with m.If(self.lora.ready):
                    m.d.sync += lora_addr.eq(lora_addr + 1)
                    with m.If(ptr == end):
                        m.d.sync += reply(Reply.ACK)
                        m.next = "SEND"
                    with m.Else():
                        m.next = "LORA_READ"
            with m.State("SEND"):
                m.d.comb += rep_valid.eq(1)
                with m.If(rep_take):
                    m.next = "IDLE"

        # -- sender ---------------------------------------------------------------------
        s_op = Signal(8)
        s_left = Signal(4)
        s_payload = Signal(8 * REPLY_BYTES)
        s_crc = Signal(8)
        m.d.sync += [self.token_sent.eq(0), self.error_sent.eq(0)]
        with m.FSM(name="sender"):
            with m.State("IDLE"):
                with m.If(err_pending):
                    m.d.sync += [s_op.eq(Reply.ERROR), s_left.eq(1), s_payload.eq(err_code), err_pending.eq(0),
                                 self.error_sent.eq(1)]
                    m.next = "SYNC"
                with m.Elif(rep_valid):
                    m.d.comb += rep_take.eq(1)
                    m.d.sync += [s_op.eq(rep.op), s_left.eq(rep.length), s_payload.eq(rep.payload),
                                 self.token_sent.eq(rep.op == Reply.TOKEN), self.error_sent.eq(rep.op == Reply.ERROR)]
                    m.next = "SYNC"
            with m.State("SYNC"):
                m.d.comb += [self.tx.valid.eq(1), self.tx.payload.eq(protocol.SYNC)]
                with m.If(self.tx.ready):
                    m.d.sync += s_crc.eq(crc8_step(Const(0, 8), s_op))
                    m.next = "OP"
            with m.State("OP"):
                m.d.comb += [self.tx.valid.eq(1), self.tx.payload.eq(s_op)]
                with m.If(self.tx.ready):
                    m.d.sync += s_crc.eq(crc8_step(s_crc, s_left))
                    m.next = "LEN"
            with m.State("LEN"):
                m.d.comb += [self.tx.valid.eq(1), self.tx.payload.eq(s_left)]
                with m.If(self.tx.ready):
                    m.next = "PAYLOAD"
                    with m.If(s_left == 0):
                        m.next = "CRC"
            with m.State("PAYLOAD"):
                m.d.comb += [self.tx.valid.eq(1), self.tx.payload.eq(s_payload[:8])]
                with m.If(self.tx.ready):
                    m.d.sync += [s_crc.eq(crc8_step(s_crc, s_payload[:8])), s_payload.eq(s_payload[8:]),
                                 s_left.eq(s_left - 1)]
                    with m.If(s_left == 1):
                        m.next = "CRC"
            with m.State("CRC"):
                m.d.comb += [self.tx.valid.eq(1), self.tx.payload.eq(s_crc)]
                with m.If(self.tx.ready):
                    m.next = "IDLE"
        return m

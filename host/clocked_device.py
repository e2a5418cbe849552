"""`ClockedDevice` is the same engine as host/emulator.py's EmulatedDevice, on the board's clock: the FIFO,
receiver, executor, sender and UART transmitter stepped cycle by cycle as the RTL steps them, the decoder taking its
exact cycles per token, so that it gives the RTL's replies in the RTL's cycles, BUSY and OVERFLOW included; the RTL's
tests (sim/tb_link.py, the soak) hold every reply byte of BoardCore equal to it, and in the same cycle. The decoder
side (the reference decoder, the LoRA SRAM, the prediction, the status flags) and the check of a whole frame are the
two engines' common part (`Chip`, host/emulator_chip.py).
"""

from __future__ import annotations

import struct
from collections import deque

from ..boards.host_link import RX_DEPTH
from ..quant.qmodel import QModel
from . import protocol
from .emulator_chip import BYTE_BITS, Chip, error_reply
from .protocol import SYNC, Error, Op, Reply


class ClockedDevice(Chip):
    """The device on the board's clock: BoardCore's UART, host link and decoder cycle for cycle, so that for any
    bytes at any cycles it gives the RTL's replies at the RTL's cycles (the oracle of the RTL's soak, sim/tb_link.py).

    Each part of boards/host_link.py is a state machine here, stepped once per clock cycle on the registers as they
    stand at the cycle's start, with the RTL's states and conditions:
      FIFO      a byte UartRx offers in cycle a is written then and can be read from a + 2, one a cycle; it is dropped
                (and `lost` set) when `lost` is set or rx_depth - 1 bytes wait behind the output register;
      receiver  reads a byte a cycle in IDLE, OP, LEN, PAYLOAD and CRC; CHECK the cycle after the CRC byte (the
                verdict, LORA's shift check included, ready then: the RTL follows the words as they arrive); posts an
                error when the executor is idle or generating and no error waits (BUSY: when none waits); acts on a
                quiet line once no byte has arrived for `timeout` cycles and the FIFO is empty; posting ERROR
                OVERFLOW sets STATUS's overflow flag, taking a RESET clears it;
      executor  FEED: per token three cycles to read it, one to hand it over, the decode; GENERATE: per token its
                TOKEN offered until the sender takes it, one cycle to hand the token over, the decode; LORA: four
                cycles a word; RESET stops a GENERATE while its TOKEN waits or a token decodes (generating: those
                states and the hand-over);
      sender    a waiting receiver error before the executor's reply, one frame at a time, each byte handed to the
                UART when it is idle: a byte every 10 x divisor + 1 cycles;
      decoder   from taking a token to offering its output: cycles_per_token_estimate(position) - 1 cycles (the
                estimate is exact: tests/test_sim_cocotb.py), or no output and its error flag the next cycle.
    Times are clock cycles: `receive(data, now)` gives bytes as UartRx offers them, the first in cycle `now` and one
    each 10 x divisor cycles after it (bytes must come in time order); `sent` lists each reply byte with the cycle the
    UART took it. STATUS counts the clock from `counter_zero` as the chip does (None: the decoding cycles, as
    EmulatedDevice counts them). `met` counts what the traffic reached; `trace`, when set to a list, records the
    executor's states.
    """

    READING = ("IDLE", "OP", "LEN", "PAYLOAD", "CRC")  # receiver states that read the FIFO
    GENERATING = ("GEN_TOKEN", "GEN_OFFER", "GEN_WAIT")  # executor states in which a command other than RESET is BUSY

    def __init__(self, qm: QModel, *, lanes: int, divisor: int, timeout: int, rows: int = 1, rx_depth: int = RX_DEPTH,
                 start: int = 0, counter_zero: int | None = None) -> None:
        super().__init__(qm, lanes=lanes, rows=rows, rx_depth=rx_depth)
        self.divisor, self.timeout = divisor, timeout
        self.counter_zero = counter_zero  # the cycle the chip's clock counter read 0 in (STATUS); None: count decoding
        self.byte_cycles = BYTE_BITS * divisor  # a byte on the line, either way
        self.now = start - 1  # the last cycle stepped; the line has been quiet and every part idle before `start`
        self.sent: list[tuple[int, int]] = []  # (cycle the UART took it, byte) for each reply byte
        # bytes that arrived while the sender held a reply, the most bytes the FIFO held, RESETs that stopped a GENERATE
        self.met = {"bytes_while_sending": 0, "max_fifo": 0, "generates_stopped": 0}
        self._acted = False  # something changed in the last cycle stepped: the next one may change too
        self.trace: list[tuple[int, str]] | None = None  # a list: (first cycle, state) of each executor state entered
        # line, FIFO and receiver
        self._last_rx = start - timeout - 1  # the last cycle a byte arrived in
        self._q: deque[tuple[int, int]] = deque()  # (byte, cycle written) in the FIFO
        self._lost = False
        self._rx = "IDLE"
        self._frame = bytearray()  # op, len, payload, crc of the frame being read
        self._verdict_now: Error | None = None  # CHECK: the whole frame's error, if any
        self._garbage = False
        self._err: Error | None = None  # a receiver error waiting for the sender (err_pending)
        # executor and decoder
        self._ex = "IDLE"
        self._cmd = b""  # the frame the executor runs: op, len, payload, crc
        self._i = 0  # FEED: the token read; LORA: the word written; GENERATE: tokens still to send
        self._rep = b""  # the reply the executor offers the sender in SEND and GEN_TOKEN
        self._dec_out: tuple[int, int] | None = None  # the decoder's output and the cycle it offers it from
        self._dec_error: Error | None = None  # the decoder refused the token it took: no output, this flag
        # sender and UART
        self._tx = b""  # the reply frame being sent; empty: the sender is idle
        self._tx_i = 0
        self._uart_free = start  # the first cycle the UART transmitter can take a byte

    @property
    def generating(self) -> bool:
        return self._ex in self.GENERATING

    def receive(self, data: bytes, now: int) -> bytes:
        """Bytes UartRx offers in cycles now, now + 10 x divisor, ...; -> reply bytes the UART took until the last."""
        first = len(self.sent)
        for k, byte in enumerate(data):
            at = now + k * self.byte_cycles
            self._run(at - 1)
            self._step(at, byte)
        return bytes(b for _, b in self.sent[first:])

    def poll(self, now: int) -> bytes:
        """Every cycle up to `now`; -> reply bytes the UART took in them."""
        first = len(self.sent)
        self._run(now)
        return bytes(b for _, b in self.sent[first:])

    def next_event(self) -> int | None:
        """The next cycle in which something changes if no byte arrives; None: nothing will."""
        return self.now + 1 if self._acted else self._wake()

    def run_idle(self) -> int:
        """Step on until nothing is left to do unless a byte arrives (bounded) -> the last cycle stepped."""
        for _ in range(1 << 22):
            at = self.next_event()
            if at is None:
                return self.now
            self._step(at)
        raise AssertionError(f"the emulator on the clock is still busy at cycle {self.now}")

    def _wake(self) -> int | None:
        """With nothing changed in the last cycle, the first cycle a timer can change something: a byte becoming
        readable, the line turning quiet, the decoder's output, the UART's next byte."""
        times = []
        if self._rx in self.READING:
            if self._q:
                times.append(self._q[0][1] + 2)
            elif self._rx != "IDLE" or self._lost or self._garbage:
                times.append(self._last_rx + self.timeout + 1)
        if self._dec_out is not None:
            times.append(self._dec_out[1])
        if self._tx:
            times.append(self._uart_free)
        times = [t for t in times if t > self.now]  # one already past waits on another part, which has not moved
        return min(times) if times else None

    def _run(self, until: int) -> None:
        while self.now < until:
            at = self.next_event()
            if at is None or at > until:
                self.now = until
                return
            self._step(at)

    def _step(self, c: int, arrival: int | None = None) -> None:
        """Cycle c: every part decides on the registers as they stand, then they all change."""
        assert c > self.now, f"cycle {c} after {self.now}"
        self.now, acted = c, arrival is not None
        ex, rx, err, rep = self._ex, self._rx, self._err, self._rep
        generating = ex in self.GENERATING
        can_post = ex == "IDLE" or generating
        got = bool(self._q) and self._q[0][1] <= c - 2  # the FIFO's output register holds a byte
        quiet = not self._q and c - self._last_rx > self.timeout
        op = self._frame[0] if rx == "CHECK" else None
        cmd_valid = rx == "CHECK" and self._verdict_now is None and not (generating and op != Op.RESET)
        cmd_take = cmd_valid and (ex == "IDLE" or (ex in ("GEN_TOKEN", "GEN_WAIT") and op == Op.RESET))
        idle_sender = not self._tx
        take_err = idle_sender and err is not None
        rep_take = idle_sender and err is None and ex in ("SEND", "GEN_TOKEN")
        dec_valid = self._dec_out is not None and c >= self._dec_out[1]
        dec_busy = self._dec_out is not None

        # the FIFO's write side: a byte that finds it full, or finds `lost` set, is dropped and sets `lost`
        clear = False
        if arrival is not None:
            if self._tx:
                self.met["bytes_while_sending"] += 1
            if self._lost or len(self._q) - got >= self.rx_depth - 1:
                self.dropped += 1
                drop = True
            else:
                self._q.append((arrival, c))
                drop = False
            self._last_rx = c

        # -- receiver
        post: Error | None = None
        if rx in self.READING:
            if got:
                acted = True
                byte = self._q.popleft()[0]
                if rx == "IDLE":
                    if byte == SYNC:
                        self._frame, self._rx = bytearray(), "OP"
                    else:
                        self._garbage = True
                else:
                    self._frame.append(byte)
                    if rx == "OP":
                        self._rx = "LEN"
                    elif rx == "LEN":
                        self._rx = "PAYLOAD" if byte else "CRC"
                    elif rx == "PAYLOAD":
                        self._rx = "CRC" if len(self._frame) == 2 + self._frame[1] else "PAYLOAD"
                    else:
                        self._rx, self._verdict_now = "CHECK", self._verdict(bytes(self._frame))
            elif quiet and self._lost:
                acted, clear, self._rx = True, True, "OVERFLOW"
            elif rx != "IDLE" and quiet:
                acted, self._rx = True, "TIMEOUT"
            elif rx == "IDLE" and quiet and self._garbage and can_post and err is None:
                acted, post, self._garbage = True, Error.GARBAGE, False
        elif rx in ("TIMEOUT", "OVERFLOW"):
            if can_post and err is None:
                acted, post, self._garbage, self._rx = True, Error[rx], False, "IDLE"
                self.overflowed |= rx == "OVERFLOW"  # STATUS's sticky flag (never in a cycle that takes a RESET)
        elif self._verdict_now is not None:  # CHECK, a bad frame
            if can_post and err is None:
                acted, post, self._rx = True, self._verdict_now, "IDLE"
        elif generating and op != Op.RESET:
            if err is None:
                acted, post, self._rx = True, Error.BUSY, "IDLE"
        elif cmd_take:
            acted, self._rx = True, "IDLE"
        if arrival is not None and drop:
            self._lost = True
        elif clear:
            self._lost = False
        self.met["max_fifo"] = max(self.met["max_fifo"], len(self._q))

        # -- executor
        if cmd_take:
            acted = True
            self._cmd = bytes(self._frame)
            if ex != "IDLE":  # RESET stops the GENERATE: from the decode, the token in flight finishes unused
                self.met["generates_stopped"] += 1
                self._rep, self._fresh, self._prediction = protocol.frame(Reply.ACK), True, None
                self.overflowed = False
                self._ex = "DRAIN" if ex == "GEN_WAIT" else "SEND"
                if ex == "GEN_WAIT" and dec_valid:  # its output is taken in this cycle, unused
                    self._dec_out = None
            else:
                self._start(c, Op(self._cmd[0]), self._cmd[2:-1])
        elif ex != "IDLE":
            acted |= self._execute_step(c, ex, rep_take, dec_valid, dec_busy)
        if self.trace is not None and self._ex != ex:
            self.trace.append((c + 1, self._ex))

        # -- sender and UART transmitter
        if self._tx and c >= self._uart_free:
            acted = True
            self.sent.append((c, self._tx[self._tx_i]))
            self._tx_i += 1
            self._uart_free = c + self.byte_cycles + 1
            if self._tx_i == len(self._tx):
                self._tx = b""
        elif take_err:
            acted, self._tx, self._tx_i, self._err = True, error_reply(err), 0, None
        elif rep_take:
            acted, self._tx, self._tx_i = True, rep, 0
        if post is not None:
            self._err = post
        self._acted = acted

    def _send(self, reply: bytes) -> None:
        self._rep, self._ex = reply, "SEND"

    def _fail(self, code: Error) -> None:
        self._prediction = None
        self._send(error_reply(code))

    def _start(self, c: int, op: Op, payload: bytes) -> None:
        """The executor takes a checked command (its IDLE state)."""
        self._i = 0
        if op == Op.RESET:
            self._fresh, self._prediction, self.overflowed = True, None, False
            self._send(protocol.frame(Reply.ACK))
        elif op == Op.FEED:
            self._ex = "FEED_READ"
        elif op == Op.GENERATE:
            if self._prediction is None:
                self._fail(Error.NO_PREDICTION)
            else:
                self._i = struct.unpack("<H", payload)[0]  # tokens still to send
                self._rep, self._ex = _token(self._prediction), "GEN_TOKEN"
        elif op == Op.LORA:
            self._ex = "LORA_READ"
        else:  # STATUS, HELLO
            self._send(self._report(op, None if self.counter_zero is None else (c - self.counter_zero) & 0xFFFFFFFF))

    def _offer(self, c: int, token: int) -> None:
        """The decoder takes `token` in cycle c."""
        assert self._dec_out is None and self._dec_error is None, "a token offered while the decoder is busy"
        before = self.cycles
        output, error = self._feed(token)
        if error is None:
            self._dec_out = (output, c + self.cycles - before - 1)
        else:
            self._dec_error = error

    def _execute_step(self, c: int, ex: str, rep_take: bool, dec_valid: bool, dec_busy: bool) -> bool:
        """One cycle of the executor in state `ex` (not IDLE) -> whether anything changed."""
        payload = self._cmd[2:-1]
        output = self._dec_out[0] if dec_valid else None
        if dec_valid:
            self._dec_out = None  # FEED_WAIT, GEN_WAIT and DRAIN take the decoder's output at once
        following = {"FEED_READ": "FEED_LOW", "FEED_LOW": "FEED_HIGH", "LORA_READ": "LORA_LOW", "LORA_LOW": "LORA_HIGH",
                     "LORA_HIGH": "LORA_WRITE", "FEED_OFFER": "FEED_WAIT", "GEN_OFFER": "GEN_WAIT"}
        if ex in following:
            if ex == "FEED_OFFER":
                self._offer(c, int.from_bytes(payload[2 * self._i:2 * self._i + 2], "little"))
            elif ex == "GEN_OFFER":
                self._offer(c, self._prediction)
            self._ex = following[ex]
        elif ex == "SEND" or ex == "GEN_TOKEN":
            if not rep_take:
                return False
            self._ex = "IDLE" if ex == "SEND" else "GEN_OFFER"
            self._i -= ex == "GEN_TOKEN"
        elif ex == "FEED_HIGH":  # a token that does not fit the decoder's port is never offered
            if int.from_bytes(payload[2 * self._i:2 * self._i + 2], "little") >> self.token_bits:
                self._fail(Error.BAD_TOKEN)
            else:
                self._ex = "FEED_OFFER"
        elif ex in ("FEED_WAIT", "GEN_WAIT"):
            if output is not None:
                self._prediction = output
                if ex == "FEED_WAIT":
                    self._i += 1
                    if 2 * self._i == len(payload):
                        self._send(protocol.frame(Reply.ACK))
                    else:
                        self._ex = "FEED_READ"
                elif self._i == 0:
                    self._send(protocol.frame(Reply.ACK))
                else:
                    self._rep, self._ex = _token(output), "GEN_TOKEN"
            elif dec_busy:
                return False
            else:
                self._fail(self._dec_error)
                self._dec_error = None
        elif ex == "DRAIN":
            if dec_busy and output is None:
                return False
            self._dec_error, self._ex = None, "SEND"
        elif ex == "LORA_WRITE":
            self.lora.write(int.from_bytes(payload[:3], "little") + self._i,
                            int.from_bytes(payload[3 + 2 * self._i:5 + 2 * self._i], "little"))
            self._lora_dirty = True
            self._i += 1
            if 3 + 2 * self._i == len(payload):
                self._send(protocol.frame(Reply.ACK))
            else:
                self._ex = "LORA_READ"
        else:
            raise AssertionError(f"executor state {ex}")
        return True


def _token(token: int) -> bytes:
    return protocol.frame(Reply.TOKEN, struct.pack("<H", token))

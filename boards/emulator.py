"""A board in software: the host protocol (boards/protocol.py) on a pseudo-terminal, decoding with
the integer reference, so the host side (client, `hardwire chat`) can be developed and tested
without a board and the protocol's semantics have one executable statement besides the RTL.

`EmulatedDevice` is the protocol engine of boards/host_link.py re-told in Python, decision for
decision: the receiver's frame timeout and garbage rule, its CRC / op / length checks of the
whole frame before anything is acted on, BUSY while a GENERATE runs, RESET aborting it, and
the decoder's flags (bad token, full context) with the error each one gives, and the receive
FIFO with its overflow rule (bytes taken while a checked frame waits for a FEED, up to
RX_DEPTH; beyond that, one ERROR OVERFLOW once the line is quiet). It knows no clock: the
caller passes times in seconds; a FEED or GENERATE takes `token_seconds` per token decoded
(the line's own time is not modelled, so replies leave at once). `PtyEmulator` serves one on a pseudo-terminal
from a thread; `hardwire emulate BUILD` runs that until Ctrl-C.

`ClockedDevice` is the same engine on the board's clock: the FIFO, receiver, executor, sender and UART transmitter
stepped cycle by cycle as the RTL steps them, the decoder taking its exact cycles per token, so that it gives the
RTL's replies in the RTL's cycles, BUSY and OVERFLOW included; the RTL's tests (boards/tb_link.py, the soak) hold
every reply byte of BoardCore equal to it, and in the same cycle. The decoder side (the reference decoder, the LoRA
SRAM, the prediction, the status flags) and the check of a whole frame are the two engines' common part (`_Chip`).

LoRA words arrive through LORA frames exactly as the RTL receives them; they are decoded back
into adapters (boards/lora_sram.py) with rtl/lora_map.py's address map (the inverse of `lora_writes`) and handed to
the reference decoder, so adapters loaded over the wire decode as they would on the chip.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import struct
import threading
import time
import tty
from collections import deque
from collections.abc import Callable
from pathlib import Path

from ..quant import blocks
from ..quant.qmodel import QModel
from ..quant.reference import ReferenceDecoder
from ..rtl.plan import HardwarePlan, plan_from_report
from . import protocol
from .host_link import RX_DEPTH
from .lora_sram import LoraSram
from .protocol import SYNC, Error, Flag, Op, Reply

BYTE_BITS = 10  # 8N1: start bit, 8 data bits, stop bit
DEFAULT_BAUD = 115200
DEFAULT_TIMEOUT_BYTES = 32  # the frame timeout in byte times (the RTL's default: 320 x clocks per bit)
BACKLOG_LIMIT = 64  # unsent reply bytes at which GENERATE waits for the line, as the RTL's sender stalls it


def frame_timeout_s(baud: int = DEFAULT_BAUD, timeout_bytes: int = DEFAULT_TIMEOUT_BYTES) -> float:
    """The frame timeout T in seconds for a line at `baud` (what a board built for that baud uses)."""
    return timeout_bytes * BYTE_BITS / baud


def _length_ok(op: Op, length: int, payload: bytes) -> bool:
    """The receiver's length rule per op (boards/host_link.py CHECK state)."""
    if op in (Op.RESET, Op.STATUS, Op.HELLO):
        return length == 0
    if op == Op.FEED:
        return length >= 2 and length % 2 == 0
    if op == Op.GENERATE:
        return length == 2 and payload != b"\0\0"
    return length >= 5 and length % 2 == 1  # LORA


class _Chip:
    """What both emulators share: the decoder side (the reference decoder, the LoRA SRAM, the prediction, the
    status counters and flags) and the receiver's verdict on a whole frame."""

    def __init__(self, qm: QModel, *, lanes: int, rows: int, rx_depth: int) -> None:
        if not isinstance(rx_depth, int) or rx_depth < 2:
            raise ValueError(f"rx_depth must be an integer of at least 2, got {rx_depth!r}")
        self.qm, self.lanes, self.rx_depth = qm, lanes, rx_depth
        self.vocab = qm.config.vocab_size
        self.token_bits = max(1, (self.vocab - 1).bit_length())
        self.decoder = ReferenceDecoder(qm)
        self.lora = LoraSram(qm)
        self._lora_dirty = False
        self.dropped = 0  # bytes the receive FIFO dropped (each overflow is reported with one ERROR OVERFLOW)
        self._fresh = True  # the next token fed starts a new sequence
        self._prediction: int | None = None
        # the decoder's status
        self.tokens = 0
        self.cycles = 0
        self.context_full = False
        self.bad_token = False
        self._cycles_per_token = _cycle_estimator(qm, rows, lanes)

    def _verdict(self, whole: bytes) -> Error | None:
        """A whole frame (after SYNC): CRC, op, length, in that order (BUSY comes after, and depends on time)."""
        op, length, payload = whole[0], whole[1], whole[2:-1]
        if protocol.crc8(whole[:-1]) != whole[-1]:
            return Error.BAD_CRC
        if op not in Op._value2member_map_:
            return Error.UNKNOWN_OP
        if not _length_ok(Op(op), length, payload):
            return Error.BAD_LENGTH
        return None

    def _report(self, op: Op, clock: int | None = None) -> bytes:
        """The reply to STATUS (its cycles: `clock`, or the decoding cycles when None) or HELLO."""
        if op == Op.STATUS:
            flags = Flag(0)
            if self.context_full:
                flags |= Flag.CONTEXT_FULL
            if self.bad_token:
                flags |= Flag.BAD_TOKEN
            return protocol.frame(Reply.STATUS, protocol.status_payload(
                protocol.Status(self.tokens, self.cycles if clock is None else clock, self.decoder.position, flags)))
        hello = protocol.Hello(protocol.PROTOCOL_VERSION, self.vocab, self.qm.context, self.lanes)
        return protocol.frame(Reply.HELLO, protocol.hello_payload(hello))

    def _feed(self, token: int) -> tuple[int | None, Error | None]:
        """One token through the decoder: its output, or the error for the flag it raised instead."""
        if self._fresh:  # new_seq: position 0, flags cleared
            self._fresh = False
            self.decoder.reset()
            self.context_full = self.bad_token = False
        if token >= self.vocab:
            self.bad_token = True
            return None, Error.BAD_TOKEN
        if self.decoder.position >= self.qm.context:
            self.context_full = True
            return None, Error.CONTEXT_FULL
        if self._lora_dirty:
            self.decoder.lora, self._lora_dirty = self.lora.adapters(), False
        self.cycles += self._cycles_per_token(self.decoder.position)
        logits = self.decoder.step(token)
        self.tokens += 1
        return int(blocks.argmax(logits)), None


class EmulatedDevice(_Chip):
    """The board's protocol engine over the reference decoder; times are seconds from any monotonic clock."""

    def __init__(self, qm: QModel, *, lanes: int, rows: int = 1, frame_timeout: float = frame_timeout_s(),
                 token_seconds: float = 0.0, rx_depth: int = RX_DEPTH) -> None:
        if frame_timeout <= 0:
            raise ValueError(f"the frame timeout must be positive, got {frame_timeout}")
        super().__init__(qm, lanes=lanes, rows=rows, rx_depth=rx_depth)
        self.frame_timeout = frame_timeout
        self.token_seconds = token_seconds  # a stand-in for the chip's decode time, so RESET can land mid-GENERATE
        # receiver
        self._fifo: deque[int] = deque()  # bytes taken from the line, not yet parsed
        self._lost = False  # the FIFO was full: bytes are dropped until it is read empty and the line is quiet
        self._frame: bytearray | None = None  # bytes after SYNC of the frame being received
        self._held: bytes | None = None  # a whole frame waiting for the executor (the RTL's CHECK state)
        self._post: Error | None = None  # a TIMEOUT or OVERFLOW waiting for the executor, so replies stay in order
        self._garbage = False  # non-SYNC bytes dropped since the line was last quiet
        self._last_rx = float("-inf")
        self._clock = float("-inf")  # the time of the last event handled
        # executor
        self._feed_until: float | None = None  # a FEED is decoding until then; its reply leaves then
        self._feed_reply = b""
        self._left = 0  # GENERATE: tokens still to send
        self._due: float | None = None  # GENERATE: when its next step runs; None when none runs

    @property
    def generating(self) -> bool:
        return self._due is not None

    def next_event(self, may_step: bool = True) -> float | None:
        """The time `poll` has work at (a FEED's end, a frame timeout, a garbage report, a GENERATE step); None: only input."""
        times = [t for t in (self._feed_until, self._receiver_event()) if t is not None]
        if self._due is not None and may_step:
            times.append(self._due)
        return min(times) if times else None

    def receive(self, data: bytes, now: float) -> bytes:
        """Bytes from the host that arrived at `now`; -> reply bytes."""
        out = self._advance(now)
        for byte in data:
            if self._lost or len(self._fifo) >= self.rx_depth:  # the FIFO is full, or an overflow is not reported yet
                self._lost = True
                self.dropped += 1
            else:
                self._fifo.append(byte)
            out += self._pump(now)
        if data:
            self._last_rx = now
        return out

    def poll(self, now: float, may_step: bool = True) -> bytes:
        """Whatever is due by `now`: a FEED's end, a frame timeout or garbage report, then one GENERATE step."""
        out = self._advance(now)
        if may_step and self._due is not None and now >= self._due:
            out += self._generate_step(now)
        return out

    # -- receiver -------------------------------------------------------------------------------

    def _receiver_event(self) -> float | None:
        """When the quiet line next acts on the receiver: it has read the FIFO empty and holds a partial frame, an
        unreported overflow or garbage (garbage is reported only while no FEED runs)."""
        if self._fifo or self._held is not None or self._post is not None:
            return None
        if self._frame is not None or self._lost or (self._garbage and self._feed_until is None):
            return self._last_rx + self.frame_timeout
        return None

    def _advance(self, now: float) -> bytes:
        """Events due by `now`, in time order: FEEDs that finish, the quiet line's timeouts."""
        out = b""
        while True:
            events = [t for t in (self._feed_until, self._receiver_event()) if t is not None and t <= now]
            if not events:
                return out
            t = self._clock = max(self._clock, min(events))
            if self._feed_until is not None and self._feed_until <= t:
                out += self._feed_reply
                self._feed_until, self._feed_reply = None, b""
            elif self._frame is not None or self._lost:  # the frame cut short, and any garbage before it: one error
                self._post = Error.OVERFLOW if self._lost else Error.TIMEOUT
                self._frame, self._garbage, self._lost = None, False, False
            else:
                self._garbage = False
                out += _error(Error.GARBAGE)
            out += self._pump(t)

    def _pump(self, now: float) -> bytes:
        """The receiver reads the FIFO until it holds a whole frame or an error the executor must finish before."""
        out = b""
        while True:
            if self._post is not None:
                if self._feed_until is not None:
                    return out
                out += _error(self._post)
                self._post = None
            elif self._held is not None:
                if self._feed_until is not None:
                    return out
                whole, self._held = self._held, None
                out += self._check(whole, now)
            elif not self._fifo:
                return out
            else:
                byte = self._fifo.popleft()
                if self._frame is None:
                    if byte == SYNC:
                        self._frame = bytearray()
                    else:
                        self._garbage = True
                    continue
                self._frame.append(byte)
                if len(self._frame) >= 2 and len(self._frame) == 3 + self._frame[1]:
                    self._held, self._frame = bytes(self._frame), None

    def _check(self, whole: bytes, now: float) -> bytes:
        """A whole frame (after SYNC): CRC, op, length, BUSY, in that order, before any of it is acted on."""
        verdict = self._verdict(whole)
        if verdict is not None:
            return _error(verdict)
        if self.generating and whole[0] != Op.RESET:
            return _error(Error.BUSY)
        return self._execute(Op(whole[0]), whole[2:-1], now)

    # -- executor -------------------------------------------------------------------------------

    def _execute(self, op: Op, payload: bytes, now: float) -> bytes:
        if op == Op.RESET:  # also aborts a GENERATE: the token in flight is already decoded, its output unused
            self._due, self._left = None, 0
            self._fresh, self._prediction = True, None
            return protocol.frame(Reply.ACK)
        if op == Op.FEED:  # decodes for token_seconds per token fed; frames that follow wait (the FIFO fills)
            reply, fed = self._feed_all(payload)
            if self.token_seconds > 0 and fed:
                self._feed_until, self._feed_reply = now + fed * self.token_seconds, reply
                return b""
            return reply
        if op == Op.GENERATE:
            if self._prediction is None:
                return _error(Error.NO_PREDICTION)
            self._left, self._due = struct.unpack("<H", payload)[0], now
            return self._generate_step(now)
        if op == Op.LORA:
            address = int.from_bytes(payload[:3], "little")
            for i, (word,) in enumerate(struct.iter_unpack("<H", payload[3:])):
                self.lora.write(address + i, word)
            self._lora_dirty = True
            return protocol.frame(Reply.ACK)
        return self._report(op)  # STATUS, HELLO

    def _feed_all(self, payload: bytes) -> tuple[bytes, int]:
        """A FEED's tokens in order -> its reply, and how many tokens the decoder was given."""
        for fed, (token,) in enumerate(struct.iter_unpack("<H", payload)):
            if token >> self.token_bits:  # does not fit the decoder's token port: never fed
                self._prediction = None
                return _error(Error.BAD_TOKEN), fed
            output, error = self._feed(token)
            if error is not None:
                self._prediction = None
                return _error(error), fed + 1
            self._prediction = output
        return protocol.frame(Reply.ACK), len(payload) // 2

    def _generate_step(self, now: float) -> bytes:
        """Send the prediction and feed it back; after the last one (and its decode), ACK."""
        if self._left == 0:
            self._due = None
            return protocol.frame(Reply.ACK)
        assert self._prediction is not None
        out = protocol.frame(Reply.TOKEN, struct.pack("<H", self._prediction))
        self._left -= 1
        output, error = self._feed(self._prediction)
        if error is not None:
            self._due, self._prediction = None, None
            return out + _error(error)
        self._prediction, self._due = output, now + self.token_seconds
        return out


class ClockedDevice(_Chip):
    """The device on the board's clock: BoardCore's UART, host link and decoder cycle for cycle, so that for any
    bytes at any cycles it gives the RTL's replies at the RTL's cycles (the oracle of the RTL's soak, boards/tb_link.py).

    Each part of boards/host_link.py is a state machine here, stepped once per clock cycle on the registers as they
    stand at the cycle's start, with the RTL's states and conditions:
      FIFO      a byte UartRx offers in cycle a is written then and can be read from a + 2, one a cycle; it is dropped
                (and `lost` set) when `lost` is set or rx_depth - 1 bytes wait behind the output register;
      receiver  reads a byte a cycle in IDLE, OP, LEN, PAYLOAD and CRC; CHECK the cycle after the CRC byte; posts an
                error when the executor is idle or generating and no error waits (BUSY: when none waits); acts on a
                quiet line once no byte has arrived for `timeout` cycles and the FIFO is empty;
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
            acted, self._tx, self._tx_i, self._err = True, _error(err), 0, None
        elif rep_take:
            acted, self._tx, self._tx_i = True, rep, 0
        if post is not None:
            self._err = post
        self._acted = acted

    def _send(self, reply: bytes) -> None:
        self._rep, self._ex = reply, "SEND"

    def _fail(self, code: Error) -> None:
        self._prediction = None
        self._send(_error(code))

    def _start(self, c: int, op: Op, payload: bytes) -> None:
        """The executor takes a checked command (its IDLE state)."""
        self._i = 0
        if op == Op.RESET:
            self._fresh, self._prediction = True, None
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


def _error(code: Error) -> bytes:
    return protocol.frame(Reply.ERROR, bytes([code]))


def _cycle_estimator(qm: QModel, rows: int, lanes: int) -> Callable[[int], int]:
    """STATUS's cycle count: the sum of the build report's per-token estimates.

    The chip reports a free-running clock counter; the emulator has no clock, so it counts
    only the cycles its decoding would have taken (idle time between commands is not in it).
    """
    from ..rtl.plan import cycles_per_token_estimate

    plan = HardwarePlan(rows=rows, lanes=lanes)
    return lambda position: cycles_per_token_estimate(qm, plan, position)


def load_build(build: Path) -> tuple[QModel, HardwarePlan]:
    """A build folder's QModel and hardware plan (report.json), with a message naming what is missing."""
    build = Path(build)
    missing = [name for name in ("qmodel.json", "qmodel.npz", "report.json") if not (build / name).exists()]
    if missing:
        raise FileNotFoundError(f"{build} is not a build folder (no {', '.join(missing)}); "
                                f"make one with `hardwire compile MODEL.onnx -o {build}`")
    return QModel.load(build), plan_from_report(json.loads((build / "report.json").read_text()))


class PtyEmulator:
    """An EmulatedDevice behind a pseudo-terminal, served from a thread: open `port` like a board's UART."""

    def __init__(self, device: EmulatedDevice) -> None:
        self.device = device
        self._master, self._slave = os.openpty()
        tty.setraw(self._slave)  # bytes pass unchanged: no echo, no line discipline
        os.set_blocking(self._master, False)
        self.port = os.ttyname(self._slave)
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._serve, name=f"emulator {self.port}", daemon=True)
        self.failure: BaseException | None = None  # what stopped the thread, if anything but close()

    def start(self) -> PtyEmulator:
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread.is_alive():
            os.write(self._stop_w, b"x")
            self._thread.join(timeout=5.0)  # a stuck serving thread must not keep Ctrl-C from ending the emulator
        for fd in (self._master, self._slave, self._stop_r, self._stop_w):
            os.close(fd)

    def __enter__(self) -> PtyEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _serve(self) -> None:
        try:
            self._loop()
        except BaseException as err:  # kept for the owner: a dead emulator must not look like a silent board
            self.failure = err
            raise

    def _loop(self) -> None:
        device, backlog = self.device, bytearray()
        while True:
            may_step = len(backlog) < BACKLOG_LIMIT
            event = device.next_event(may_step)
            wait = None if event is None else max(0.0, event - time.monotonic())
            readable, _, _ = select.select([self._master, self._stop_r], [self._master] if backlog else [], [], wait)
            if self._stop_r in readable:
                return
            if self._master in readable:
                try:
                    data = os.read(self._master, 4096)
                except BlockingIOError:
                    data = b""
                backlog += device.receive(data, time.monotonic())
            backlog += device.poll(time.monotonic(), len(backlog) < BACKLOG_LIMIT)
            if backlog:
                with contextlib.suppress(BlockingIOError):  # nobody reads the port: hold the replies, GENERATE waits
                    del backlog[:os.write(self._master, backlog)]

"""A board in software: the host protocol (host/protocol.py) on a pseudo-terminal, decoding with
the integer reference, so the host side (client, `hardwire chat`) can be developed and tested
without a board and the protocol's semantics have one executable statement besides the RTL.

`EmulatedDevice` is the protocol engine of boards/host_link.py re-told in Python, decision for
decision: the receiver's frame timeout and garbage rule, its CRC / op / length / LoRA shift checks
of the whole frame before anything is acted on, BUSY while a GENERATE runs, RESET aborting it, and
the decoder's flags (bad token, full context) with the error each one gives, and the receive
FIFO with its overflow rule (bytes taken while a checked frame waits for a FEED, up to
RX_DEPTH; beyond that, one ERROR OVERFLOW once the line is quiet, and STATUS's overflow flag
until RESET). It knows no clock: the
caller passes times in seconds; a FEED or GENERATE takes `token_seconds` per token decoded
(the line's own time is not modelled, so replies leave at once). `PtyEmulator` serves one on a pseudo-terminal
from a thread; `hardwire emulate BUILD` runs that until Ctrl-C.

`ClockedDevice` (host/clocked_device.py) is the same engine on the board's clock, cycle for cycle as the RTL;
the two engines' common part, the decoder side and the check of a whole frame, is `Chip` (host/emulator_chip.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import struct
import termios
import threading
import time
from collections import deque
from pathlib import Path

from ..boards.host_link import RX_DEPTH
from ..quant.qmodel import QModel
from ..rtl.plan import HardwarePlan, plan_from_report
from . import protocol
from .emulator_chip import BYTE_BITS, Chip, error_reply
from .protocol import SYNC, Error, Op, Reply

DEFAULT_BAUD = 115200
DEFAULT_TIMEOUT_BYTES = 32  # the frame timeout in byte times (the RTL's default: 320 x clocks per bit)
BACKLOG_LIMIT = 64  # unsent reply bytes at which GENERATE waits for the line, as the RTL's sender stalls it


def frame_timeout_s(baud: int = DEFAULT_BAUD, timeout_bytes: int = DEFAULT_TIMEOUT_BYTES) -> float:
    """The frame timeout T in seconds for a line at `baud` (what a board built for that baud uses)."""
    return timeout_bytes * BYTE_BITS / baud


class EmulatedDevice(Chip):
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
                out += error_reply(Error.GARBAGE)
            out += self._pump(t)

    def _pump(self, now: float) -> bytes:
        """The receiver reads the FIFO until it holds a whole frame or an error the executor must finish before."""
        out = b""
        while True:
            if self._post is not None:
                if self._feed_until is not None:
                    return out
                out += error_reply(self._post)
                self.overflowed |= self._post == Error.OVERFLOW  # STATUS's sticky flag, until RESET
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
            return error_reply(verdict)
        if self.generating and whole[0] != Op.RESET:
            return error_reply(Error.BUSY)
        return self._execute(Op(whole[0]), whole[2:-1], now)

    # -- executor -------------------------------------------------------------------------------

    def _execute(self, op: Op, payload: bytes, now: float) -> bytes:
        if op == Op.RESET:  # also aborts a GENERATE: the token in flight is already decoded, its output unused
            self._due, self._left = None, 0
            self._fresh, self._prediction, self.overflowed = True, None, False
            return protocol.frame(Reply.ACK)
        if op == Op.FEED:  # decodes for token_seconds per token fed; frames that follow wait (the FIFO fills)
            reply, fed = self._feed_all(payload)
            if self.token_seconds > 0 and fed:
                self._feed_until, self._feed_reply = now + fed * self.token_seconds, reply
                return b""
            return reply
        if op == Op.GENERATE:
            if self._prediction is None:
                return error_reply(Error.NO_PREDICTION)
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
                return error_reply(Error.BAD_TOKEN), fed
            output, error = self._feed(token)
            if error is not None:
                self._prediction = None
                return error_reply(error), fed + 1
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
            return out + error_reply(error)
        self._prediction, self._due = output, now + self.token_seconds
        return out


def load_build(build: Path) -> tuple[QModel, HardwarePlan]:
    """A build folder's QModel and hardware plan (report.json), with a message naming what is missing."""
    build = Path(build)
    missing = [name for name in ("qmodel.json", "qmodel.npz", "report.json") if not (build / name).exists()]
    if missing:
        raise FileNotFoundError(f"{build} is not a build folder (no {', '.join(missing)}); "
                                f"make one with `hardwire compile MODEL.onnx -o {build}`")
    return QModel.load(build), plan_from_report(json.loads((build / "report.json").read_text()))


def raw_mode(fd: int) -> None:
    """Put a terminal in raw mode, as the standard library's tty.setraw does (termios directly: in a long test
    run the `tty` module was once found without its setraw, 2026-12-07)."""
    mode = termios.tcgetattr(fd)
    mode[0] &= ~(termios.BRKINT | termios.ICRNL | termios.INPCK | termios.ISTRIP | termios.IXON)
    mode[1] &= ~termios.OPOST
    mode[2] &= ~(termios.CSIZE | termios.PARENB)
    mode[2] |= termios.CS8
    mode[3] &= ~(termios.ECHO | termios.ICANON | termios.IEXTEN | termios.ISIG)
    mode[6][termios.VMIN], mode[6][termios.VTIME] = 1, 0
    termios.tcsetattr(fd, termios.TCSAFLUSH, mode)


class PtyEmulator:
    """An EmulatedDevice behind a pseudo-terminal, served from a thread: open `port` like a board's UART."""

    def __init__(self, device: EmulatedDevice) -> None:
        self.device = device
        self._master, self._slave = os.openpty()
        raw_mode(self._slave)  # bytes pass unchanged: no echo, no line discipline
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

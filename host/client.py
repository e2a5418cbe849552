"""The host end of the board link: commands out, replies in, over any byte transport.

A board (or the emulator) answers every command with frames (host/protocol.py); this wraps
the waiting, the error replies and the recovery rule so that callers (`hardwire chat`, tests,
scripts) see tokens, exceptions that say what to do, and never a hang: every wait has a
deadline, and a silent device raises DeviceTimeout naming the port and the awaited reply.
"""

from __future__ import annotations

import os
import select
import time
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from . import protocol
from .protocol import Error, Hello, Reply, Response, Status

if TYPE_CHECKING:
    import serial

    from ..quant.qmodel import QModel
    from ..quant.reference import LoraSet

MAX_GENERATE = (1 << 16) - 1  # tokens per GENERATE frame (u16 N)

ADVICE = {  # what the host should do after each ERROR code
    Error.BAD_CRC: "a frame was damaged on the line; check the baud rate and the cable, then reset",
    Error.UNKNOWN_OP: "the board does not know this command; rebuild and flash it with this hardwire version",
    Error.BAD_LENGTH: "the command's payload length does not suit it; rebuild and flash the board with this hardwire "
                      "version",
    Error.TIMEOUT: "a frame stopped part-way (bytes lost on the line?); reset and send the command again",
    Error.GARBAGE: "bytes that are not frames reached the board (wrong baud rate, or another program on the port?); "
                   "reset and send the command again",
    Error.BUSY: "a GENERATE is still running; wait for its ACK or reset",
    Error.OVERFLOW: "the board's receive buffer overflowed (too many bytes sent ahead of its replies) and bytes were "
                    "dropped; reset and send the command again, waiting for replies",
    Error.CONTEXT_FULL: "the decoder's context is full; reset to start a new sequence",
    Error.BAD_TOKEN: "a token id is outside the model's vocabulary; reset and feed valid ids",
    Error.NO_PREDICTION: "GENERATE needs a FEED since the last reset (there is nothing to continue)",
    Error.BAD_LORA_SHIFT: "a word of the LORA frame would write 0 to an a_shift or b_shift register (the low 6 bits it "
                          "keeps; a shift of 0 makes the chip's rescale add 2**63), so the board wrote none of that "
                          "frame; send shifts from 1 to 63 (load adapters with load_lora, which checks them)",
}


class LinkError(Exception):
    """Something went wrong talking to the board."""


class DeviceError(LinkError):
    """The board answered with an ERROR frame."""

    def __init__(self, port: str, command: str, code: Error | int) -> None:
        self.port, self.command, self.code = port, command, code
        if isinstance(code, Error):
            text = f"{port}: {command} failed with ERROR {code.name}: {ADVICE[code]}"
        else:
            text = f"{port}: {command} failed with an unknown ERROR code 0x{code:02x}; is the board's bitstream " \
                   "from this hardwire version?"
        super().__init__(text)


class DeviceTimeout(LinkError):
    """The board stayed silent past a deadline."""

    def __init__(self, port: str, what: str, seconds: float) -> None:
        self.port, self.what, self.seconds = port, what, seconds
        super().__init__(f"{port}: no {what} within {seconds:g} s")


class UnexpectedReply(LinkError):
    """A reply that does not answer the command sent (the link is out of step: reset)."""


class Transport(Protocol):
    """A byte pipe to the board: `read` returns what arrives within `timeout` seconds (maybe nothing)."""

    name: str

    def read(self, size: int, timeout: float) -> bytes: ...

    def write(self, data: bytes) -> None: ...


class SerialTransport:
    """A pyserial port (a board's USB UART, or the emulator's pseudo-terminal)."""

    def __init__(self, port: serial.Serial) -> None:
        self.port = port
        self.name = str(port.port)
        self._timeout: float | None = port.timeout

    def read(self, size: int, timeout: float) -> bytes:
        self._set_timeout(timeout)
        data = self.port.read(1)
        if data and self.port.in_waiting:
            data += self.port.read(min(size - 1, self.port.in_waiting))
        return data

    def write(self, data: bytes) -> None:
        self.port.write(data)
        self.port.flush()

    def _set_timeout(self, timeout: float) -> None:
        timeout = max(0.0, timeout)
        if timeout != self._timeout:  # pyserial reconfigures the port on every change
            self.port.timeout = self._timeout = timeout


class FdTransport:
    """A file descriptor (one end of a pseudo-terminal, a pipe pair): select and os.read/os.write."""

    def __init__(self, fd: int, name: str, write_fd: int | None = None) -> None:
        self.fd, self.write_fd, self.name = fd, fd if write_fd is None else write_fd, name

    def read(self, size: int, timeout: float) -> bytes:
        readable, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        return os.read(self.fd, size) if readable else b""

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.write_fd, view):]


def as_transport(link: Transport | serial.Serial | int) -> Transport:
    """A Transport from a pyserial port or a file descriptor (named by its tty path when it has one)."""
    if isinstance(link, int):
        return FdTransport(link, os.ttyname(link) if os.isatty(link) else f"fd {link}")
    if hasattr(link, "in_waiting"):  # a serial.Serial (pyserial is imported only where ports are opened)
        return SerialTransport(link)
    return link


def open_serial(port: str, baud: int = 115200) -> SerialTransport:
    """Open a serial port by path; FileNotFoundError / PermissionError / OSError say which port and why."""
    import serial

    if not os.path.exists(port):
        raise FileNotFoundError(f"{port} does not exist; is the board plugged in? (boards show up as /dev/ttyUSB* or "
                                "/dev/ttyACM*; `hardwire emulate BUILD` prints its port)")
    try:
        return SerialTransport(serial.Serial(port, baud, timeout=0.1))
    except serial.SerialException as err:
        raise OSError(f"cannot open {port}: {err}") from err


class DeviceClient:
    """Commands and their replies, in order; every wait bounded by `timeout` (plus `token_timeout` per token decoded).

    `quiet` must exceed the board's frame timeout (32 byte times: 2.8 ms at 115200 baud): the
    host rule after garbage or an error is to leave the line quiet that long, then RESET.
    """

    def __init__(self, transport: Transport | serial.Serial | int, *, timeout: float = 2.0, token_timeout: float = 1.0,
                 quiet: float = 0.05) -> None:
        self.transport = as_transport(transport)
        self.port = self.transport.name
        self.timeout, self.token_timeout, self.quiet = timeout, token_timeout, quiet
        self._parser = protocol.FrameParser()
        self._replies: deque[Response] = deque()

    # -- commands ----------------------------------------------------------------------------------

    def hello(self) -> Hello:
        """The model on the chip: vocabulary, context, lanes (checks the link before anything else)."""
        self._send(protocol.hello())
        return self._expect(Reply.HELLO, "HELLO").hello

    def reset(self) -> Hello:
        """Back to a known state from anything: drain, leave the line quiet past the frame timeout, RESET,
        skip stale replies up to its ACK, then a HELLO round trip (which proves the link is in step)."""
        still_busy = self.drain()
        self._send(protocol.reset())
        self._skip_to(Reply.ACK, "RESET")
        if still_busy:  # a GENERATE may have finished with an ACK of its own just before the RESET's
            self.drain()
        self._send(protocol.hello())
        return self._skip_to(Reply.HELLO, "HELLO").hello

    def feed(self, ids: list[int]) -> None:
        """Feed a prompt (any length: split into frames); the decoder's last output becomes the prediction."""
        for chunk in protocol.feed(ids):
            self._send(chunk)
            n = (len(chunk) - 4) // 2
            self._expect(Reply.ACK, f"FEED of {n} tokens", self.timeout + n * self.token_timeout)

    def generate(self, n: int) -> Iterator[int]:
        """Yield n generated tokens as their TOKEN frames arrive (stream them: the chip is slower than the line)."""
        if n < 1:
            raise ValueError(f"generate needs n >= 1, got {n}")
        while n:
            k = min(n, MAX_GENERATE)
            self._send(protocol.generate(k))
            for i in range(k):
                yield self._expect(Reply.TOKEN, f"GENERATE {k}", self.timeout + self.token_timeout,
                                   waiting=f"token {i + 1} of GENERATE {k}").token
            self._expect(Reply.ACK, f"GENERATE {k}", self.timeout + self.token_timeout)
            n -= k

    def load_lora(self, qm: QModel, adapters: LoraSet) -> None:
        """Load adapters into the board's LoRA SRAM: checked against the build's slots, shapes and ranges (rtl/lora_map.py
        `lora_writes`, for the lanes the board reports in HELLO) before a byte is sent. The way to load adapters."""
        from ..rtl.lora_map import lora_writes

        self.write_lora(lora_writes(qm, self.hello().lanes, adapters))

    def write_lora(self, writes: list[tuple[int, int]]) -> None:
        """Raw LoRA (address, word) writes, consecutive runs per frame, unchecked here: load adapters with `load_lora`.
        The board refuses a frame any word of which would write 0 to a shift register (ERROR BAD_LORA_SHIFT, raised
        as DeviceError naming the frame's address: none of that frame was written, the frames before it were, the
        ones after it are not sent)."""
        for chunk in protocol.lora(writes):
            self._send(chunk)
            start, words = int.from_bytes(chunk[3:6], "little"), (len(chunk) - 7) // 2
            self._expect(Reply.ACK, f"LORA of {words} word{'s' if words > 1 else ''} at 0x{start:06x}")

    def status(self) -> Status:
        self._send(protocol.status())
        return self._expect(Reply.STATUS, "STATUS").status

    def drain(self) -> bool:
        """Discard input until the line has been quiet for `quiet` (at most `timeout`); -> True if it never was."""
        self._replies.clear()
        self._parser = protocol.FrameParser()
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if not self.transport.read(4096, min(self.quiet, max(0.0, deadline - time.monotonic()))):
                return False
        return True

    # -- replies -----------------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        self.transport.write(data)

    def _next(self, what: str, timeout: float, deadline: float | None = None) -> Response:
        deadline = time.monotonic() + timeout if deadline is None else deadline
        while not self._replies:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeviceTimeout(self.port, what, timeout)
            self._replies.extend(self._parser.push(self.transport.read(4096, left)))
        return self._replies.popleft()

    def _expect(self, op: Reply, command: str, timeout: float | None = None, waiting: str | None = None) -> Response:
        """The next reply, which must be `op`; an ERROR raises DeviceError."""
        reply = self._next(waiting or f"reply to {command}", self.timeout if timeout is None else timeout)
        if reply.op == Reply.ERROR:
            raise _device_error(self.port, command, reply)
        if reply.op != op or len(reply.payload) != _PAYLOAD[op]:
            raise UnexpectedReply(f"{self.port}: expected {op.name} in answer to {command}, got {reply}; "
                                  "the link is out of step: reset")
        return reply

    def _skip_to(self, op: Reply, command: str) -> Response:
        """Replies up to the first `op` (stale ones from before a reset are dropped)."""
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._next(f"{op.name} in answer to {command}", self.timeout, deadline)
            if reply.op == op and len(reply.payload) == _PAYLOAD[op]:
                return reply


_PAYLOAD = {Reply.ACK: 0, Reply.TOKEN: 2, Reply.STATUS: 11, Reply.HELLO: 8, Reply.ERROR: 1}


def _device_error(port: str, command: str, reply: Response) -> DeviceError:
    code = reply.payload[0] if reply.payload else -1
    return DeviceError(port, command, Error(code) if code in Error._value2member_map_ else code)

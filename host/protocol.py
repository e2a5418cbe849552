"""The host protocol over the board's UART: frames, their checksum, commands and responses.

One definition for every party: the board's RTL (boards/host_link.py) follows it, and the
host client, the pseudo-terminal emulator and the cocotb UART test all speak it through this
module. docs/protocol.md is the prose version.

A frame, in both directions:  SYNC | op | len | payload[len] | crc8(op, len, payload)
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

SYNC = 0xA5
MAX_PAYLOAD = 255
MAX_FEED = MAX_PAYLOAD // 2  # token ids per FEED frame (16-bit little-endian each)
MAX_LORA_WORDS = (MAX_PAYLOAD - 3) // 2  # 16-bit words per LORA frame after the 24-bit address
# HELLO's version; `hardwire chat` refuses a board of another one. 2: STATUS's overflow flag, and ERROR BAD_LORA_SHIFT
# (the board refuses a LORA frame that would write 0 to a shift register; version 1 stored it)
PROTOCOL_VERSION = 2


class Op(enum.IntEnum):
    """Host → device commands."""

    RESET = 0x01  # abort, drop the pending prediction; the next FEED starts a new sequence
    FEED = 0x02  # payload: token ids, u16 LE each; the decoder consumes them in order
    GENERATE = 0x03  # payload: N, u16 LE; N TOKEN frames, each token fed back, then ACK
    LORA = 0x04  # payload: address u24 LE, then u16 LE words written to address, address + 1, ...
    STATUS = 0x05  # payload empty; answered with a STATUS frame
    HELLO = 0x06  # payload empty; answered with a HELLO frame describing the model on the chip


class Reply(enum.IntEnum):
    """Device → host responses."""

    ACK = 0x81  # the command finished; payload empty
    TOKEN = 0x82  # one generated token id, u16 LE
    STATUS = 0x83  # tokens u32, cycles u32, position u16, flags u8 (see Flag)
    HELLO = 0x84  # "HW", version u8, vocab u16, context u16, lanes u8
    ERROR = 0xE0  # one byte: an Error code


class Error(enum.IntEnum):
    BAD_CRC = 0x01  # a whole frame arrived but its checksum is wrong
    UNKNOWN_OP = 0x02  # op is not an Op
    BAD_LENGTH = 0x03  # the payload length does not suit the op (odd FEED, GENERATE not 2 bytes, ...)
    TIMEOUT = 0x04  # a frame stopped arriving part-way: the line was quiet for the frame timeout
    GARBAGE = 0x05  # bytes that are not a frame's SYNC arrived while waiting for a frame
    BUSY = 0x06  # a command other than RESET arrived while GENERATE was running
    OVERFLOW = 0x07  # the receive buffer was full: bytes were dropped up to the next quiet line
    CONTEXT_FULL = 0x10  # the decoder's context is full; RESET starts a new sequence
    BAD_TOKEN = 0x11  # a fed token id is outside the vocabulary; RESET clears it
    NO_PREDICTION = 0x12  # GENERATE before any FEED since RESET: there is nothing to continue
    BAD_LORA_SHIFT = 0x13  # a LORA frame would write 0 to an a_shift or b_shift register: none of it was written


class Flag(enum.IntFlag):
    """Bits of the STATUS frame's flags byte."""

    CONTEXT_FULL = 0x01
    BAD_TOKEN = 0x02
    BUSY = 0x04
    OVERFLOW = 0x08  # an ERROR OVERFLOW was sent since the last RESET (bytes were dropped): sticky until RESET


def crc8(data: bytes) -> int:
    """CRC-8, polynomial x^8 + x^2 + x + 1 (0x07), initial value 0, no reflection (CRC-8/SMBUS)."""
    crc = 0
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


def frame(op: int, payload: bytes = b"") -> bytes:
    """SYNC, op, len, payload, CRC-8 over op, len and payload."""
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"a frame's payload is at most {MAX_PAYLOAD} bytes, got {len(payload)}")
    body = bytes([op, len(payload)]) + payload
    return bytes([SYNC]) + body + bytes([crc8(body)])


# -- commands -------------------------------------------------------------------------------


def reset() -> bytes:
    return frame(Op.RESET)


def feed(tokens: list[int]) -> list[bytes]:
    """FEED frames for `tokens`, at most MAX_FEED ids each."""
    for token in tokens:
        if not 0 <= token < 1 << 16:
            raise ValueError(f"token ids travel as 16-bit values, got {token}")
    return [frame(Op.FEED, struct.pack(f"<{len(chunk)}H", *chunk))
            for chunk in (tokens[i:i + MAX_FEED] for i in range(0, len(tokens), MAX_FEED))]


def generate(n: int) -> bytes:
    if not 1 <= n < 1 << 16:
        raise ValueError(f"GENERATE takes 1 to 65535 tokens, got {n}")
    return frame(Op.GENERATE, struct.pack("<H", n))


def lora(writes: list[tuple[int, int]]) -> list[bytes]:
    """LORA frames for (address, 16-bit word) writes, runs of consecutive addresses per frame."""
    frames: list[bytes] = []
    run: list[int] = []
    start = 0
    for address, word in [*writes, (-1, 0)]:
        if run and (address != start + len(run) or len(run) == MAX_LORA_WORDS):
            frames.append(frame(Op.LORA, struct.pack("<I", start)[:3] + struct.pack(f"<{len(run)}H", *run)))
            run = []
        if address < 0:
            break
        if not 0 <= address < 1 << 24 or not 0 <= word < 1 << 16:
            raise ValueError(f"LoRA writes are 24-bit addresses and 16-bit words, got ({address}, {word})")
        if not run:
            start = address
        run.append(word)
    return frames


def status() -> bytes:
    return frame(Op.STATUS)


def hello() -> bytes:
    return frame(Op.HELLO)


# -- responses ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Status:
    tokens: int  # tokens the decoder consumed since power-up
    cycles: int  # the chip's free-running clock counter since reset (the emulator counts decoding cycles only)
    position: int  # position of the next token in the current sequence
    flags: Flag


@dataclass(frozen=True)
class Hello:
    version: int
    vocab: int
    context: int
    lanes: int


def status_payload(s: Status) -> bytes:
    return struct.pack("<IIHB", s.tokens & 0xFFFFFFFF, s.cycles & 0xFFFFFFFF, s.position, int(s.flags))


def hello_payload(h: Hello) -> bytes:
    return b"HW" + struct.pack("<BHHB", h.version, h.vocab, h.context, h.lanes)


@dataclass(frozen=True)
class Response:
    op: int
    payload: bytes

    @property
    def token(self) -> int:
        return struct.unpack("<H", self.payload)[0]

    @property
    def error(self) -> Error:
        return Error(self.payload[0])

    @property
    def status(self) -> Status:
        tokens, cycles, position, flags = struct.unpack("<IIHB", self.payload)
        return Status(tokens, cycles, position, Flag(flags))

    @property
    def hello(self) -> Hello:
        if self.payload[:2] != b"HW":
            raise ValueError(f"HELLO payload does not start with 'HW': {self.payload!r}")
        return Hello(*struct.unpack("<BHHB", self.payload[2:]))

    def __str__(self) -> str:
        name = Reply(self.op).name if self.op in Reply._value2member_map_ else f"0x{self.op:02x}"
        if self.op == Reply.ERROR and self.payload and self.payload[0] in Error._value2member_map_:
            return f"ERROR {self.error.name}"
        return f"{name} {self.payload.hex()}"


class FrameParser:
    """Incremental parser of frames from a byte stream (the host side of the link).

    Bytes before a SYNC and frames with a bad CRC are dropped and counted; the device never
    sends either, so on the host they mean line noise.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.dropped = 0

    def push(self, data: bytes) -> list[Response]:
        self._buffer += data
        out: list[Response] = []
        while True:
            start = self._buffer.find(SYNC)
            if start < 0:
                self.dropped += len(self._buffer)
                self._buffer.clear()
                return out
            self.dropped += start
            del self._buffer[:start]
            if len(self._buffer) < 3 or len(self._buffer) < 4 + self._buffer[2]:
                return out
            length = self._buffer[2]
            body = bytes(self._buffer[1:3 + length])
            if crc8(body) != self._buffer[3 + length]:
                self.dropped += 1
                del self._buffer[:1]
                continue
            out.append(Response(body[0], body[2:]))
            del self._buffer[:4 + length]

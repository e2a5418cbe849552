"""The host protocol's codes in hardware: commands, replies and errors as Amaranth enums (values from
host/protocol.py, the host side's single definition), the reply layout and the CRC-8 step.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Value, unsigned
from amaranth.lib import data, enum

from ..host import protocol


class Op(enum.Enum, shape=8):
    """Host → device commands (values from host/protocol.py)."""

    RESET = protocol.Op.RESET.value
    FEED = protocol.Op.FEED.value
    GENERATE = protocol.Op.GENERATE.value
    LORA = protocol.Op.LORA.value
    STATUS = protocol.Op.STATUS.value
    HELLO = protocol.Op.HELLO.value


class Reply(enum.Enum, shape=8):
    """Device → host responses."""

    ACK = protocol.Reply.ACK.value
    TOKEN = protocol.Reply.TOKEN.value
    STATUS = protocol.Reply.STATUS.value
    HELLO = protocol.Reply.HELLO.value
    ERROR = protocol.Reply.ERROR.value


class Error(enum.Enum, shape=8):
    """Payload of an ERROR reply."""

    BAD_CRC = protocol.Error.BAD_CRC.value
    UNKNOWN_OP = protocol.Error.UNKNOWN_OP.value
    BAD_LENGTH = protocol.Error.BAD_LENGTH.value
    TIMEOUT = protocol.Error.TIMEOUT.value
    GARBAGE = protocol.Error.GARBAGE.value
    BUSY = protocol.Error.BUSY.value
    OVERFLOW = protocol.Error.OVERFLOW.value
    CONTEXT_FULL = protocol.Error.CONTEXT_FULL.value
    BAD_TOKEN = protocol.Error.BAD_TOKEN.value
    NO_PREDICTION = protocol.Error.NO_PREDICTION.value
    BAD_LORA_SHIFT = protocol.Error.BAD_LORA_SHIFT.value


REPLY_BYTES = 11  # the longest reply payload: STATUS
REPLY_LAYOUT = data.StructLayout({"op": Reply, "length": unsigned(4), "payload": unsigned(8 * REPLY_BYTES)})


def _crc8_of_byte(x: int) -> int:
    crc = x
    for _ in range(8):
        crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


def crc8_step(crc: Value, byte: Value) -> Value:
    """One byte of CRC-8/SMBUS (protocol.crc8) as combinational logic. The step is linear in
    crc ^ byte, so each output bit is the XOR of the input bits whose single-bit CRC has it set
    (a chain of eight conditional shifts would duplicate its input at every level)."""
    x = (crc ^ byte)[:8]
    columns = [_crc8_of_byte(1 << i) for i in range(8)]
    bits = []
    for j in range(8):
        terms = [x[i] for i in range(8) if columns[i] >> j & 1]
        bits.append(Cat(*terms).xor())
    return Cat(*bits)

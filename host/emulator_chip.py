"""What the two emulators of the board share (host/emulator.py EmulatedDevice, host/clocked_device.py
ClockedDevice): the decoder side (the reference decoder, the LoRA SRAM, the prediction, the status flags) and the
check of a whole frame are the two engines' common part (`Chip`), with the ERROR reply both send.

LoRA words arrive through LORA frames exactly as the RTL receives them; they are decoded back
into adapters (host/lora_sram.py) with rtl/lora_map.py's address map (the inverse of `lora_writes`) and handed to
the reference decoder, so adapters loaded over the wire decode as they would on the chip.
"""

from __future__ import annotations

from collections.abc import Callable

from ..quant import blocks
from ..quant.qmodel import QModel
from ..quant.reference import ReferenceDecoder
from ..rtl.lora_map import shift_addresses
from ..rtl.plan import HardwarePlan
from . import protocol
from .lora_sram import LoraSram
from .protocol import Error, Flag, Op, Reply

BYTE_BITS = 10  # 8N1: start bit, 8 data bits, stop bit


def length_ok(op: Op, length: int, payload: bytes) -> bool:
    """The receiver's length rule per op (boards/host_link.py CHECK state)."""
    if op in (Op.RESET, Op.STATUS, Op.HELLO):
        return length == 0
    if op == Op.FEED:
        return length >= 2 and length % 2 == 0
    if op == Op.GENERATE:
        return length == 2 and payload != b"\0\0"
    return length >= 5 and length % 2 == 1  # LORA


class Chip:
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
        self._shifts = frozenset(shift_addresses(qm))  # a_shift and b_shift registers: a LORA frame writing 0 is refused
        self.dropped = 0  # bytes the receive FIFO dropped (each overflow is reported with one ERROR OVERFLOW)
        self._fresh = True  # the next token fed starts a new sequence
        self._prediction: int | None = None
        # the decoder's status
        self.tokens = 0
        self.cycles = 0
        self.context_full = False
        self.bad_token = False
        self.overflowed = False  # STATUS flag: an ERROR OVERFLOW was sent since the last RESET
        self._cycles_per_token = cycle_estimator(qm, rows, lanes)

    def _verdict(self, whole: bytes) -> Error | None:
        """A whole frame (after SYNC): CRC, op, length, a LORA's shifts, in that order (BUSY comes after, and depends
        on time)."""
        op, length, payload = whole[0], whole[1], whole[2:-1]
        if protocol.crc8(whole[:-1]) != whole[-1]:
            return Error.BAD_CRC
        if op not in Op._value2member_map_:
            return Error.UNKNOWN_OP
        if not length_ok(Op(op), length, payload):
            return Error.BAD_LENGTH
        if op == Op.LORA and self._zero_shift(payload):
            return Error.BAD_LORA_SHIFT
        return None

    def _zero_shift(self, payload: bytes) -> bool:
        """Some word of a LORA payload would write 0 to a shift register: its low 6 bits (what the register keeps) are
        0 and its address, wrapped at the port's width as the board wraps it, is an a_shift or b_shift."""
        address = int.from_bytes(payload[:3], "little")
        return any(payload[i] & 0x3F == 0 and (address + k) & self.lora.mask in self._shifts
                   for k, i in enumerate(range(3, len(payload) - 1, 2)))

    def _report(self, op: Op, clock: int | None = None) -> bytes:
        """The reply to STATUS (its cycles: `clock`, or the decoding cycles when None) or HELLO."""
        if op == Op.STATUS:
            flags = Flag(0)
            if self.context_full:
                flags |= Flag.CONTEXT_FULL
            if self.bad_token:
                flags |= Flag.BAD_TOKEN
            if self.overflowed:
                flags |= Flag.OVERFLOW
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


def error_reply(code: Error) -> bytes:
    return protocol.frame(Reply.ERROR, bytes([code]))


def cycle_estimator(qm: QModel, rows: int, lanes: int) -> Callable[[int], int]:
    """STATUS's cycle count: the sum of the build report's per-token estimates.

    The chip reports a free-running clock counter; the emulator has no clock, so it counts
    only the cycles its decoding would have taken (idle time between commands is not in it).
    """
    from ..rtl.plan import cycles_per_token_estimate

    plan = HardwarePlan(rows=rows, lanes=lanes)
    return lambda position: cycles_per_token_estimate(qm, plan, position)

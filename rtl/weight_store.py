"""Weight store: one weight tensor baked in at elaboration time (docs/numerics.md §2, §11).

The tensor is cut into words of `lanes` codes, the unit the MAC array consumes per cycle.
Codes are stored at their own width (int, int_group: `code_bits` two's complement; MXFP4: the
4-bit E2M1 encoding) and decoded to signed 8-bit lane values on the way out, so the storage is
as small as the format allows. MXFP4 words also carry their block's 5-bit shift, int_group
words their group's 3-bit shift.

Two storages with the same timing (address with `en` high in cycle n, data in cycle n+1,
held while `en` is low): "rom", a synchronous `Memory` that FPGA tools map to block RAM,
and "logic", a registered case table that synthesis turns into gates (the ASIC form).
"""

from __future__ import annotations

import numpy as np
from amaranth.hdl import Elaboratable, Module, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..quant.weights import GROUP_SHIFT_BITS, MX_SHIFT_BITS

LANE_BITS = 8  # decoded code width on the outputs: int8 covers every scheme (MXFP4 ×2 values reach ±12)
SHIFT_BITS = 5  # per-word block shift on the output port
MAX_SHIFT = 24  # quant.quantize.MAX_BLOCK_SHIFT: the datapath shifts at most this far
MX_BLOCK = 32  # MXFP4 block and int_group group length along the input dimension
E2M1_X2 = (0, 1, 2, 3, 4, 6, 8, 12)  # E2M1 magnitude × 2, by 3-bit magnitude index
STORAGES = ("rom", "logic")
SHIFT_FIELD_BITS = {"int": 0, "int_group": GROUP_SHIFT_BITS, "mxfp4": MX_SHIFT_BITS}  # the shift a stored word carries
SCHEMES = tuple(SHIFT_FIELD_BITS)


def _first_bad(mask: np.ndarray) -> tuple[int, int]:
    """(row, column) of the first True in a 2-D mask, row-major."""
    r, c = np.argwhere(mask)[0]
    return int(r), int(c)


class WeightStore(wiring.Component):
    """`addr` + `en` in, one word of `lanes` decoded signed codes and its shift out a cycle later.

    Word address = row * chunks + chunk, chunks = ceil(cols / lanes); the last chunk of a row
    is zero-padded.
    """

    def __init__(self, codes: np.ndarray, block_shift: np.ndarray | None, *, lanes: int, code_bits: int, scheme: str,
                 storage: str) -> None:
        self._init_words([(codes, block_shift)], lanes=lanes, code_bits=code_bits, scheme=scheme, storage=storage)

    @classmethod
    def concat(cls, segments: list[tuple[np.ndarray, np.ndarray | None]], *, lanes: int, code_bits: int, scheme: str,
               storage: str) -> WeightStore:
        """Several tensors of one format in one memory, one after the other; `bases` gives each one's first word.

        Row-parallel engines keep every tensor's share of a bank in one deep memory: block RAM is only full
        when it is deep, and one memory per bank needs no multiplexer over tensors.
        """
        store = cls.__new__(cls)
        store._init_words(segments, lanes=lanes, code_bits=code_bits, scheme=scheme, storage=storage)
        return store

    def _init_words(self, segments: list[tuple[np.ndarray, np.ndarray | None]], *, lanes: int, code_bits: int,
                    scheme: str, storage: str) -> None:
        words: list[int] = []
        self.bases: list[int] = []
        try:
            if not segments:
                raise ValueError("a weight store needs at least one tensor")
            for codes, block_shift in segments:
                self.bases.append(len(words))
                words += self._pack(codes, block_shift, lanes=lanes, code_bits=code_bits, scheme=scheme,
                                    storage=storage)
        except ValueError:
            self._MustUse__silence = True  # a refused component is not an unused one
            raise
        self._words_init = words
        if len(segments) > 1:  # rows, cols and chunks describe one tensor; a concatenation has only words
            self.rows = self.cols = self.chunks = None
        self.words = len(words)
        self.lanes = int(lanes)
        self.code_bits = int(code_bits)
        self.scheme = scheme
        self.storage = storage
        super().__init__({
            "addr": In(unsigned(max(1, (self.words - 1).bit_length()))),
            "en": In(1),
            "codes": Out(data.ArrayLayout(signed(LANE_BITS), self.lanes)),
            "shift": Out(unsigned(SHIFT_BITS)),
        })

    def _pack(self, codes: np.ndarray, block_shift: np.ndarray | None, *, lanes: int, code_bits: int, scheme: str,
              storage: str) -> list[int]:
        """Validate the arguments and build the stored words (Python ints); sets rows, cols, chunks, words, word_bits."""
        if storage not in STORAGES:
            raise ValueError(f"storage must be 'rom' or 'logic', got {storage!r}")
        if scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {', '.join(SCHEMES)}, got {scheme!r}")
        if isinstance(lanes, bool) or not isinstance(lanes, int | np.integer) or not 1 <= lanes <= 64 or lanes & (lanes - 1):
            raise ValueError(f"lanes must be a power of two between 1 and 64, got {lanes!r}")
        lanes = int(lanes)
        if SHIFT_FIELD_BITS[scheme] and MX_BLOCK % lanes:
            raise ValueError(f"lanes must divide 32 for scheme {scheme!r} (one block shift per word), got {lanes}")
        if isinstance(code_bits, bool) or not isinstance(code_bits, int | np.integer):
            raise ValueError(f"code_bits must be an int, got {code_bits!r}")
        code_bits = int(code_bits)
        if scheme != "mxfp4" and not 2 <= code_bits <= 8:
            raise ValueError(f"code_bits must be between 2 and 8 for scheme {scheme!r}, got {code_bits}")
        if scheme == "mxfp4" and code_bits != 4:
            raise ValueError(f"code_bits must be 4 for scheme 'mxfp4', got {code_bits}")

        q = np.asarray(codes)
        if q.ndim != 2 or not np.issubdtype(q.dtype, np.integer):
            raise ValueError(f"codes must be a 2-D (rows, cols) integer array, got shape {q.shape} of dtype {q.dtype}")
        if q.size == 0:
            raise ValueError(f"codes is empty (shape {q.shape}); a weight store needs at least one row and column")
        q = q.astype(np.int64)
        if scheme != "mxfp4":
            lo, hi = -(1 << (code_bits - 1)), (1 << (code_bits - 1)) - 1
            bad = (q < lo) | (q > hi)
            if bad.any():
                r, c = _first_bad(bad)
                raise ValueError(f"code {q[r, c]} at row {r}, column {c} does not fit {code_bits}-bit two's complement "
                                 f"[{lo}, {hi}]")
        else:
            bad = ~np.isin(np.abs(q), E2M1_X2)
            if bad.any():
                r, c = _first_bad(bad)
                raise ValueError(f"code {q[r, c]} at row {r}, column {c} is not an MXFP4 value ×2 "
                                 f"(0, ±1, ±2, ±3, ±4, ±6, ±8, ±12)")

        if block_shift is None:
            s = np.zeros(q.shape, dtype=np.int64)
        else:
            s = np.asarray(block_shift)
            if s.shape != q.shape or not np.issubdtype(s.dtype, np.integer):
                raise ValueError(f"block_shift must be an integer array of the shape of codes {q.shape}, got shape "
                                 f"{s.shape} of dtype {s.dtype}")
            s = s.astype(np.int64)
        shift_bits = SHIFT_FIELD_BITS[scheme]  # int words carry no shift: it is always 0
        top = min(MAX_SHIFT, (1 << shift_bits) - 1)
        bad = (s < 0) | (s > top)
        if bad.any():
            r, c = _first_bad(bad)
            raise ValueError(f"block_shift {s[r, c]} at row {r}, column {c} is outside 0..{top} (scheme {scheme!r})")

        rows, cols = q.shape
        chunks = -(-cols // lanes)
        self.rows, self.cols, self.chunks, self.words = rows, cols, chunks, rows * chunks
        self.word_bits = lanes * code_bits + shift_bits  # [lanes * code_bits] codes, lane 0 lowest | [shift_bits] shift

        padded = np.zeros((rows, chunks * lanes), dtype=np.int64)
        padded[:, :cols] = q
        if scheme != "mxfp4":
            stored = padded & ((1 << code_bits) - 1)  # two's complement
        else:
            index = np.searchsorted(np.array(E2M1_X2), np.abs(padded))  # magnitude index 0..7 (membership checked)
            stored = index | np.where(padded < 0, 8, 0)  # bit 3: sign; a zero is +0
        stored = stored.reshape(rows, chunks, lanes)

        # one shift per word: padding lanes copy the row's last real column, which lies in the same word
        s_pad = np.concatenate([s, np.repeat(s[:, -1:], chunks * lanes - cols, axis=1)], axis=1)
        s_words = s_pad.reshape(rows * chunks, lanes)  # (words, lanes)
        if shift_bits and (s_words != s_words[:, :1]).any():
            w, lane = _first_bad(s_words != s_words[:, :1])
            r, k = divmod(w, chunks)
            c0, c1 = k * lanes, min(cols, (k + 1) * lanes) - 1
            raise ValueError(f"block_shift differs inside word {w} (row {r}, columns {c0}..{c1}): {s_words[w, 0]} at column "
                             f"{c0} but {s_words[w, lane]} at column {c0 + lane}; a word needs one shift")

        words = np.zeros(rows * chunks, dtype=object)  # Python ints: a word can be up to 64 * 8 + 5 bits
        for lane in range(lanes):
            words += stored[:, :, lane].reshape(-1).astype(object) << (lane * code_bits)
        if shift_bits:
            words += s_words[:, 0].astype(object) << (lanes * code_bits)
        init = [int(word) for word in words]
        return init

    @property
    def bits(self) -> int:
        """Storage size in bits: words * word_bits."""
        return self.words * self.word_bits

    @property
    def stored_words(self) -> list[int]:
        """The words as stored, each `word_bits` wide (what the fit estimate measures the live width of)."""
        return self._words_init

    def elaborate(self, platform: object) -> Elaboratable:
        m = Module()
        word = Signal(unsigned(self.word_bits))  # the word read last, registered (the memory's output in "rom")
        if self.storage == "rom":
            m.submodules.mem = mem = Memory(shape=unsigned(self.word_bits), depth=self.words, init=self._words_init)
            port = mem.read_port()  # synchronous: data follows addr by one cycle, holds while en is low
            m.d.comb += [port.addr.eq(self.addr), port.en.eq(self.en), word.eq(port.data)]
        else:
            stored = Signal(unsigned(self.word_bits), reset_less=True)  # no reset, like a block RAM's output register
            with m.If(self.en), m.Switch(self.addr):
                for address, value in enumerate(self._words_init):
                    with m.Case(address):
                        m.d.sync += stored.eq(value)
                with m.Default():  # an address past the last word reads zeros, as a blank ROM row would
                    m.d.sync += stored.eq(0)
            m.d.comb += word.eq(stored)

        cb = self.code_bits
        for lane in range(self.lanes):
            field = word[lane * cb:(lane + 1) * cb]  # [code_bits]
            if self.scheme != "mxfp4":
                m.d.comb += self.codes[lane].eq(field.as_signed())  # sign-extend to int8
            else:
                magnitude = Signal(unsigned(4), name=f"magnitude{lane}")  # E2M1 × 2: 0..12
                with m.Switch(field[:3]):
                    for index, value in enumerate(E2M1_X2):
                        with m.Case(index):
                            m.d.comb += magnitude.eq(value)
                with m.If(field[3]):
                    m.d.comb += self.codes[lane].eq(-magnitude)
                with m.Else():
                    m.d.comb += self.codes[lane].eq(magnitude)
        if SHIFT_FIELD_BITS[self.scheme]:
            m.d.comb += self.shift.eq(word[self.lanes * cb:])
        return m

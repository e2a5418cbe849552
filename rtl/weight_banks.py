"""Weight banks: the projections of one storage format, rows interleaved over `rows` banks.

A row-parallel engine (FINN's PE x SIMD, here `rows x lanes`) computes `rows` output rows
at once, so it needs `rows` weight words per cycle. Row `o` of every tensor lives in bank
`o % rows`; within a bank, a tensor's rows follow each other (`o // rows`, padded with
zero rows to whole groups), and the tensors of the format follow each other, so each bank
is one deep memory (block RAM is only full when it is deep) and no multiplexer chooses
among tensors. All banks read the same address, `base[t] + group * chunks[t] + chunk`, each from its own copy
of it (`addr[b]`): the engine keeps one address counter per bank, so that no one register drives the address
pins of every block RAM across the die.
"""

from __future__ import annotations

import numpy as np
from amaranth.hdl import Elaboratable, Module, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .weight_store import LANE_BITS, SHIFT_BITS, WeightStore


def bank_rows(codes: np.ndarray, rows: int, bank: int) -> np.ndarray:
    """Rows bank, bank + rows, ... of a (out, in) array, padded with zero rows to ceil(out / rows)."""
    groups = -(-codes.shape[0] // rows)
    share = np.zeros((groups, codes.shape[1]), dtype=np.int64)
    mine = np.asarray(codes[bank::rows], dtype=np.int64)
    share[:len(mine)] = mine
    return share


class WeightBanks(wiring.Component):
    """`addr[b]` (bank b's copy of the address) + `en` in; a cycle later, one word of `lanes` codes (and its block
    shift) from every bank."""

    def __init__(self, tensors: list[tuple[np.ndarray, np.ndarray | None]], *, rows: int, lanes: int, code_bits: int,
                 scheme: str, storage: str) -> None:
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            self._MustUse__silence = True
            raise ValueError(f"rows must be a positive int, got {rows!r}")
        self.rows, self.lanes = rows, lanes
        self.banks = []
        for bank in range(rows):
            segments = [(bank_rows(codes, rows, bank), None if shift is None else bank_rows(shift, rows, bank))
                        for codes, shift in tensors]
            self.banks.append(WeightStore.concat(segments, lanes=lanes, code_bits=code_bits, scheme=scheme,
                                                 storage=storage))
        self.bases = self.banks[0].bases  # the same in every bank: each holds ceil(out / rows) rows of a tensor
        self.words, self.word_bits = self.banks[0].words, self.banks[0].word_bits
        super().__init__({
            "addr": In(data.ArrayLayout(unsigned(max(1, (self.words - 1).bit_length())), rows)),
            "en": In(1),
            "codes": Out(data.ArrayLayout(data.ArrayLayout(signed(LANE_BITS), lanes), rows)),
            "shift": Out(data.ArrayLayout(unsigned(SHIFT_BITS), rows)),
        })

    @property
    def bits(self) -> int:
        return self.rows * self.words * self.word_bits

    def elaborate(self, platform: object) -> Elaboratable:
        m = Module()
        for index, bank in enumerate(self.banks):
            m.submodules[f"bank{index}"] = bank
            m.d.comb += [bank.addr.eq(self.addr[index]), bank.en.eq(self.en), self.codes[index].eq(bank.codes),
                         self.shift[index].eq(bank.shift)]
        return m

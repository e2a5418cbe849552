"""The LoRA SRAM and registers of one build as the emulator keeps them (host/emulator_chip.py): LORA words written
through the Decoder's lora port, decoded back into the reference's adapters with rtl/lora_map.py's address map (the
inverse of `lora_writes`), so adapters loaded over the wire decode as they would on the chip.
"""

from __future__ import annotations

import bisect

import torch

from ..quant.qmodel import QModel
from ..quant.reference import LoraAdapter
from ..rtl.lora_map import REGISTERS, RESET, LoraSlot, lora_addr_bits, lora_address_map


def _int8(word: int) -> int:
    """The low byte of a LoRA word as a signed int8 (the RTL keeps ldata[:8])."""
    low = word & 0xFF
    return low - 256 if low & 0x80 else low


class LoraSram:
    """The adapters' SRAM and registers of one build, written word by word as the Decoder's lora port is."""

    def __init__(self, qm: QModel) -> None:
        self.slots: list[LoraSlot] = lora_address_map(qm)
        self.mask = (1 << lora_addr_bits(qm)) - 1  # the port is lora_addr_bits wide: the 24-bit address wraps
        self._bases = [slot.a_base for slot in self.slots]
        self.a = [torch.zeros((s.rank, s.in_features), dtype=torch.int64) for s in self.slots]
        self.b = [torch.zeros((s.out_features, s.rank), dtype=torch.int64) for s in self.slots]
        self.regs = [dict(RESET) for _ in self.slots]
        self.touched: set[int] = set()  # untouched slots hold the all-zero adapter: the base model

    def write(self, address: int, word: int) -> None:
        address &= self.mask
        n = bisect.bisect_right(self._bases, address) - 1
        if n < 0 or address >= self.slots[n].end:
            return  # outside every slot: the RTL decodes no hit
        s = self.slots[n]
        if address < s.b_base:
            row, col = divmod(address - s.a_base, s.a_stride)
            if col < s.in_features:  # padding addresses are ignored
                self.a[n][row, col] = _int8(word)
        elif address < s.reg_base:
            row, col = divmod(address - s.b_base, s.b_stride)
            if col < s.rank:
                self.b[n][row, col] = _int8(word)
        else:
            name = REGISTERS[address - s.reg_base]
            self.regs[n][name] = word & (0x7FFF if name.endswith("mult") else 0x3F)  # 15-bit mults, 6-bit shifts
        self.touched.add(n)

    def adapters(self) -> dict[tuple[int, str], LoraAdapter]:
        """The written slots as the reference's adapters."""
        out = {}
        for n in sorted(self.touched):
            r = self.regs[n]

            def scale(mult: int, shift: int) -> tuple[int, int]:
                # a shift of 0 is no shift: x * m == round_shift(x * 2m, 1), the form the reference computes
                return (2 * mult, 1) if shift == 0 else (mult, shift)

            a_mult, a_shift = scale(r["a_mult"], r["a_shift"])
            b_mult, b_shift = scale(r["b_mult"], r["b_shift"])
            s = self.slots[n]
            out[s.layer, s.site] = LoraAdapter(a=self.a[n].clone(), b=self.b[n].clone(), a_mult=a_mult, a_shift=a_shift,
                                               b_mult=b_mult, b_shift=b_shift)
        return out

"""The Decoder's LoRA write port: where each adapter value lives in its flat address space.

One 16-bit write per address. For every (layer, site) slot, layer-major and in the order of
qm.lora.sites, the map holds
  A: rank rows of `a_stride` addresses, element A[j, k] at a_base + j * a_stride + k
     (a_stride = in rounded up to a power of two; the padding addresses are ignored),
  B: `out` rows of `b_stride` addresses, element B[o, j] at b_base + o * b_stride + j
     (b_stride = rank rounded up to a power of two; the padding addresses are ignored),
  then four registers: a_mult, a_shift, b_mult, b_shift.
A and B codes are int8, written as their 16-bit two's complement (the low byte is kept);
a_mult / b_mult keep 15 bits, a_shift / b_shift 6. Power-of-two strides keep the address
decode to bit slices. Reset state: A = B = 0 and (1 << 14, 15) scales, the all-zero adapter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..quant.qmodel import QModel
from ..quant.reference import LoraAdapter

REGISTERS = ("a_mult", "a_shift", "b_mult", "b_shift")
RESET = {"a_mult": 1 << 14, "a_shift": 15, "b_mult": 1 << 14, "b_shift": 15}


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass(frozen=True)
class LoraSlot:
    layer: int
    site: str
    rank: int
    in_features: int
    out_features: int
    a_base: int
    a_stride: int
    b_base: int
    b_stride: int
    reg_base: int  # a_mult, a_shift, b_mult, b_shift at reg_base + 0..3

    @property
    def end(self) -> int:
        return self.reg_base + len(REGISTERS)


def lora_address_map(qm: QModel) -> list[LoraSlot]:
    """Every adapter slot of this build with its address ranges; empty when rank is 0 or no sites."""
    rank = qm.lora.rank
    slots: list[LoraSlot] = []
    if rank == 0 or not qm.lora.sites:
        return slots
    base = 0
    for i, layer in enumerate(qm.layers):
        for site in qm.lora.sites:
            lin = getattr(layer, site)
            if lin is None:
                continue
            out_features, in_features = lin.codes.shape
            a_stride, b_stride = _pow2(in_features), _pow2(rank)
            a_base = base
            b_base = a_base + rank * a_stride
            reg_base = b_base + out_features * b_stride
            slots.append(LoraSlot(i, site, rank, in_features, out_features, a_base, a_stride, b_base, b_stride,
                                  reg_base))
            base = reg_base + len(REGISTERS)
    return slots


def lora_addr_bits(qm: QModel) -> int:
    slots = lora_address_map(qm)
    return max(1, ((slots[-1].end - 1).bit_length() if slots else 1))


def shift_addresses(qm: QModel) -> list[int]:
    """The addresses of every slot's a_shift and b_shift registers (reg_base + 1 and + 3), ascending: the board refuses
    a LORA frame that would write 0 to any of them (docs/protocol.md, ERROR BAD_LORA_SHIFT)."""
    return [slot.reg_base + REGISTERS.index(name) for slot in lora_address_map(qm) for name in ("a_shift", "b_shift")]


def lora_writes(qm: QModel, lanes: int, adapters: dict[tuple[int, str], LoraAdapter]) -> list[tuple[int, int]]:
    """(addr, data) pairs that load `adapters` into a Decoder for qm (lanes: that Decoder's MAC width).

    Slots not in `adapters` are left alone (write an all-zero adapter to clear one).
    """
    if lanes < 1 or lanes & (lanes - 1):
        raise ValueError(f"lanes must be a power of two, got {lanes}")
    slots = {(s.layer, s.site): s for s in lora_address_map(qm)}
    writes: list[tuple[int, int]] = []
    for key, adapter in adapters.items():
        if key not in slots:
            raise ValueError(f"no LoRA slot at layer {key[0]}, projection {key[1]!r}; this build has slots on "
                             f"{', '.join(qm.lora.sites) or 'none'} with rank {qm.lora.rank}")
        slot = slots[key]
        a, b = torch.as_tensor(adapter.a), torch.as_tensor(adapter.b)
        if tuple(a.shape) != (slot.rank, slot.in_features) or tuple(b.shape) != (slot.out_features, slot.rank):
            raise ValueError(f"LoRA for layers.{slot.layer}.{slot.site} must be A ({slot.rank}, {slot.in_features}) "
                             f"and B ({slot.out_features}, {slot.rank}); got A {tuple(a.shape)} and B {tuple(b.shape)}")
        for name, t in (("A", a), ("B", b)):
            if t.numel() and (int(t.min()) < -128 or int(t.max()) > 127):
                raise ValueError(f"LoRA {name} for layers.{slot.layer}.{slot.site} must hold int8 codes")
        for name in ("a_mult", "b_mult"):
            if not 0 <= getattr(adapter, name) < 1 << 15:
                raise ValueError(f"LoRA {name} for layers.{slot.layer}.{slot.site} must fit 15 unsigned bits")
        # a_shift / b_shift: between 1 and 63 by construction (LoraAdapter refuses 0, which adds 2**63 on the chip)
        for j, rowv in enumerate(a.tolist()):
            writes += [(slot.a_base + j * slot.a_stride + k, int(v) & 0xFFFF) for k, v in enumerate(rowv)]
        for o, rowv in enumerate(b.tolist()):
            writes += [(slot.b_base + o * slot.b_stride + j, int(v) & 0xFFFF) for j, v in enumerate(rowv)]
        writes += [(slot.reg_base + n, int(getattr(adapter, name))) for n, name in enumerate(REGISTERS)]
    return writes

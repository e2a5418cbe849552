"""The integer primitives every block of the decoder is made of (docs/numerics.md §1).

There is one way to change scale: multiply by a fixed-point multiplier, add half,
shift right arithmetically, saturate. The reference and the RTL both call it that way,
so both round identically (half towards +infinity; never banker's rounding).
"""

from __future__ import annotations

import math

import torch

MULT_BITS = 15  # multipliers are unsigned and normalised into [2**14, 2**15)
MAX_SHIFT = 62


class WidthError(ArithmeticError):
    """An intermediate left the width docs/numerics.md declares for it."""


def smin(bits: int) -> int:
    return -(1 << (bits - 1))


def smax(bits: int) -> int:
    return (1 << (bits - 1)) - 1


def saturate(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Clamp to the signed `bits`-bit range."""
    return x.clamp(smin(bits), smax(bits))


def round_shift(x: torch.Tensor, shift: int | torch.Tensor) -> torch.Tensor:
    """(x + 2**(shift-1)) >> shift, arithmetic: round half towards +infinity. shift >= 1."""
    if isinstance(shift, torch.Tensor):
        return (x + (torch.ones_like(shift) << (shift - 1))) >> shift
    return (x + (1 << (shift - 1))) >> shift


def rescale(x: torch.Tensor, mult: int | torch.Tensor, shift: int | torch.Tensor, bits: int | None) -> torch.Tensor:
    """saturate_bits(round_shift(x * mult, shift)); bits=None leaves the result unsaturated."""
    y = round_shift(x * mult, shift)
    return y if bits is None else saturate(y, bits)


def check_width(x: torch.Tensor, bits: int, what: str) -> torch.Tensor:
    """Raise WidthError if any value of x does not fit a signed `bits`-bit integer."""
    if x.numel():
        lo, hi = int(x.min()), int(x.max())
        if lo < smin(bits) or hi > smax(bits):
            bad = lo if lo < smin(bits) else hi
            raise WidthError(f"{what}: value {bad} does not fit its declared int{bits} "
                             f"[{smin(bits)}, {smax(bits)}]")
    return x


def multiplier(scale: float, what: str = "rescale") -> tuple[int, int]:
    """(mult, shift) with mult / 2**shift ~= scale, mult in [2**14, 2**15), 1 <= shift <= 62.

    Compile time only: floats are allowed here, the result is two integers.
    """
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"{what}: scale must be positive and finite, got {scale}")
    mantissa, exponent = math.frexp(scale)  # scale = mantissa * 2**exponent, mantissa in [0.5, 1)
    mult = math.floor(mantissa * (1 << MULT_BITS) + 0.5)
    shift = MULT_BITS - exponent
    if mult == 1 << MULT_BITS:  # mantissa rounded up to 1.0
        mult, shift = mult >> 1, shift - 1
    if shift < 1:
        raise ValueError(f"{what}: scale {scale} is too large for a {MULT_BITS}-bit multiplier with shift >= 1")
    if shift > MAX_SHIFT:  # vanishing scale: keep the smallest representable multiplier at the largest shift
        mult = max(1, math.floor(mult / 2 ** (shift - MAX_SHIFT) + 0.5))
        shift = MAX_SHIFT
    return mult, shift


def multipliers(scales: list[float] | tuple[float, ...], what: str = "rescale") -> tuple[torch.Tensor, torch.Tensor]:
    """Per-element (mult, shift) int64 tensors for a vector of scales."""
    pairs = [multiplier(float(s), what) for s in scales]
    return torch.tensor([m for m, _ in pairs], dtype=torch.int64), torch.tensor([s for _, s in pairs], dtype=torch.int64)


def bits_for(bound: int) -> int:
    """Signed width that holds every value in [-bound, bound]."""
    return max(2, int(bound).bit_length() + 1)

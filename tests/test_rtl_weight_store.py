"""rtl.WeightStore against the numpy codes it was built from: every word, both storages, int and MXFP4 codes."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest
from amaranth.hdl import Fragment
from rtl_sim import run

from hardwire.quant.weights import quantize_int_group, quantize_mxfp4
from hardwire.rtl.weight_store import WeightStore


def _int_codes(rows: int, cols: int, bits: int, seed: int) -> np.ndarray:
    """Random int codes with both extremes present in the first row."""
    rng = np.random.default_rng(seed)
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    codes = rng.integers(lo, hi + 1, size=(rows, cols))
    codes[0, :4] = [lo, hi, lo, hi][: min(4, cols)]
    return codes


def mxfp4_weights(rows: int, cols: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(codes, block_shift per element) from quantize_mxfp4 on a matrix whose blocks span up to 12 binades."""
    rng = np.random.default_rng(seed)
    n_blocks = -(-cols // 32)
    scale = np.ldexp(1.0, rng.integers(-6, 7, size=(rows, n_blocks)))  # (rows, n_blocks)
    w = rng.standard_normal((rows, cols)) * np.repeat(scale, 32, axis=1)[:, :cols]
    if n_blocks > 1:
        w[-1, :32] = 0.0  # an all-zero block: shift 0 whatever its neighbours
    qw = quantize_mxfp4(w)
    shift = np.repeat(qw.block_shift.astype(np.int64), 32, axis=1)[:, :cols]  # (rows, cols), as in QLinear
    codes = qw.codes.astype(np.int64)
    codes[0, :8] = [12, -12, 0, 1, -1, 8, -8, 6]  # every extreme, whatever the rounding gave
    return codes, shift


def int_group_weights(rows: int, cols: int, bits: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(codes, group shift per element) from quantize_int_group on a matrix whose groups span 7 binades."""
    rng = np.random.default_rng(seed)
    n_groups = -(-cols // 32)
    scale = np.ldexp(1.0, rng.integers(0, 8, size=(rows, n_groups)))
    qw = quantize_int_group(rng.standard_normal((rows, cols)) * np.repeat(scale, 32, axis=1)[:, :cols], bits)
    shift = np.repeat(qw.block_shift.astype(np.int64), 32, axis=1)[:, :cols]
    assert shift.max() > 0  # the groups really are shifted
    codes = qw.codes.astype(np.int64)
    codes[0, :2] = [-(1 << (bits - 1)), (1 << (bits - 1)) - 1]  # both extremes
    return codes, shift


def expected_words(codes: np.ndarray, shift: np.ndarray | None, lanes: int) -> list[tuple[list[int], int]]:
    """(lane codes, shift) per word address: rows cut into ceil(cols / lanes) zero-padded chunks."""
    rows, cols = codes.shape
    chunks = -(-cols // lanes)
    out = []
    for r in range(rows):
        for k in range(chunks):
            lane_codes = [int(codes[r, c]) if c < cols else 0 for c in range(k * lanes, (k + 1) * lanes)]
            out.append((lane_codes, 0 if shift is None else int(shift[r, k * lanes])))
    return out


CASES = {
    "int3": lambda: (_int_codes(5, 19, 3, 1), None, 4, 3, "int"),
    "int6": lambda: (_int_codes(4, 33, 6, 2), None, 8, 6, "int"),
    "int8": lambda: (_int_codes(3, 64, 8, 3), None, 16, 8, "int"),
    "int8-lane1": lambda: (_int_codes(2, 5, 8, 4), np.zeros((2, 5), dtype=np.int64), 1, 8, "int"),
    "mxfp4-8": lambda: (*mxfp4_weights(6, 70, 5), 8, 4, "mxfp4"),
    "mxfp4-32": lambda: (*mxfp4_weights(3, 96, 6), 32, 4, "mxfp4"),
    "int_group4-8": lambda: (*int_group_weights(5, 70, 4, 7), 8, 4, "int_group"),
    "int_group3-32": lambda: (*int_group_weights(3, 64, 3, 8), 32, 3, "int_group"),
}


@pytest.mark.parametrize("storage", ["rom", "logic"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_weight_store_reads_every_word(case, storage):
    codes, shift, lanes, code_bits, scheme = CASES[case]()
    if scheme != "int":
        assert shift.max() > 0  # the matrix really exercises block shifts
    store = WeightStore(codes, shift, lanes=lanes, code_bits=code_bits, scheme=scheme, storage=storage)
    want = expected_words(codes, shift, lanes)
    assert store.words == len(want) == codes.shape[0] * store.chunks
    assert store.word_bits == lanes * code_bits + {"int": 0, "int_group": 3, "mxfp4": 5}[scheme]
    assert store.bits == store.words * store.word_bits
    rng = random.Random(case + storage)
    order = list(range(store.words)) * 2
    rng.shuffle(order)
    seen: list[tuple[int, str, list[int], int]] = []  # (address, when, codes, shift)

    def sample(ctx, address: int, when: str) -> None:
        seen.append((address, when, list(ctx.get(store.codes)), ctx.get(store.shift)))

    async def reader(ctx):
        previous = None
        for address in order:
            ctx.set(store.addr, address)
            ctx.set(store.en, 1)
            if previous is not None:
                sample(ctx, previous, "before the edge")  # still the previous word: the read is synchronous
            await ctx.tick()
            ctx.set(store.en, 0)
            sample(ctx, address, "one cycle later")
            while rng.random() < 0.3:  # idle cycles at other addresses: the word holds while en is low
                ctx.set(store.addr, rng.randrange(store.words))
                await ctx.tick()
                sample(ctx, address, "held")
            previous = address

    run(store, reader)
    assert len(seen) >= 2 * len(order) - 1
    for address, when, got_codes, got_shift in seen:
        assert (got_codes, got_shift) == want[address], f"word {address} ({when})"


def test_weight_store_storage_size():
    codes = _int_codes(3, 10, 3, 7)  # 3 chunks of 4 per row, the last one half padding
    store = WeightStore(codes, None, lanes=4, code_bits=3, scheme="int", storage="logic")
    assert (store.chunks, store.words, store.word_bits, store.bits) == (3, 9, 12, 108)  # int words carry no shift
    Fragment.get(store, None)  # elaborates
    codes, shift = mxfp4_weights(2, 40, 8)
    store = WeightStore(codes, shift, lanes=8, code_bits=4, scheme="mxfp4", storage="rom")
    assert (store.chunks, store.words, store.word_bits, store.bits) == (5, 10, 37, 370)  # 8 x 4-bit codes + 5-bit shift
    Fragment.get(store, None)


@pytest.mark.parametrize("storage", ["rom", "logic"])
def test_weight_store_verilog_is_vendor_neutral(storage):
    from amaranth.back import verilog

    codes, shift = mxfp4_weights(2, 12, 9)
    store = WeightStore(codes, shift, lanes=4, code_bits=4, scheme="mxfp4", storage=storage)
    text = verilog.convert(store, name="weight_store")
    assert "module weight_store" in text
    for primitive in ("EBR", "SB_RAM", "DP16KD", "PDPW16KD", "RAMB", "BRAM", "altsyncram"):
        assert primitive not in text
    has_array = re.search(r"reg \[\d+:0\] \S+ \[\d+:0\];", text) is not None  # an inferable memory array
    assert has_array == (storage == "rom")


def _store(codes=((1, -1),), shift=None, lanes=2, code_bits=3, scheme="int", storage="rom"):
    return WeightStore(np.array(codes), None if shift is None else np.array(shift), lanes=lanes, code_bits=code_bits,
                       scheme=scheme, storage=storage)


@pytest.mark.parametrize("kwargs,message", [
    (dict(storage="bram"), r"storage must be 'rom' or 'logic', got 'bram'"),
    (dict(scheme="fp8"), r"scheme must be one of int, int_group, mxfp4, got 'fp8'"),
    (dict(lanes=3), r"lanes must be a power of two between 1 and 64, got 3"),
    (dict(lanes=128), r"lanes must be a power of two between 1 and 64, got 128"),
    (dict(lanes=0), r"lanes must be a power of two between 1 and 64, got 0"),
    (dict(lanes=64, scheme="mxfp4", code_bits=4),
     r"lanes must divide 32 for scheme 'mxfp4' \(one block shift per word\), got 64"),
    (dict(lanes=64, scheme="int_group", codes=((1, -1),), shift=((7, 7),)),
     r"lanes must divide 32 for scheme 'int_group' \(one block shift per word\), got 64"),
    (dict(code_bits=1), r"code_bits must be between 2 and 8 for scheme 'int', got 1"),
    (dict(code_bits=9), r"code_bits must be between 2 and 8 for scheme 'int', got 9"),
    (dict(code_bits=8, scheme="mxfp4"), r"code_bits must be 4 for scheme 'mxfp4', got 8"),
    (dict(codes=(1, 2)), r"codes must be a 2-D \(rows, cols\) integer array, got shape \(2,\) of dtype int64"),
    (dict(codes=((0.5, 1.0),)), r"codes must be a 2-D \(rows, cols\) integer array, got shape \(1, 2\) of dtype float64"),
    (dict(codes=np.zeros((0, 4), dtype=np.int64)),
     r"codes is empty \(shape \(0, 4\)\); a weight store needs at least one row and column"),
    (dict(codes=((0, 3), (4, 0))), r"code 4 at row 1, column 0 does not fit 3-bit two's complement \[-4, 3\]"),
    (dict(codes=((0, -129),), code_bits=8), r"code -129 at row 0, column 1 does not fit 8-bit two's complement \[-128, 127\]"),
    (dict(codes=((12, -5),), scheme="mxfp4", code_bits=4),
     r"code -5 at row 0, column 1 is not an MXFP4 value ×2 \(0, ±1, ±2, ±3, ±4, ±6, ±8, ±12\)"),
    (dict(codes=((16, 0),), scheme="mxfp4", code_bits=4),
     r"code 16 at row 0, column 0 is not an MXFP4 value ×2 \(0, ±1, ±2, ±3, ±4, ±6, ±8, ±12\)"),
    (dict(shift=((0, 0, 0),)),
     r"block_shift must be an integer array of the shape of codes \(1, 2\), got shape \(1, 3\) of dtype int64"),
    (dict(shift=((0, 25),), scheme="mxfp4", code_bits=4),
     r"block_shift 25 at row 0, column 1 is outside 0\.\.24 \(scheme 'mxfp4'\)"),
    (dict(shift=((-1, 0),), scheme="mxfp4", code_bits=4),
     r"block_shift -1 at row 0, column 0 is outside 0\.\.24 \(scheme 'mxfp4'\)"),
    (dict(shift=((8, 8),), scheme="int_group"), r"block_shift 8 at row 0, column 0 is outside 0\.\.7 \(scheme 'int_group'\)"),
    (dict(shift=((0, 2),)), r"block_shift 2 at row 0, column 1 is outside 0\.\.0 \(scheme 'int'\)"),
    (dict(codes=((1, 2, 3, 4), (1, 2, 3, 4)), shift=((3, 3, 3, 3), (5, 6, 6, 6)), scheme="mxfp4", code_bits=4),
     r"block_shift differs inside word 2 \(row 1, columns 0\.\.1\): 5 at column 0 but 6 at column 1; "
     r"a word needs one shift"),
])
def test_weight_store_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        _store(**kwargs)

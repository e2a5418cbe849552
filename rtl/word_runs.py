"""Writes of several elements in one cycle: a run into one word, a beat across banks, a group of lanes.

The wide epilogue hands rows on in beats: a beat is `len(values)` consecutive elements that start
at a multiple of that width (or a single element), so within a memory of `lanes`-element words
(len(values) divides lanes) it never crosses a word. The norm's input copy, the softmax's score
buffer and the decoder's hidden vector take beats this way; the other helpers here are the decoder's
other repeated writes (a run into a BankedVector, a beat across the KV banks, a norm or softmax word
into its lanes of an activation word).
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal


def write_run(m: Module, port: object, first: object, values: object, count: object, en: object,
              lanes: int) -> None:
    """Elements first .. first + count - 1 from values[0..count) into their lanes of word first // lanes of the
    memory behind write `port` (element granularity); nothing is written while `en` is low."""
    width = len(values)
    offset = Signal(range(max(2, lanes)), name="run_offset")  # the word lane of the run's first element
    m.d.comb += [offset.eq(first % lanes), port.addr.eq(first // lanes),
                 port.en.eq(Mux(en, ((1 << count) - 1) << offset, 0))]
    with m.Switch(offset % width if width > 1 else 0):  # lane k takes values[k - offset]
        for rotation in range(width):
            with m.Case(rotation):
                m.d.comb += [port.data[k].eq(values[(k - rotation) % width]) for k in range(lanes)]


def run_into(m: Module, vector: object, base: object, values: list, count: object, en: object) -> None:
    """Elements base .. base + count - 1 of a BankedVector from values[0..count)."""
    m.d.comb += [vector.wr_base.eq(base), vector.wr_count.eq(count), vector.wr_en.eq(en)]
    m.d.comb += [vector.wr_values[e].eq(values[e]) for e in range(len(values))]


def beat_bank_write(m: Module, ports: list, first: object, addr: object, lane: object, values: list,
                    count: object, en: object) -> None:
    """Elements first .. first + count - 1 into lane `lane` of word `addr` of banks first % len(ports) on: a beat
    of at most len(ports) elements that starts at a multiple of its width, so it lies in one word of each bank."""
    banks = len(ports)
    bits = (banks - 1).bit_length()
    for b, port in enumerate(ports):
        e = Signal(range(max(2, banks)), name=f"beat_lane{b}")  # the beat's element that bank b takes
        m.d.comb += e.eq((b + banks - first[:bits])[:bits] if banks > 1 else 0)
        value = values[0]
        for k in range(1, min(banks, len(values))):
            value = Mux(e == k, values[k], value)
        m.d.comb += [port.addr.eq(addr), port.en.eq(Mux(en & (e < count), 1 << lane, 0))]
        m.d.comb += [port.data[j].eq(value) for j in range(len(port.data))]


def lane_group_write(m: Module, port: object, index: object, values: object, lanes: int,
                     clear_above: object = 0) -> None:
    """Word `index` of len(values)-element words into its lanes of a `lanes`-wide memory (len(values) divides
    lanes); with `clear_above` high, the lanes above the group are written 0 too."""
    width = len(values)
    first = index * width  # the element in the group's first lane
    m.d.comb += port.addr.eq(first // lanes)
    with m.Switch(first % lanes if width < lanes else 0):
        for offset in range(0, lanes, width):
            with m.Case(offset):
                ours = ((1 << width) - 1) << offset
                m.d.comb += port.en.eq(Mux(clear_above, ((1 << lanes) - 1) & ~((1 << offset) - 1), ours))
                m.d.comb += [port.data[j].eq(values[j - offset] if offset <= j < offset + width else 0)
                             for j in range(lanes)]

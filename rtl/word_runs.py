"""A run of consecutive elements into one word of a lane-wide memory, in one cycle.

The wide epilogue hands rows on in beats: a beat is `len(values)` consecutive elements that start
at a multiple of that width (or a single element), so within a memory of `lanes`-element words
(len(values) divides lanes) it never crosses a word. The norm's input copy, the softmax's score
buffer and the decoder's hidden vector take beats this way.
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

"""What makes a token-exact case a test: varied tokens, and every break it claims to catch changing them.

A case (a quantised model, a prompt, a number of tokens) is only as strong as the outputs it compares.
`assert_case_catches` is called by every token-exact test on its own case, before or after the
simulation: the reference's outputs at every position must vary, and each named break of
quant/mutations.py (by default every one that applies to the model) must change at least one of them,
so that a chip with that bug fails the test.
"""

from __future__ import annotations

from collections import Counter

from hardwire.quant.mutations import breaks, outputs_at_every_position, undetected
from hardwire.quant.qmodel import QModel


def assert_varied(outputs: list[int]) -> None:
    """At least min(5, half the positions) distinct outputs, none taking more than half of the positions: an
    echo of the input or one repeated token says little about the layers that made it."""
    distinct, (common, count) = len(set(outputs)), Counter(outputs).most_common(1)[0]
    wanted = min(5, (len(outputs) + 1) // 2)
    assert distinct >= wanted and 2 * count <= len(outputs), \
        f"the reference's outputs {outputs} are not varied: {distinct} distinct (at least {wanted} wanted), " \
        f"token {common} at {count} of {len(outputs)} positions (at most half wanted)"


def assert_breaks_change_outputs(qm: QModel, prompt: list[int], n: int, names: tuple[str, ...]) -> None:
    """Each named break changes at least one output of the case (the prompt's predictions or a generated token)."""
    missed = undetected(qm, prompt, n, names)
    assert not missed, f"a chip with any of the breaks {missed} decodes exactly the outputs " \
                       f"{outputs_at_every_position(qm, prompt, n)} of prompt {prompt} (+{n} generated): this case " \
                       "cannot tell them from a working chip"


def assert_case_catches(qm: QModel, prompt: list[int], n: int, names: tuple[str, ...] | None = None,
                        skip: tuple[str, ...] = ()) -> list[int]:
    """The case's outputs vary and every named break (default: all that apply but `skip`) changes one of them.
    -> the reference's outputs at every position."""
    outputs = outputs_at_every_position(qm, prompt, n)
    assert_varied(outputs)
    assert_breaks_change_outputs(qm, prompt, n, tuple(name for name in (names or tuple(breaks(qm))) if name not in skip))
    return outputs

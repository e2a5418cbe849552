"""What to build when a board is named and the rest is not: the weight scheme and the engine shape.

`hardwire compile MODEL --board B` without --quant or a shape, and `hardwire demo` (its board is the
ULX3S-85F unless --board names another), size the chip for the board instead of building the
slowest engine in int8 or mixed36. Each choice prints one line saying what it chose and why.

The scheme is the best measured quality that fits. Quality is not measured at compile time: agreement with
the float model needs held-out text, which a user's model does not come with (tests/test_quality_floors.py
uses tinyshakespeare's validation split), and an integer-reference pass per scheme. The quantiser's own error
measure (QLinear.error, each projection's relative weight error) is cheap, and on the bundled character model its
parameter-weighted mean ranks the schemes as agreement does (int8 0.010, int4 0.142, mxfp4 0.156, mixed36 0.231,
int3 0.272; 2026-12-07), but ranking by it means quantising every scheme instead of stopping at the first that
fits, and it weighs weights, not outputs: mixed36's allocation by sensitivity is invisible to it. So the schemes
are tried in the order benchmarks/quality.py measured on both bundled models (QUALITY_ORDER), and the first with a
shape that fits wins: one quantisation and one fit estimate per scheme tried, no decode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ..quant.chain import largest_stage
from ..quant.qmodel import QModel
from ..rtl.plan import HardwarePlan, cycles_per_token_estimate
from .parts import FitError, FitEstimate, Part, choose_plan, estimate_model

# best measured quality first: top-1 agreement with the float model and KL(float || integer), benchmarks/quality.py
# --windows 200, 2026-12-06 (README's quality table): character model int8 97.75%, int4 88.60%, mxfp4 86.88%,
# mixed36 @ 4.0 84.18%, int3 76.30%; word-piece model 97.21%, 79.80%, 74.20%, 68.60%, 61.79%: one order on both
QUALITY_ORDER = ("int8", "int4", "mxfp4", "mixed36", "int3")
QUALITY_SOURCE = "benchmarks/quality.py, the same order on both bundled models"


@dataclass(frozen=True)
class SchemeChoice:
    """The weight scheme a board build uses, the model quantised with it, and why."""

    qm: QModel
    part: Part
    chosen: bool  # True: picked here for the board; False: given (--quant)
    rejected: tuple[str, ...] = ()  # better schemes that did not fit, best first

    @property
    def scheme(self) -> str:
        return self.qm.scheme

    def reason(self) -> str:
        """Why this scheme: "the best measured quality that fits the ULX3S-85F (order ...); int8 does not fit"."""
        if not self.chosen:
            return "as given"
        text = (f"the best measured quality that fits the {self.part.title} (order {' > '.join(QUALITY_ORDER)}: top-1 "
                f"agreement with the float model, {QUALITY_SOURCE})")
        if self.rejected:
            names = self.rejected[0] if len(self.rejected) == 1 else \
                f"{', '.join(self.rejected[:-1])} and {self.rejected[-1]}"
            text += f"; {names} {'does' if len(self.rejected) == 1 else 'do'} not fit"
        return text

    def summary(self) -> str:
        return f"scheme {self.scheme}: {self.reason()}"


@dataclass(frozen=True)
class ShapeChoice:
    """The engine shape a build uses, its block-RAM estimate on the board, and its cycles per token."""

    plan: HardwarePlan
    fit: FitEstimate
    cycles: int  # cycles per token at `position`, from the schedule
    position: int
    sized: bool  # True: the --rows auto shape for the board; False: given
    boards: int = 1  # a chain: the shape of each board, fitted on the stage that stores most

    def summary(self) -> str:
        """The line `hardwire compile --rows auto` has always printed; a given shape is named as such."""
        head = f"sized for the {self.fit.part.title}" if self.sized else "as given"
        if self.boards > 1:  # the chain's cycles per token follow in the build's summary
            return (f"{head}: {self.plan.shape} on each of {self.boards} boards ({self.plan.macs_per_cycle} MACs/cycle "
                    f"each); the board that stores most: {self.fit.summary()}")
        return (f"{head}: {self.plan.shape} ({self.plan.macs_per_cycle} MACs/cycle), {self.cycles:,} cycles/token at "
                f"position {self.position}; {self.fit.summary()}")


def size_for_board(quantise: Callable[[str], QModel], part: Part, *, scheme: str | None, plan: HardwarePlan | None,
                   storage: str = "rom", boards: int = 1,
                   progress: Callable[[str], None] = lambda line: None) -> tuple[SchemeChoice, ShapeChoice]:
    """The scheme (as given, or the first of QUALITY_ORDER with a shape that fits the part) and the shape (as given,
    or the --rows auto shape) of a board build. `quantise(scheme)` quantises the model; it runs once per scheme
    tried. Raises FitError naming each scheme's reason when none fits (or the given scheme's own error).
    boards > 1: a chain (quant/chain.py); each board has the same shape, fitted on the stage that stores most."""
    floor = part.lut_floor_problem("the decoder")  # no scheme, shape or context gets under it
    if floor:
        raise FitError(f"no model fits the {part.title}: {floor}")
    schemes = QUALITY_ORDER if scheme is None else (scheme,)
    given = None if plan is None else replace(plan, storage=storage)
    reasons: list[tuple[str, str]] = []
    for name in schemes:
        progress(f"quantising ({name}) ...")
        qm = quantise(name)
        on_board = largest_stage(qm, boards) if boards > 1 else qm
        try:
            if given is None:
                chosen, fit, cycles = choose_plan(on_board, part, storage)
                shape = ShapeChoice(chosen, fit, cycles, qm.context // 2, sized=True, boards=boards)
            else:
                fit = estimate_model(on_board, part, given, label=f"{name}, {given.shape}")
                fit.check()
                shape = ShapeChoice(given, fit, cycles_per_token_estimate(on_board, given, qm.context // 2),
                                    qm.context // 2, sized=False, boards=boards)
        except FitError as err:
            if scheme is not None:
                raise
            progress(f"  {name} does not fit the {part.title}: {err}")
            reasons.append((name, str(err)))
            continue
        return SchemeChoice(qm, part, chosen=scheme is None, rejected=tuple(n for n, _ in reasons)), shape
    raise FitError(f"no weight scheme fits the {part.title} (tried {', '.join(schemes)}; {reasons[-1][0]}, the "
                   f"narrowest: {reasons[-1][1]})")

"""Progress for long-running steps: a bar with what is done and what is left, and log tails on failure.

Quantisation, the Verilator build, the cocotb simulation, yosys and nextpnr each run from seconds to many
minutes. On a terminal the user sees a rich progress bar per step (done, total, elapsed, an estimate of
what is left); anywhere else (a CI log, a pipe) a plain line at most every PLAIN_EVERY_S seconds and one
when a step or a phase of it ends, so logs stay short. The tools write their own logs; a LogFollower reads
what they append and a parser per tool (NextpnrLog, YosysLog, VerilatorBuildLog, sim_progress) turns
their lines into Readings. `TTY_INTERACTIVE=0` forces the plain lines on a terminal too (rich's switch).
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from rich.console import Console

PLAIN_EVERY_S = 30.0  # without a terminal: at most one progress line per step this often
POLL_S = 1.0  # how often a running tool's log is read
SIM_TAG = "hardwire-progress"  # the testbench's progress lines in the simulator's output: "hardwire-progress 12/38"

T = TypeVar("T")


@dataclass(frozen=True)
class Reading:
    """How far a step is: its phase (a new phase starts a new bar), done out of total (None: not known
    in advance), the unit of both, and a short note on what it is doing."""

    phase: str = ""
    done: float = 0
    total: float | None = None
    unit: str = ""
    detail: str = ""

    def count(self) -> str:
        """'12/38 tokens', '56%', '7 passes', or '' when nothing is counted."""
        if self.unit == "%":
            return f"{self.done:.0f}%"
        if self.total is None:
            return f"{self.done:,.0f} {self.unit}" if self.unit else ""
        return f"{self.done:,.0f}/{self.total:,.0f}{' ' + self.unit if self.unit else ''}"


def duration(seconds: float) -> str:
    """'42 s', '3 min 05 s', '1 h 02 min': short enough for a progress line."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class Bar:
    """One long step's progress: a rich bar on an interactive terminal, plain lines otherwise.

    Readings come from the step's own loop (`advance`) or from a tool's log (`show`, with `watch`).
    A reading with a new phase finishes the phase before (nextpnr: packing, placing, routing).
    """

    def __init__(self, label: str, total: float | None = None, *, unit: str = "", phase: str = "",
                 enabled: bool = True, console: Console | None = None, every: float = PLAIN_EVERY_S) -> None:
        self.label, self.enabled, self.every = label, enabled, every
        self.reading = Reading(phase, total=total, unit=unit)
        self.start = self._phase_start = self._printed = time.monotonic()
        self._lock = threading.Lock()
        self._rich = None
        if not enabled:
            return
        from rich.console import Console

        self.console = console if console is not None else Console()
        if self.console.is_interactive:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._rich = Progress(TextColumn("  {task.description}"), BarColumn(), TextColumn("{task.fields[count]}"),
                                  TimeElapsedColumn(), TextColumn("elapsed,"), TimeRemainingColumn(), TextColumn("left"),
                                  TextColumn("{task.fields[detail]}"), console=self.console)
            self._rich.start()
            self._task = self._add_task(self.reading)

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self.close(ok=kind is None)

    def _description(self, reading: Reading) -> str:
        return f"{self.label}, {reading.phase}" if reading.phase else self.label

    def _add_task(self, reading: Reading) -> int:
        return self._rich.add_task(self._description(reading), total=reading.total, completed=reading.done,
                                   count=reading.count(), detail=reading.detail)

    def _finish_task(self) -> None:
        """Show the current phase as complete: a tool that moved on (or ended well) is done with it."""
        r = self.reading
        total = max(r.done, r.total or 0) or 1
        count = r.count() if r.total is None else replace(r, done=r.total).count()
        self._rich.update(self._task, total=total, completed=total, count=count)

    def show(self, reading: Reading | None = None) -> None:
        """Show a new reading (None: none came, but a plain line may be due: the user sees the step is alive)."""
        if not self.enabled:
            return
        with self._lock:
            now = time.monotonic()
            new_phase = reading is not None and reading.phase != self.reading.phase
            if new_phase:
                if self._rich is not None and self.reading.phase:
                    self._finish_task()
                elif self._rich is not None:  # the step's first reading names its phase: that line replaces this
                    self._rich.remove_task(self._task)
                self._phase_start = now
            if reading is not None:
                self.reading = reading
            if self._rich is not None:
                r = self.reading
                if new_phase:
                    self._task = self._add_task(r)
                else:
                    self._rich.update(self._task, completed=r.done, count=r.count(), detail=r.detail,
                                      **({} if r.total is None else {"total": r.total}))
            elif new_phase or now - self._printed >= self.every:
                self._printed = now
                print(self.plain_line(now), file=self.console.file, flush=True)

    def advance(self, n: float = 1, detail: str | None = None) -> None:
        """n more units done (a step's own loop)."""
        r = self.reading
        self.show(replace(r, done=r.done + n, detail=r.detail if detail is None else detail))

    def plain_line(self, now: float) -> str:
        """'  simulation: 12/38 tokens (32%), 4 s elapsed, about 9 s left: detail'."""
        r = self.reading
        count = r.count()
        if r.total and r.unit != "%":
            count += f" ({100 * r.done / r.total:.0f}%)"
        left = ""
        if r.total and 0 < r.done < r.total:  # linear within the phase: the rate so far, for what remains
            left = f", about {duration((now - self._phase_start) * (r.total - r.done) / r.done)} left"
        parts = [p for p in (count, f"{duration(now - self.start)} elapsed{left}") if p]
        return f"  {self._description(r)}: {', '.join(parts)}{': ' + r.detail if r.detail else ''}"

    def close(self, ok: bool = True) -> None:
        """End the display; a step that ended well shows complete (plain: one closing line with its time)."""
        if not self.enabled:
            return
        with self._lock:
            self.enabled = False
            if self._rich is not None:
                if ok:
                    self._finish_task()
                self._rich.stop()
            elif ok:
                r = self.reading
                count = "" if r.unit == "%" or not r.count() else f" ({r.count()})"
                print(f"  {self.label}: done in {duration(time.monotonic() - self.start)}{count}",
                      file=self.console.file, flush=True)


def track(items: Iterable[T], label: str, *, total: int | None = None, unit: str = "", enabled: bool = True,
          name: Callable[[T], str] | None = None) -> Iterator[T]:
    """Yield `items` under a Bar (as rich's track or tqdm): one unit done per item; `name(item)` tells the
    user which item is in work."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)
    with Bar(label, total, unit=unit, enabled=enabled) as bar:
        for item in items:
            if name is not None:
                bar.show(replace(bar.reading, detail=name(item)))
            yield item
            bar.advance()


@contextmanager
def watch(bar: Bar, poll: Callable[[], Reading | None] = lambda: None, every: float = POLL_S) -> Iterator[None]:
    """While the body waits on a tool, poll its progress every `every` seconds into `bar` (and once at the end)."""
    if not bar.enabled:
        yield
        return
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(every):
            bar.show(poll())

    watcher = threading.Thread(target=run, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()
        bar.show(poll())


class LogFollower:
    """Reads only what a running tool appended to its log since the last poll (a yosys log runs to hundreds
    of megabytes) and hands each complete line to a parser; poll() returns the latest Reading."""

    def __init__(self, path: Path, parse: Callable[[str], Reading | None]) -> None:
        self.path, self.parse = Path(path), parse
        self._offset, self._partial = 0, b""
        self.latest: Reading | None = None

    def poll(self) -> Reading | None:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:  # not there yet (the tool has not opened it) or unreadable: no news
            return self.latest
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            reading = self.parse(line.decode(errors="replace").rstrip())
            if reading is not None:
                self.latest = reading
        return self.latest


class NextpnrLog:
    """nextpnr's log (--log) as progress: packing, then placement iterations (no total: HeAP and annealing
    stop when the wirelength stops improving), then routing. router2 prints its overused wires per iteration,
    falling roughly geometrically to 0: shown as log(overused) against log(the first iteration's), which
    runs about even with the iterations. router1 prints the arcs left of the arcs it started with."""

    PACKING = re.compile(r"^Info: (Packing [\w -]+?)\.*$")
    INITIAL = re.compile(r"at initial placer iter (\d+), wirelen = (\d+)")
    HEAP = re.compile(r"at iteration #(\d+), type \w+: wirelen solved = \d+, spread = \d+, legal = (\d+)")
    ANNEAL = re.compile(r"at iteration #(\d+): temp = [\d.]+, timing cost = \d+, wirelen = (\d+)")
    ROUTER2 = re.compile(r"iter=(\d+) wires=\d+ overused=(\d+)")
    ARCS = re.compile(r"^Info: Routing (\d+) arcs\.")
    ROUTER1 = re.compile(r"^Info:\s+\d+ \|\s*\d+\s+\d+ \|\s*-?\d+\s+-?\d+ \|\s*(\d+)\|")  # router1.cc's table row

    def __init__(self) -> None:
        self.first_overused: int | None = None
        self.arcs = 0

    def __call__(self, line: str) -> Reading | None:
        if m := self.PACKING.search(line):
            return Reading("packing", detail=m[1])
        if m := self.INITIAL.search(line):
            return Reading("analytic placement", detail=f"initial placer iteration {m[1]}, wirelen {int(m[2]):,}")
        if m := self.HEAP.search(line):
            return Reading("analytic placement", int(m[1]), unit="iterations", detail=f"wirelen {int(m[2]):,}")
        if "Running simulated annealing placer" in line:
            return Reading("annealing placement", unit="iterations")
        if m := self.ANNEAL.search(line):
            return Reading("annealing placement", int(m[1]), unit="iterations", detail=f"wirelen {int(m[2]):,}")
        if "Running router2" in line:
            self.first_overused = None
            return Reading("routing", 0, 100, "%", "setting up")
        if m := self.ROUTER2.search(line):
            overused = int(m[2])
            if self.first_overused is None:
                self.first_overused = overused
            share = 1 - math.log1p(overused) / math.log1p(self.first_overused) if self.first_overused else 1
            return Reading("routing", round(100 * share, 1), 100, "%",
                           f"iteration {m[1]}, overused wires: {overused:,}")
        if m := self.ARCS.search(line):
            self.arcs = int(m[1])
            return None
        if (m := self.ROUTER1.search(line)) and self.arcs:
            left = int(m[1])
            return Reading("routing (router1)", max(0, self.arcs - left), self.arcs, "arcs", f"arcs left: {left:,}")
        return None


class YosysLog:
    """yosys's log (-l) as progress: the passes begun, headings numbered N. and N.M. (deeper ones are steps
    inside a pass). The total is the count of an earlier log of the same script (the same folder rebuilt),
    when there is one: yosys's script, not the design, fixes it."""

    HEADING = re.compile(r"^(\d+(?:\.\d+)?)\. ([A-Z].*?)\.*$")

    def __init__(self, total: int | None = None) -> None:
        self.total, self.passes = total, 0

    def __call__(self, line: str) -> Reading | None:
        m = self.HEADING.match(line)
        if m is None:
            return None
        self.passes += 1
        total = self.total if self.total is not None and self.passes <= self.total else None
        name = m[2].removeprefix("Executing ")
        return Reading("", self.passes, total, "passes", f"{m[1]} {name[:70]}")

    @classmethod
    def count(cls, path: Path) -> int | None:
        """Passes in a finished log (None if there is none): the total for the next run of the same script."""
        if not path.exists():
            return None
        with path.open("rb") as f:
            return sum(1 for line in f if line[:1].isdigit() and cls.HEADING.match(line.decode(errors="replace")))


class VerilatorBuildLog:
    """The Verilator build's log as progress: verilating (no count: Verilator prints nothing until it is
    done), then make compiling the generated C++ files (those in the build folder) one per command line."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.total, self.compiled = Path(folder), None, 0

    def __call__(self, line: str) -> Reading | None:
        if line.startswith("make: Entering directory"):
            self.total = len(list(self.folder.glob("*.cpp")))
            return Reading("compiling", 0, self.total, "files")
        words = line.split()
        if self.total is None or not words:
            return None
        source = words[-1]
        if source.endswith(".cpp") and "/" not in source:  # the runtime's own .cpp files come by their full path
            self.compiled += 1
            return Reading("compiling", min(self.compiled, self.total), self.total, "files", source)
        if len(words) > 1 and words[-2] == "-o" and not source.endswith((".o", ".gch")):
            return Reading("compiling", self.total, self.total, "files", f"linking {source}")
        return None


def sim_progress_line(done: int, total: int) -> str:
    """What the testbench prints after each token (runs inside the simulator; the runner reads its log)."""
    return f"{SIM_TAG} {done}/{total}"


def sim_progress(line: str) -> Reading | None:
    """The simulator's log as progress: the testbench's latest count of tokens through the decoder."""
    if SIM_TAG not in line:
        return None
    m = re.search(rf"{SIM_TAG} (\d+)/(\d+)", line)
    return None if m is None else Reading("", int(m[1]), int(m[2]), "tokens")


def tail(path: Path, n: int) -> list[str]:
    """The last n lines, read from the file's end: a large design's yosys log runs to hundreds of megabytes."""
    if not path.exists():
        return []
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 256 * n))
        text = f.read().decode(errors="replace")
    return [line.rstrip() for line in text.splitlines()[-n:]]

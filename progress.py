"""Progress for long-running steps: a heartbeat line while a tool works, and log tails on failure.

Verilator builds, yosys and nextpnr run for minutes with their own output in a log file;
the user sees one line every HEARTBEAT_S instead of pages of compiler output, and the end
of the log when something fails.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

HEARTBEAT_S = 30.0  # how often a long-running tool reports that it is still at work


@contextmanager
def heartbeat(label: str, *, enabled: bool = True, detail: Callable[[], str] = lambda: "",
              every: float = HEARTBEAT_S) -> Iterator[None]:
    """While the body runs, print `label: still working, N s[: detail()]` every `every` seconds."""
    start = time.time()
    done = threading.Event()

    def beat() -> None:
        while not done.wait(every):
            step = detail()
            print(f"  {label}: still working, {time.time() - start:.0f} s{': ' + step if step else ''}", flush=True)

    watcher = threading.Thread(target=beat, daemon=True)
    if enabled:
        watcher.start()
    try:
        yield
    finally:
        done.set()


def tail(path: Path, n: int) -> list[str]:
    """The last n lines, read from the file's end: a large design's yosys log runs to hundreds of megabytes."""
    if not path.exists():
        return []
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 256 * n))
        text = f.read().decode(errors="replace")
    return [line.rstrip() for line in text.splitlines()[-n:]]

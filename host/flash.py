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

from ..boards.parts import PARTS, part

# openFPGALoader's board names are Part.loader_board (boards/parts.py): the ULX3S's FT231X JTAG bit-bang (every size);
# the iCEBreaker's FT2232H on the SPI flash with the pinout most iCE40 boards share (openFPGALoader's docs, "Lattice
# notes"); the Colorlight 5A-75B through a JTAG cable on J27 (-b colorlight); the OrangeCrab's DFU bootloader
# (-b orangecrab: hold its button while plugging it in); the Tang boards' BL616 or FT2232 debuggers (-b tangnano20k,
# tangprimer25k, tangconsole, tangmega138k: openFPGALoader 1.1's names; amaranth-boards' Tang Mega 138K Pro platform
# uses tangmega138k). The bitstream is the packer's (Part.bitstream): top.bit, top.bin or top.fs.
LOADER_BOARD = {name: target.loader_board for name, target in PARTS.items()}
BITSTREAM = {name: target.bitstream for name, target in PARTS.items()}
# boards whose bitstream always goes to the SPI flash: the iCEBreaker (its FT2232H reaches only the flash) and the
# OrangeCrab (its DFU bootloader writes the flash); the others load into SRAM unless --flash is given
ALWAYS_FLASH = ("icebreaker", "orangecrab_25f", "orangecrab_85f")
PORT = {"ulx3s": "the US1 port", "orangecrab_25f": "its USB-C port, with the button held",
        "orangecrab_85f": "its USB-C port, with the button held", "colorlight_5a75b": "a JTAG cable on J27"}
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
    board = target.board
    path = folder / f"board_{board}" / target.bitstream
    if not path.is_file() or path.stat().st_size == 0:
        raise FileNotFoundError(f"{folder} has no bitstream for the {target.title} ({path} is missing); build it with "
                                f"`hardwire build {folder} --board {board}`")
    return path


def flash(folder: Path, board: str, *, write_flash: bool = False, progress: bool = True) -> Path:
    """Load folder's bitstream for `board`: into the FPGA's SRAM (ULX3S, unless write_flash) or its SPI flash."""
    target = part(board)
    board = target.board
    bit = bitstream_path(folder, board)
    program = loader()
    argv = [program, "-b", target.loader_board]
    if write_flash and board not in ALWAYS_FLASH:
        argv.append("-f")  # the iCEBreaker and the OrangeCrab are always written to their SPI flash
    argv.append(str(bit))
    if progress:
        print(" ".join(argv), flush=True)
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise FlashError(f"openFPGALoader could not load the {target.title} (exit {proc.returncode}): "
                         f"{_summary(proc.stdout + proc.stderr)}. Is the board plugged in over USB "
                         f"({PORT.get(board, 'the US1 port' if board.startswith('ulx3s') else 'its USB port')}), "
                         f"and may this user open it "
                         f"(udev rules, the plugdev or dialout group)?")
    if progress:
        where = "SPI flash" if write_flash or board in ALWAYS_FLASH else "SRAM (lost at power-off; --flash keeps it)"
        print(f"loaded {bit} into the {target.title}'s {where}")
    return bit


def _summary(output: str) -> str:
    """The lines of openFPGALoader's output that say what went wrong, or its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    bad = [line for line in lines if any(word in line.lower() for word in ("error", "fail", "unable", "not found",
                                                                             "no device", "cannot"))]
    picked = bad[-3:] if bad else lines[-1:]
    return " / ".join(picked) if picked else "no output"

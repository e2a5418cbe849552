"""`hardwire flash`: the three ways it fails without a board, each with the message that says what to do.

No test here needs a board or openFPGALoader: a stand-in script in tmp_path behaves like the
real program does with no cable (it prints its error and exits 1), or like a working one.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hardwire.cli import main
from hardwire.host.flash import INSTALL, FlashError, bitstream_path, flash


def _fake_loader(tmp_path: Path, *, code: int, output: str) -> Path:
    """An executable named openFPGALoader that records its arguments, prints `output` and exits with `code`."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "openFPGALoader"
    script.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'args.txt'}\nprintf '%s\\n' '{output}'\nexit {code}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return bindir


def _folder_with_bitstream(tmp_path: Path, board: str) -> Path:
    folder = tmp_path / "build"
    name = "top.bit" if board == "ulx3s" else "top.bin"
    (folder / f"board_{board}").mkdir(parents=True)
    (folder / f"board_{board}" / name).write_bytes(b"\xff\x00bitstream")
    return folder


def test_flash_without_openfpgaloader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    folder = _folder_with_bitstream(tmp_path, "ulx3s")
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("OPENFPGALOADER", raising=False)
    with pytest.raises(FileNotFoundError) as err:
        flash(folder, "ulx3s", progress=False)
    assert str(err.value) == ("openFPGALoader is not installed: on Debian or Ubuntu `sudo apt-get install openfpgaloader`, "
                              "elsewhere see https://github.com/trabucayre/openFPGALoader (or set OPENFPGALOADER to the "
                              "program's path)")
    assert main(["flash", str(folder), "--board", "ulx3s"]) == 2
    assert capsys.readouterr().err == f"hardwire: error: {INSTALL}\n"


@pytest.mark.parametrize("board, name", [("ulx3s", "ULX3S-85F"), ("icebreaker", "iCEBreaker")])
def test_flash_without_bitstream(tmp_path: Path, board: str, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    file = "top.bit" if board == "ulx3s" else "top.bin"
    expected = (f"{folder} has no bitstream for the {name} ({folder}/board_{board}/{file} is missing); build it with "
                f"`hardwire build {folder} --board {board}`")
    with pytest.raises(FileNotFoundError) as err:
        bitstream_path(folder, board)
    assert str(err.value) == expected
    assert main(["flash", str(folder), "--board", board]) == 2
    assert capsys.readouterr().err == f"hardwire: error: {expected}\n"


def test_flash_when_no_board_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    folder = _folder_with_bitstream(tmp_path, "ulx3s")
    bindir = _fake_loader(tmp_path, code=1, output="unable to open ftdi device: -3 (device not found)")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("OPENFPGALOADER", raising=False)
    expected = ("openFPGALoader could not load the ULX3S-85F (exit 1): unable to open ftdi device: -3 (device not found). "
                "Is the board plugged in over USB (the US1 port), and may this user open it (udev rules, the plugdev or "
                "dialout group)?")
    with pytest.raises(FlashError) as err:
        flash(folder, "ulx3s", progress=False)
    assert str(err.value) == expected
    assert (tmp_path / "args.txt").read_text().split() == ["-b", "ulx3s", str(folder / "board_ulx3s" / "top.bit")]
    assert main(["flash", str(folder), "--board", "ulx3s"]) == 2
    assert capsys.readouterr().err.endswith(f"hardwire: error: {expected}\n")


@pytest.mark.parametrize("board, args", [("ulx3s", ["-b", "ulx3s", "-f"]), ("icebreaker", ["-b", "ice40_generic"])])
def test_flash_arguments_when_the_loader_succeeds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, board: str,
                                                  args: list[str]) -> None:
    folder = _folder_with_bitstream(tmp_path, board)
    bindir = _fake_loader(tmp_path, code=0, output="Done")
    monkeypatch.setenv("OPENFPGALOADER", str(bindir / "openFPGALoader"))
    bit = flash(folder, board, write_flash=True, progress=False)
    assert (tmp_path / "args.txt").read_text().split() == [*args, str(bit)]

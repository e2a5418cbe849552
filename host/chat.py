"""`hardwire chat`: type text, watch the board continue it, one character per TOKEN frame.

The board only knows token ids; the characters live on the host (the build folder's
vocab.json, or the bundled model's). HELLO comes first because a board flashed with another
model still answers every command, only with the wrong characters: the vocabulary size is
the one thing we can check, so it is checked before any text is sent.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from ..frontend.vocab import VocabError
from ..frontend.vocab import encode as vocab_encode
from .client import DeviceClient, DeviceTimeout, LinkError, Transport, open_serial
from .protocol import PROTOCOL_VERSION, Hello

BUNDLED_VOCAB = Path(__file__).resolve().parent.parent / "models" / "tinyshakespeare.vocab.json"


class ChatError(Exception):
    """A problem the user fixes (a wrong port, a prompt the model cannot read); the message says how."""


def load_vocab(build: Path | None) -> tuple[list[str], Path]:
    """The model's characters: BUILD/vocab.json, or the bundled model's; -> (vocab, the file it came from)."""
    path = BUNDLED_VOCAB if build is None else Path(build) / "vocab.json"
    if not path.exists():
        raise ChatError(f"{build} has no vocab.json (`hardwire compile` writes it for character models); "
                        "chat needs the model's characters")
    return list(json.loads(path.read_text())), path


def encode(text: str, vocab: list[str]) -> list[int]:
    """Text to token ids; ChatError naming every character the model does not have."""
    if not text:
        raise ChatError("the prompt is empty")
    try:
        return vocab_encode(text, vocab, "prompt")
    except VocabError as err:
        raise ChatError(str(err)) from None


class Chat:
    """One board session: HELLO checked against the vocabulary, then a continuation per prompt."""

    def __init__(self, transport: Transport, vocab: list[str], vocab_file: Path, *, timeout: float = 2.0,
                 out: TextIO | None = None) -> None:
        self.client = DeviceClient(transport, timeout=timeout)
        self.vocab, self.out = vocab, out or sys.stdout
        self.client.drain()  # whatever an earlier session left on the line
        try:
            self.hello: Hello = self.client.hello()
        except DeviceTimeout as err:
            raise ChatError(f"no answer to HELLO from {transport.name} within {timeout:g} s: is the board flashed "
                            "with `hardwire build BUILD --board ...` and `hardwire flash`, and on this port?") from err
        if self.hello.version != PROTOCOL_VERSION:
            raise ChatError(f"the board on {transport.name} speaks protocol version {self.hello.version}, this hardwire "
                            f"speaks {PROTOCOL_VERSION}: rebuild and flash the board with this hardwire")
        if self.hello.vocab != len(vocab):
            raise ChatError(f"the board's model has {self.hello.vocab} tokens but {vocab_file} lists {len(vocab)} "
                            "characters: pass --build with the folder the board was built from")

    def continue_text(self, text: str, n: int) -> str:
        """Print `text`, then n generated characters as they arrive; -> the continuation."""
        ids = encode(text, self.vocab)
        if len(ids) + n > self.hello.context:
            raise ChatError(f"the prompt ({len(ids)} characters) and -n {n} need {len(ids) + n} positions; the board's "
                            f"context holds {self.hello.context}: shorten the prompt or lower -n")
        self.client.reset()
        self.client.feed(ids)
        self.out.write(text)
        self.out.flush()
        pieces = []
        for token in self.client.generate(n):
            pieces.append(self.vocab[token])
            self.out.write(pieces[-1])
            self.out.flush()
        self.out.write("\n")
        self.out.flush()
        return "".join(pieces)


def run_chat(port: str, *, build: Path | None, n: int, prompt: str | None, baud: int = 115200, timeout: float = 2.0,
             read_line: Callable[[str], str] = input, out: TextIO | None = None) -> None:
    """`hardwire chat`: one prompt, or with prompt None a loop over lines read until end of input."""
    if n < 1:
        raise ChatError(f"-n must be at least 1, got {n}")
    vocab, vocab_file = load_vocab(build)
    if prompt is not None:
        encode(prompt, vocab)  # a bad prompt fails before the port is touched
    try:
        transport = open_serial(port, baud)
    except OSError as err:
        raise ChatError(str(err)) from err
    try:
        chat = Chat(transport, vocab, vocab_file, timeout=timeout, out=out)
        if prompt is not None:
            chat.continue_text(prompt, n)
            return
        while True:
            try:
                line = read_line("> ")
            except (EOFError, KeyboardInterrupt):
                chat.out.write("\n")
                return
            try:
                chat.continue_text(line, n)
            except (ChatError, LinkError) as err:  # this line failed; the next one resets the board anyway
                print(f"hardwire: error: {err}", file=sys.stderr)
            except KeyboardInterrupt:  # stop this continuation, keep the session: the next RESET aborts GENERATE
                chat.out.write("\n")
    finally:
        transport.port.close()

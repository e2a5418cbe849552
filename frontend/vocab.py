"""Text <-> token ids through a model's vocabulary: single characters, or word pieces.

A vocabulary is the list of strings its ids stand for (`hardwire.vocab` in the ONNX
metadata, vocab.json in a build). Encoding is greedy longest match, WordPiece's rule, so
the vocabulary alone defines the tokenizer: a character vocabulary encodes character by
character, and a learned piece vocabulary (`learn_pieces`, byte-pair merges over words)
encodes each position with the longest piece that starts there.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from itertools import pairwise

_WORDS = re.compile(r" ?[A-Za-z]+| ?[^A-Za-z\s]+|\s+")  # a word keeps the space before it, as in GPT-2


class VocabError(ValueError):
    """Text the vocabulary cannot encode."""


def encode(text: str, vocab: Sequence[str], what: str = "text") -> list[int]:
    """Token ids of text, longest piece first; VocabError naming every character no piece covers."""
    index = {piece: i for i, piece in enumerate(vocab)}
    longest = max(map(len, vocab), default=0)
    missing = sorted({c for c in text if c not in index})
    if missing:
        raise VocabError(f"the {what} has characters outside the model's vocabulary: {missing}")
    ids, at = [], 0
    while at < len(text):
        for size in range(min(longest, len(text) - at), 0, -1):
            i = index.get(text[at : at + size])
            if i is not None:
                ids.append(i)
                at += size
                break
    return ids


def decode(ids: Sequence[int], vocab: Sequence[str]) -> str:
    return "".join(vocab[i] for i in ids)


def learn_pieces(text: str, size: int) -> tuple[str, ...]:
    """At most `size` pieces: the text's characters, then byte-pair merges inside words, most frequent first
    (fewer once every word is a single piece).

    Ties go to the pair seen first in sorted order, so the result depends only on the text.
    """
    chars = sorted(set(text))
    if size < len(chars):
        raise VocabError(f"a vocabulary of {size} cannot hold the text's {len(chars)} distinct characters")
    words = Counter(_WORDS.findall(text))
    split = {word: tuple(word) for word in words}
    pieces = list(chars)
    while len(pieces) < size:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            symbols = split[word]
            for pair in pairwise(symbols):
                pairs[pair] += count
        if not pairs:
            break
        best = min(pairs, key=lambda pair: (-pairs[pair], pair))
        merged = best[0] + best[1]
        pieces.append(merged)
        for word, symbols in split.items():
            if merged in word:
                split[word] = _merge(symbols, best, merged)
    return tuple(pieces)


def _merge(symbols: tuple[str, ...], pair: tuple[str, str], merged: str) -> tuple[str, ...]:
    out, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
            out.append(merged)
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return tuple(out)

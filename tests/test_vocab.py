"""Word-piece and character vocabularies: greedy longest-match encoding, learning, errors."""

from __future__ import annotations

import pytest

from hardwire.frontend.vocab import VocabError, decode, encode, learn_pieces


def test_character_vocabulary_encodes_one_id_per_character():
    vocab = ["\n", " ", "a", "b"]
    assert encode("ab a\n", vocab) == [2, 3, 1, 2, 0]


def test_longest_piece_wins_at_each_position():
    vocab = ["a", "b", "c", "ab", "abc", " ", " ab"]
    assert encode("abcab ab", vocab) == [4, 3, 6]
    assert decode([4, 3, 6], vocab) == "abcab ab"


def test_unknown_characters_are_named():
    with pytest.raises(VocabError, match=r"^the text has characters outside the model's vocabulary: \['!', 'z'\]$"):
        encode("ab!z", ["a", "b"])


def test_learned_pieces_start_with_the_characters_and_round_trip():
    text = "the cat and the hat and the bat\n" * 20
    vocab = learn_pieces(text, 20)
    assert vocab[: len(set(text))] == tuple(sorted(set(text)))
    assert len(vocab) == 20 and len(set(vocab)) == 20
    assert " the" in vocab  # the most frequent word, with its leading space
    ids = encode(text, vocab)
    assert decode(ids, vocab) == text and len(ids) < len(text) / 2
    assert learn_pieces(text, 20) == vocab  # depends only on the text
    assert len(learn_pieces(text, 100)) == 23  # fewer once every word is one piece


def test_a_vocabulary_smaller_than_the_alphabet_is_refused():
    with pytest.raises(VocabError, match=r"^a vocabulary of 3 cannot hold the text's 5 distinct characters$"):
        learn_pieces("abcde", 3)

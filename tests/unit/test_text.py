"""Tokenisation for Chinese and English, and the term cap that keeps every memory indexable."""

from __future__ import annotations

from libs.text import MAX_TERM_CHARS, tokenize


def test_english_words_are_lower_cased_and_chinese_becomes_characters_and_bigrams() -> None:
    assert tokenize("Aisle SEAT 靠窗") == ["aisle", "seat", "靠", "窗", "靠窗"]


def test_a_word_longer_than_the_index_holds_is_capped_not_left_to_fail_the_projection() -> None:
    terms = tokenize("before " + "x" * 15_000 + " after")
    assert terms == ["before", "x" * MAX_TERM_CHARS, "after"]
    assert max(len(t) for t in tokenize("日本" + "y" * 9_000)) == MAX_TERM_CHARS

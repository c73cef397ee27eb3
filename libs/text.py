"""Tokenisation that works for Chinese and English alike.

Latin-script words are lower-cased and kept whole; CJK text has no spaces, so it
becomes single characters plus overlapping bigrams, which is what keyword
matching and BM25 over Chinese need without a dictionary.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["MAX_TERM_CHARS", "is_cjk", "tokenize"]

# The longest term the keyword index holds (a GIN entry must fit in about a third of a page, 2.7 KB,
# and a character takes up to 4 bytes); the write side refuses content with longer words.
MAX_TERM_CHARS = 200

_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def is_cjk(char: str) -> bool:
    code = ord(char)
    return (0x4E00 <= code <= 0x9FFF or 0x3400 <= code <= 0x4DBF or 0x20000 <= code <= 0x2A6DF
            or 0xF900 <= code <= 0xFAFF or 0x3040 <= code <= 0x30FF or 0xAC00 <= code <= 0xD7AF)


def tokenize(text: str, cap: int | None = MAX_TERM_CHARS) -> list[str]:
    """Terms in order of appearance (duplicates kept), each cut to `cap` characters (None: uncut)."""
    terms: list[str] = []
    for word in _WORD.findall(unicodedata.normalize("NFKC", text).lower()):
        run: list[str] = []
        latin: list[str] = []
        for char in word + " ":
            if char != " " and is_cjk(char):
                if latin:
                    terms.append("".join(latin)[:cap])
                    latin = []
                run.append(char)
                continue
            if run:
                terms.extend(run)
                terms.extend(a + b for a, b in zip(run, run[1:], strict=False))
                run = []
            if char != " ":
                latin.append(char)
        if latin:
            # Capped, not dropped: what the write side let through (or older data) always indexes.
            terms.append("".join(latin)[:cap])
    return terms

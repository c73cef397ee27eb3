"""Normalised text: what makes two values 'the same' for duplicates and entity keys (no I/O)."""

from __future__ import annotations

import functools
import unicodedata

__all__ = ["normalized"]


@functools.lru_cache(maxsize=4096)  # a write's content is normalised for its digest, then for its shingles
def normalized(text: str) -> str:
    """Fold width (NFKC: full-width ＡＢＣ１２３ → ABC123), case, punctuation and spacing away.

    Chinese characters are kept as they are; every punctuation character (ASCII and CJK:
    ，。！？、「」), space and control or format character is dropped, so "Tea, please!" ==
    "tea please" and "我喜欢茶。" == "我喜欢茶". Symbols stay: "¥100" is not "$100".
    """
    folded = unicodedata.normalize("NFKC", text).casefold()
    return "".join(ch for ch in folded if unicodedata.category(ch)[0] not in "PZC")

"""Terms and BM25 sparse vectors, for Chinese and English alike. No I/O here.

A document's sparse vector holds, per term, the BM25 term-frequency part with length
normalisation: tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avg_len)). The IDF part is
applied by the vector index at query time over the whole collection (Qdrant's `idf`
modifier), so it stays right as the corpus grows without re-encoding anything.
A query's vector is 1.0 per distinct term. Terms are hashed to 32-bit indices (CRC-32).

Chinese has no spaces: `jieba` (search mode: words and their sub-words) segments it;
`bigram` (single characters + overlapping bigrams, libs/text.py) is the dictionary-free floor.
"""

from __future__ import annotations

import logging
import re
import threading
import unicodedata
import zlib
from collections import Counter
from dataclasses import dataclass
from typing import Literal

from libs.text import is_cjk, tokenize

__all__ = ["Bm25", "Segmenter", "SparseVector", "redact", "terms"]

Segmenter = Literal["jieba", "bigram"]

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
# Very frequent function words: IDF would shrink them anyway, but dropping them keeps
# vectors short and stops a query of only such words matching everything.
_STOP = frozenset(
    "a an the and or but of to in on at for with by from is are was were be been am do does did i you he she"
    " it we they me my your his her its our their this that these those what which who whom how when where"
    " why there here as so if not no yes can could will would shall should may might have has had just than"
    " then also too very about into over does doing done did any some all each".split()
) | frozenset("的 了 是 在 和 与 也 就 都 而 及 或 一个 这 那 吗 呢 吧 啊 呀 着 过 把 被 让 给 我 你 他 她 它 我们 你们 他们"
              " 什么 哪 哪里 哪儿 哪个 谁 如何 怎么 怎样 多少 几 为什么 是否 有没有 时候 哪天".split())
_SENSITIVE = [
    re.compile(r"[\w.+-]+@[\w-]+\.[\w.-]+"),  # e-mail
    re.compile(r"\b(?:sk|pk|ghp|xox[bp])[-_][A-Za-z0-9_-]{12,}"),  # API keys
    re.compile(r"(?<!\d)(?:\d[ -]?){9,}\d?[Xx]?(?!\d)"),  # phone, ID-card and bank-card numbers
]
_jieba_lock = threading.Lock()
_jieba = None


def redact(text: str) -> str:
    """Sensitive values never reach the vector index: neither the embedding nor the hashed terms see them."""
    for pattern in _SENSITIVE:
        text = pattern.sub(" ", text)
    return text


def _stem(word: str) -> str | None:
    """Stop words out, then a light English plural / third-person folding (meetings -> meeting,
    cities -> city, teaches -> teach); a lone Latin letter (the s of "Maya's") is no term."""
    if word in _STOP or (len(word) == 1 and word.isascii() and word.isalpha()):
        return None
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 4 and word.endswith(("ches", "shes", "sses", "xes", "zes")):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def _segmenter():
    global _jieba
    with _jieba_lock:  # the dictionary loads once per process (about a second)
        if _jieba is None:
            import jieba

            jieba.setLogLevel(logging.WARNING)
            jieba.initialize()
            _jieba = jieba
    return _jieba


def terms(text: str, segmenter: Segmenter = "jieba") -> list[str]:
    """Index terms in order (duplicates kept): Latin words lower-cased and lightly stemmed, Chinese segmented."""
    if segmenter == "bigram":
        return [t for t in tokenize(text) if t not in _STOP]
    out: list[str | None] = []
    for word in _WORD.findall(unicodedata.normalize("NFKC", text).lower()):
        if not any(is_cjk(c) for c in word):
            out.append(_stem(word))
            continue
        for piece in _segmenter().lcut_for_search(word, HMM=True):
            if _WORD.fullmatch(piece):
                out.append((None if piece in _STOP else piece) if any(is_cjk(c) for c in piece) else _stem(piece))
    return [t for t in out if t]


def term_id(term: str) -> int:
    return zlib.crc32(term.encode("utf-8"))


@dataclass(frozen=True)
class SparseVector:
    indices: tuple[int, ...]
    values: tuple[float, ...]

    def __bool__(self) -> bool:
        return bool(self.indices)


@dataclass(frozen=True)
class Bm25:
    k1: float = 1.2
    b: float = 0.75
    avg_len: float = 16.0  # terms in a typical memory (a conversational turn), after stop words
    segmenter: Segmenter = "jieba"

    def load(self) -> None:
        """Load the segmenter's dictionary now (jieba: about a second; blocking), at start-up rather than in
        the first batch a projector segments or the first Chinese query."""
        if self.segmenter == "jieba":
            _segmenter()

    def document(self, text: str) -> SparseVector:
        return self.vector(terms(redact(text), self.segmenter))

    def vector(self, found: list[str]) -> SparseVector:
        """The document vector of its terms (as `terms` returns them, duplicates kept)."""
        counts = Counter(term_id(t) for t in found)
        norm = self.k1 * (1 - self.b + self.b * len(found) / self.avg_len)
        items = sorted((i, tf * (self.k1 + 1) / (tf + norm)) for i, tf in counts.items())
        return SparseVector(tuple(i for i, _ in items), tuple(v for _, v in items))

    def query(self, text: str) -> SparseVector:
        ids = sorted({term_id(t) for t in terms(text, self.segmenter)})
        return SparseVector(tuple(ids), tuple(1.0 for _ in ids))

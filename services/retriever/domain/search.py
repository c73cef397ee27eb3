"""Search rules of the read side: query terms, filters, scoring. No I/O here."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

from libs.errors import ValidationFailed
from libs.text import tokenize
from libs.validation import visible

__all__ = ["Document", "Hit", "SearchQuery", "rank"]

MAX_LIMIT = 100
RECENCY_HALF_LIFE_DAYS = 30.0
L2_MEDIUM = 2
LAYERS = range(1, 7)  # mnemesh.v1.MemoryLayer SESSION..PROCEDURAL
CONFIDENCES = range(4)  # mnemesh.v1.Confidence: 0 any, 1 strong .. 3 weak


@dataclass(frozen=True)
class Document:
    memory_id: str
    tenant_id: str
    user_id: str
    session_id: str
    layer: int
    source: int
    confidence: int
    content: str
    terms: tuple[str, ...]
    tags: tuple[str, ...]
    created_at: datetime
    expires_at: datetime | None


@dataclass(frozen=True)
class SearchQuery:
    tenant_id: str
    user_id: str
    text: str
    limit: int = 10
    layers: tuple[int, ...] = ()
    tags: tuple[str, ...] = ()
    since: datetime | None = None
    until: datetime | None = None
    min_confidence: int = 0  # 0: any; else the weakest level accepted (1 strongest ... 3 weakest)
    terms: tuple[str, ...] = field(default=())

    def validated(self) -> SearchQuery:
        if not self.tenant_id:
            raise ValidationFailed("is required", field="tenant.tenant_id")
        if not visible(self.text):
            raise ValidationFailed("must not be empty", field="query", hint="say what to look for")
        for i, layer in enumerate(self.layers):
            if layer not in LAYERS:
                raise ValidationFailed(f"is {layer}, which is not a MemoryLayer", field=f"layers[{i}]",
                                       hint="use MEMORY_LAYER_SESSION (1) to MEMORY_LAYER_PROCEDURAL (6)")
        if self.min_confidence not in CONFIDENCES:
            raise ValidationFailed(f"is {self.min_confidence}, which is not a Confidence", field="min_confidence",
                                   hint="use CONFIDENCE_L1_STRONG (1) to CONFIDENCE_L3_WEAK (3), or leave it unset")
        if not 0 <= self.limit <= MAX_LIMIT:
            raise ValidationFailed(f"must be between 1 and {MAX_LIMIT} (0 means 10)", field="limit")
        terms = tuple(dict.fromkeys(tokenize(self.text)))
        if not terms:
            raise ValidationFailed("has no searchable words", field="query")
        return SearchQuery(**{**self.__dict__, "limit": self.limit or 10, "terms": terms})


@dataclass(frozen=True)
class Hit:
    document: Document
    score: float
    must_confirm: bool
    age_seconds: float


def rank(query: SearchQuery, candidates: list[Document], now: datetime) -> list[Hit]:
    """Keyword overlap, decayed by age and weighted by confidence; expired documents never returned."""
    hits = []
    for doc in candidates:
        if doc.expires_at is not None and doc.expires_at <= now:
            continue
        doc_terms = set(doc.terms)
        overlap = sum(1 for t in query.terms if t in doc_terms) / len(query.terms)
        if overlap == 0:
            continue
        age = max((now - doc.created_at).total_seconds(), 0.0)
        recency = math.exp(-math.log(2) * age / (RECENCY_HALF_LIFE_DAYS * 86400))
        weight = {1: 1.0, 2: 0.8, 3: 0.5}.get(doc.confidence, 0.5)
        score = overlap * (0.7 + 0.3 * recency) * weight
        hits.append(Hit(doc, score, must_confirm=doc.confidence == L2_MEDIUM, age_seconds=age))
    hits.sort(key=lambda h: (-h.score, h.age_seconds))
    return hits[: query.limit]

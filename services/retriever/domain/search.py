"""Search rules of the read side: the query and its validation, fusion, rescoring. No I/O here."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Literal

from libs.errors import ValidationFailed
from libs.validation import visible

__all__ = ["MODES", "Candidate", "Document", "Hit", "SearchQuery", "fuse", "rescore"]

MAX_LIMIT = 100
L2_MEDIUM = 2
LAYERS = range(1, 7)  # mnemesh.v1.MemoryLayer SESSION..PROCEDURAL
CONFIDENCES = range(4)  # mnemesh.v1.Confidence: 0 any, 1 strong .. 3 weak
MODES = ("dense", "sparse", "hybrid", "full")
FUSIONS = ("rrf", "score")
ROUTES = ("semantic", "auto", "structured")
RRF_K = 60.0
Mode = Literal["dense", "sparse", "hybrid", "full"]


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
    key: str = ""
    derived_from: tuple[str, ...] = ()
    engagement: float = 0.0
    archived: bool = False
    step_id: str = ""
    attributes: dict = field(default_factory=dict, compare=False, hash=False)

    def indexed_text(self) -> str:
        """What the embedding and the BM25 terms see: the content, and the entity key when there is one."""
        return f"{self.key.replace('.', ' ').replace('_', ' ')}: {self.content}" if self.key else self.content

    def context(self) -> str:
        """The conversational context (the turn before this one, `attributes.context`), if any: a reply
        such as "Yes, on Tuesday" means little alone."""
        context = self.attributes.get("context") if self.attributes else None
        return context if isinstance(context, str) else ""


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
    session_id: str = ""
    include_archived: bool = False
    mode: str = "full"
    # Convex combination of min-max normalised scores by default (it beat RRF on the shipped dataset, as
    # in Bruch et al., "An Analysis of Fusion Functions for Hybrid Retrieval", 2022); dense, the stronger
    # retriever on paraphrases, weighs 0.7. Both configurable per request.
    fusion: str = "score"
    dense_weight: float = 0.7
    two_stage: bool = False
    candidates: int = 200  # per retriever before fusion (and the candidate stage of two-stage retrieval)
    recency_weight: float = 0.05  # rescoring (mode full) breaks near-ties; it must not bury an old fact
    confidence_weight: float = 0.05
    engagement_weight: float = 0.05
    half_life_days: float = 30.0
    terms: tuple[str, ...] = field(default=())
    route: str = "semantic"  # the memory router: semantic | auto | structured

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
        mode = self.mode or "full"
        if mode not in MODES:
            raise ValidationFailed(f"must be one of {', '.join(MODES)}", field="mode")
        fusion = self.fusion or "score"
        if fusion not in FUSIONS:
            raise ValidationFailed(f"must be one of {', '.join(FUSIONS)}", field="fusion")
        for name in ("recency_weight", "confidence_weight", "engagement_weight", "dense_weight"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValidationFailed("must be between 0 and 1", field=name)
        if self.recency_weight + self.confidence_weight + self.engagement_weight > 1.0:
            raise ValidationFailed("recency, confidence and engagement weights must add up to at most 1",
                                   field="recency_weight")
        if self.half_life_days <= 0:
            raise ValidationFailed("must be positive", field="half_life_days")
        if not 1 <= self.candidates <= 10_000:
            raise ValidationFailed("must be between 1 and 10000", field="candidates")
        if self.until and self.since and self.until <= self.since:
            raise ValidationFailed("must be after since", field="until")
        route = self.route or "semantic"
        if route not in ROUTES:
            raise ValidationFailed(f"must be one of {', '.join(ROUTES)}", field="route",
                                   hint="auto lets the memory router choose the structured path, the semantic one or both")
        return replace(self, limit=self.limit or 10, mode=mode, fusion=fusion, route=route)


@dataclass(frozen=True)
class Candidate:
    """One memory as the index ranked it: its scores per retriever (None: that retriever did not find it)."""

    memory_id: str
    dense: float | None = None
    sparse: float | None = None
    fused: float = 0.0


@dataclass(frozen=True)
class Hit:
    document: Document
    score: float
    must_confirm: bool
    age_seconds: float
    dense: float | None = None
    sparse: float | None = None
    fused: float = 0.0
    recency: float = 0.0
    exact: bool = False  # matched every condition of the structured path


def fuse(dense: list[tuple[str, float]], sparse: list[tuple[str, float]], q: SearchQuery) -> list[Candidate]:
    """Reciprocal rank fusion (k=60), or a weighted sum of min-max normalised scores; best first."""
    dense_of, sparse_of = dict(dense), dict(sparse)
    ids = list(dict.fromkeys([m for m, _ in dense] + [m for m, _ in sparse]))
    if q.fusion == "rrf":
        dense_rank = {m: r for r, (m, _) in enumerate(dense, 1)}
        sparse_rank = {m: r for r, (m, _) in enumerate(sparse, 1)}
        fused = {m: (1 / (RRF_K + dense_rank[m]) if m in dense_rank else 0.0)
                 + (1 / (RRF_K + sparse_rank[m]) if m in sparse_rank else 0.0) for m in ids}
    else:
        def normalised(scores: dict[str, float]) -> dict[str, float]:
            if not scores:
                return {}
            low, high = min(scores.values()), max(scores.values())
            return {m: (s - low) / (high - low) if high > low else 1.0 for m, s in scores.items()}

        nd, ns = normalised(dense_of), normalised(sparse_of)
        w = q.dense_weight if dense and sparse else (1.0 if dense else 0.0)
        fused = {m: w * nd.get(m, 0.0) + (1 - w) * ns.get(m, 0.0) for m in ids}
    out = [Candidate(m, dense_of.get(m), sparse_of.get(m), fused[m]) for m in ids]
    out.sort(key=lambda c: -c.fused)
    return out


def rescore(q: SearchQuery, candidates: list[Candidate], documents: dict[str, Document], now: datetime) -> list[Hit]:
    """Final score: the fused score, scaled by recency (half-life), confidence and engagement when the mode is
    `full`; the documents that no longer pass the filters (expired, archived) are dropped here again."""
    hits = []
    top = max((c.fused for c in candidates), default=0.0) or 1.0
    for c in candidates:
        doc = documents.get(c.memory_id)
        if doc is None or (doc.expires_at is not None and doc.expires_at <= now):
            continue
        if doc.archived and not q.include_archived:
            continue
        age = max((now - doc.created_at).total_seconds(), 0.0)
        recency = math.exp(-math.log(2) * age / (q.half_life_days * 86400))
        score = c.fused / top  # 1.0 for the best candidate, comparable across fusions
        if q.mode == "full":
            confidence = {1: 1.0, 2: 0.6, 3: 0.3}.get(doc.confidence, 0.3)
            engagement = max(0.0, min(doc.engagement, 1.0))
            kept = 1.0 - q.recency_weight - q.confidence_weight - q.engagement_weight
            score *= (kept + q.recency_weight * recency + q.confidence_weight * confidence
                      + q.engagement_weight * engagement)
        hits.append(Hit(doc, score, must_confirm=doc.confidence == L2_MEDIUM, age_seconds=age,
                        dense=c.dense, sparse=c.sparse, fused=c.fused, recency=recency))
    hits.sort(key=lambda h: (-h.score, h.age_seconds))
    return hits[: q.limit]

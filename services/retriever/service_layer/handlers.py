"""Retriever handlers: keep the index in step with memory events, answer searches."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from libs.errors import ValidationFailed
from services.retriever.domain import Bm25, Document, Hit, SearchQuery, fuse, redact, rescore
from services.retriever.domain.sparse import terms
from services.retriever.service_layer.batching import BatchingEmbedder
from services.retriever.service_layer.ports import DocumentStore, VectorIndex

__all__ = ["Retrieval", "forget_documents", "index_document", "search"]

CONTEXT_WEIGHT = 0.3  # the turn before a memory (attributes.context) adds to its vector at this weight
FETCH_FACTOR = 3  # fused candidates read back from PostgreSQL per requested hit (rescoring may reorder them)


@dataclass
class Retrieval:
    """What indexing and search need besides the document store: one per process, shared."""

    index: VectorIndex
    embedder: BatchingEmbedder
    bm25: Bm25 = field(default_factory=Bm25)
    observe: object = None  # metrics (adapters/metrics.py), optional
    accesses: object = None  # AccessBatcher (service_layer/accesses.py), optional

    def _timed(self, stage: str, started: float) -> None:
        if self.observe is not None:
            self.observe.stage(stage, time.perf_counter() - started)


def _normalised(v: list[float]) -> list[float]:
    norm = sum(x * x for x in v) ** 0.5 or 1.0
    return [x / norm for x in v]


def _with_terms(d: Document, bm25: Bm25) -> Document:
    from dataclasses import replace

    return replace(d, terms=tuple(dict.fromkeys(terms(redact(d.indexed_text()), bm25.segmenter))))


async def index_document(document: Document, store: DocumentStore, r: Retrieval) -> bool:
    """Embed and encode `document`, then upsert it in PostgreSQL and, under the same lock, in the vector
    index. A forgotten memory is indexed nowhere. True when indexed."""
    text = redact(document.indexed_text())
    started = time.perf_counter()
    context = document.context()
    if context:  # the turn's own meaning first, its context as a lighter second component
        own, around = await r.embedder.embed([text, redact(context)])
        dense = _normalised([a + CONTEXT_WEIGHT * b for a, b in zip(own, around, strict=True)])
    else:
        (dense,) = await r.embedder.embed([text])
    r._timed("embed_document", started)
    sparse = r.bm25.document(text)
    document = _with_terms(document, r.bm25)

    async def upsert_vectors() -> None:
        await asyncio.to_thread(r.index.upsert, [(document, dense, sparse)])

    return await store.upsert(document, then=upsert_vectors)


async def forget_documents(tenant_id: str, memory_ids: list[str], store: DocumentStore, index: VectorIndex) -> int:
    """Tombstone and delete in the store, then purge the index under the same locks; a failure of either
    undoes both (the event is retried)."""
    async def purge() -> None:
        await asyncio.to_thread(index.delete, tenant_id, memory_ids)  # a blocking client: off the event loop

    return await store.delete(tenant_id, memory_ids, then=purge)


async def search(query: SearchQuery, store: DocumentStore, r: Retrieval, now: datetime | None = None,
                 dense: list[float] | None = None) -> list[Hit]:
    """Filters and hybrid retrieval in the index, fusion, then rescoring over the authoritative documents.
    `dense`: a query vector computed already (benchmarks measure search without the embedding)."""
    from services.retriever.adapters.vectors import IndexQuery  # the query shape both engines take

    q = query.validated()
    now = now or datetime.now(UTC)
    wants_dense, wants_sparse = q.mode != "sparse", q.mode != "dense" or q.two_stage
    sparse = r.bm25.query(q.text) if wants_sparse else None
    if q.mode == "sparse" and not sparse:
        raise ValidationFailed("has no searchable words", field="query", hint="use mode dense or hybrid")
    if wants_dense and dense is None:
        started = time.perf_counter()
        (dense,) = await r.embedder.embed([q.text])
        r._timed("embed_query", started)
    started = time.perf_counter()
    dense_hits, sparse_hits = await asyncio.to_thread(r.index.query, IndexQuery(
        q, dense if wants_dense else None, sparse, now, q.candidates, two_stage=q.two_stage and wants_dense))
    r._timed("index", started)
    if q.mode == "dense":
        sparse_hits = []
    elif q.mode == "sparse":
        dense_hits = []
    candidates = fuse(dense_hits, sparse_hits, q)[: max(q.limit * FETCH_FACTOR, 30)]
    started = time.perf_counter()
    documents = await store.fetch(q.tenant_id, [c.memory_id for c in candidates])
    hits = rescore(q, candidates, documents, now)
    r._timed("fetch_rescore", started)
    if r.observe is not None:
        r.observe.returned(hits)
    if r.accesses is not None:
        r.accesses.record(q.tenant_id, hits)
    return hits

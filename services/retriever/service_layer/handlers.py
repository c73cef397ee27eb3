"""Retriever handlers: keep the index in step with memory events, answer searches."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from libs.errors import ValidationFailed
from libs.transient import is_transient
from services.retriever.domain import Bm25, Document, Hit, SearchQuery, SparseVector, fuse, redact, rescore
from services.retriever.domain.sparse import terms
from services.retriever.service_layer.batching import BatchingEmbedder
from services.retriever.service_layer.ports import DocumentStore, VectorIndex

__all__ = ["PROJECTION_BATCH", "Retrieval", "archive_documents", "confirm_document", "encode", "forget_documents",
           "index_document", "merge_into_document", "project_pending", "record_document", "record_documents", "search"]

log = logging.getLogger("mnemesh.retriever")

CONTEXT_WEIGHT = 0.3  # the turn before a memory (attributes.context) adds to its vector at this weight
FETCH_FACTOR = 3  # fused candidates rescored per requested hit (rescoring may reorder them)
PROJECTION_BATCH = 128  # documents embedded and upserted together by the projector


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


def _segment(texts: list[str], segmenter) -> list[list[str]]:
    return [terms(text, segmenter) for text in texts]


def _normalised(v: list[float]) -> list[float]:
    norm = sum(x * x for x in v) ** 0.5 or 1.0
    return [x / norm for x in v]


async def encode(documents: list[Document], r: Retrieval) -> list[tuple[Document, list[float], SparseVector]]:
    """Dense and sparse vectors of a batch: one call to the embedder for every text of the batch (the
    turn's own meaning first, its context, if any, as a lighter second component)."""
    if not documents:
        return []
    texts = [redact(d.indexed_text()) for d in documents]
    contexts = [redact(c) if (c := d.context()) else "" for d in documents]
    started = time.perf_counter()
    embedding = asyncio.ensure_future(r.embedder.embed(texts + [c for c in contexts if c]))
    await asyncio.sleep(0)  # the texts join the model's queue on this turn...
    # ...and are segmented meanwhile, once per text (the document's terms and its BM25 vector), off the
    # event loop: a batch's segmentation would otherwise hold up every other coroutine (the other
    # projector's commit, searches) for tens of milliseconds
    try:
        found = await asyncio.to_thread(_segment, texts, r.bm25.segmenter)
    except BaseException:
        embedding.cancel()
        raise
    vectors = iter(await embedding)
    own = [next(vectors) for _ in texts]
    out = []
    for d, context, dense, words in zip(documents, contexts, own, found, strict=True):
        if context:
            around = next(vectors)
            dense = _normalised([a + CONTEXT_WEIGHT * b for a, b in zip(dense, around, strict=True)])
        out.append((replace(d, terms=tuple(dict.fromkeys(words))), dense, r.bm25.vector(words)))
    r._timed("embed_document", started)
    return out


async def index_document(document: Document, store: DocumentStore, r: Retrieval, version: int = 0) -> bool:
    """Embed and encode `document`, then upsert it in PostgreSQL and, under the same lock, in the vector
    index, at once (tests, the evaluation harness). A forgotten memory is indexed nowhere. True when indexed."""
    ((document, dense, sparse),) = await encode([document], r)

    async def upsert_vectors() -> None:
        await asyncio.to_thread(r.index.upsert, [(document, dense, sparse)])

    return await store.upsert(document, then=upsert_vectors, version=version)


async def record_document(document: Document, store: DocumentStore, r: Retrieval, version: int = 0) -> bool:
    """The event's part of indexing (a memory.written): record the document for the projector, unless its
    memory was forgotten or a newer version is recorded. True when recorded. Nothing is segmented or
    embedded here: the projector does both, once, in batches."""
    return await store.record(document, version)


async def record_documents(items: list[tuple[Document, int]], store: DocumentStore) -> None:
    """Many memory.written of one tenant at once (a batch read from the stream): one statement round for
    all, with the same rules as record_document for each (tombstones, versions)."""
    if items:
        await store.record_many(items)


async def project_pending(store: DocumentStore, r: Retrieval, limit: int = PROJECTION_BATCH) -> int:
    """Write the vectors of up to `limit` recorded documents: one embedding call and one index upsert for
    the batch, under the memories' locks (a forget waits for it, or it skips the forgotten). How many."""
    async with store.pending(limit) as documents:
        if not documents:
            return 0
        try:
            encoded = await encode(documents, r)
            started = time.perf_counter()
            await asyncio.to_thread(r.index.upsert, encoded)
            r._timed("index_upsert", started)
        except Exception as exc:  # classified: only a lone document's permanent failure is kept
            if is_transient(exc) or len(documents) > 1:
                raise  # nothing is marked; the projector retries (one by one after a permanent failure)
            # One document that can never be embedded or indexed must not hold up every one behind it.
            log.exception("memory left out of the vector index: it cannot be projected (a rebuild retries it)",
                          extra={"memory_id": documents[0].memory_id})
        return len(documents)


async def forget_documents(tenant_id: str, memory_ids: list[str], store: DocumentStore, index: VectorIndex,
                           *, tombstone: bool = True) -> int:
    """Tombstone and delete in the store, then purge the index under the same locks; a failure of either
    undoes both (the event is retried). Without `tombstone` (a quarantine) the memory may come back with a
    later memory.written (after its release)."""
    async def purge() -> None:
        await asyncio.to_thread(index.delete, tenant_id, memory_ids)  # a blocking client: off the event loop

    return await store.delete(tenant_id, memory_ids, then=purge, tombstone=tombstone)


def _payloads(tenant_id: str, index: VectorIndex | None):
    """What amends the index: the changed documents' payloads rewritten in place (no re-embedding)."""
    if index is None:
        return None

    async def write(documents: list[Document]) -> None:
        await asyncio.to_thread(index.set_payloads, tenant_id, documents)  # a blocking client: off the loop

    return write


async def archive_documents(tenant_id: str, memory_ids: list[str], store: DocumentStore,
                            index: VectorIndex | None = None) -> int:
    """Out of default search, kept for include_archived (archived, superseded): the projection's flag and the
    index payload's, rewritten in place (without `index`: by the projector). How many changed."""
    return await store.amend(tenant_id, memory_ids, lambda d: replace(d, archived=True),
                             then=_payloads(tenant_id, index))


async def confirm_document(tenant_id: str, memory_id: str, confidence: int, expires_at: datetime | None,
                           store: DocumentStore, supersedes: str = "", index: VectorIndex | None = None) -> int:
    """A confirmed memory: its new confidence (must_confirm follows from it) and expiry, and current again
    (a confirmed candidate); the value it supersedes leaves default search."""
    changed = await store.amend(tenant_id, [memory_id], lambda d: replace(
        d, confidence=confidence, expires_at=expires_at, archived=False), then=_payloads(tenant_id, index))
    if supersedes and supersedes != memory_id:
        changed += await archive_documents(tenant_id, [supersedes], store, index)
    return changed


async def merge_into_document(tenant_id: str, memory_id: str, engagement: float, tags: list[str],
                              derived_from: list[str], store: DocumentStore, index: VectorIndex | None = None) -> int:
    """An identical write merged into a memory: its engagement (rescoring weighs it) and the merged write's
    tags and provenance, as the writer keeps them."""
    return await store.amend(tenant_id, [memory_id], lambda d: replace(
        d, engagement=engagement, tags=tuple(dict.fromkeys((*d.tags, *tags))),
        derived_from=tuple(dict.fromkeys((*d.derived_from, *derived_from)))), then=_payloads(tenant_id, index))


async def search(query: SearchQuery, store: DocumentStore, r: Retrieval, now: datetime | None = None,
                 dense: list[float] | None = None) -> list[Hit]:
    """Filters and hybrid retrieval in the index, fusion, then rescoring over the authoritative documents.
    `dense`: a query vector computed already (benchmarks measure search without the embedding)."""
    from services.retriever.adapters.vectors import IndexQuery, document_of  # the shapes both engines take

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
    index_query = IndexQuery(q, dense if wants_dense else None, sparse, now, q.candidates,
                             two_stage=q.two_stage and wants_dense)
    # One hop off the event loop: the engine query, fusion and the candidates' payloads.
    candidates, payloads = await asyncio.to_thread(_query_and_fuse, r.index, index_query, q)
    r._timed("index", started)
    started = time.perf_counter()
    documents = {m: d for m, p in payloads.items() if (d := document_of(p)) is not None}
    missing = [c.memory_id for c in candidates if c.memory_id not in documents]
    if missing:  # a payload that could not carry the hit (sensitive content), or written by an older version
        documents.update(await store.fetch(q.tenant_id, missing))
    hits = rescore(q, candidates, documents, now)
    r._timed("fetch_rescore", started)
    if r.observe is not None:
        r.observe.returned(hits)
    if r.accesses is not None:
        r.accesses.record(q.tenant_id, hits)
    return hits


def _query_and_fuse(index: VectorIndex, iq, q: SearchQuery):
    """Blocking: the engine query, fusion, then the payloads of the candidates that may be returned."""
    dense_hits, sparse_hits = index.query(iq)
    if q.mode == "dense":
        sparse_hits = []
    elif q.mode == "sparse":
        dense_hits = []
    candidates = fuse(dense_hits, sparse_hits, q)[: max(q.limit * FETCH_FACTOR, 30)]
    return candidates, index.retrieve(q.tenant_id, [c.memory_id for c in candidates])

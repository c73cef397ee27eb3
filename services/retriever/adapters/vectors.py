"""The vector index: the Qdrant engine in process (qdrant-edge) or a Qdrant server (qdrant-client).

One collection of memories: a dense vector (the embedder's size) and a BM25 sparse vector with
Qdrant's IDF modifier (see domain/sparse.py). The payload holds the fields the filters need and
what a hit reports, so a search need not read its hits back from PostgreSQL; content, key and
attributes only when they hold nothing sensitive (`complete`: false otherwise, and the hit is read
back). Tenant isolation is a filter on every operation. Every method blocks: callers run them off
the event loop.
"""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from services.retriever.domain import Document, SearchQuery, SparseVector, redact

__all__ = ["COLLECTION", "DENSE_SIZE", "EdgeVectorIndex", "IndexQuery", "ServerVectorIndex", "document_of",
           "open_vector_index", "payload_of"]

# qdrant-client's local mode (":memory:", tests and development) is not thread-safe: a query running while
# another thread upserts reads arrays of different sizes. Its calls take this lock; a server needs none.
LOCAL_MODE_LOCK = threading.RLock()


def client_guard(url: str):
    return LOCAL_MODE_LOCK if url == ":memory:" else contextlib.nullcontext()


DENSE_SIZE = 512  # the default embedder's (use-multilingual); the index takes the embedder's size
COLLECTION = "memories"


def _clean(text: str) -> bool:
    return redact(text) == text


def payload_of(d: Document) -> dict:
    payload = {"tenant_id": d.tenant_id, "memory_id": d.memory_id, "user_id": d.user_id, "session_id": d.session_id,
               "layer": d.layer, "confidence": d.confidence, "tags": list(d.tags),
               "archived": int(d.archived),  # 0/1: qdrant-edge 0.9 matches no boolean payload with MatchValue(True)
               "created_at": d.created_at.timestamp(),
               "expires_at": d.expires_at.timestamp() if d.expires_at else None,
               "source": d.source, "derived_from": list(d.derived_from), "engagement": d.engagement,
               "step_id": d.step_id}
    if _clean(d.content) and _clean(d.key) and _clean(json.dumps(d.attributes, ensure_ascii=False)):
        payload.update(content=d.content, key=d.key, attributes=d.attributes, complete=True)
    else:  # a sensitive value stays in PostgreSQL only: the hit is read back from there
        payload["complete"] = False
    return payload


def document_of(payload: dict) -> Document | None:
    """The document a complete payload carries (None: read it back from PostgreSQL)."""
    if not payload.get("complete"):
        return None
    expires = payload.get("expires_at")
    return Document(
        memory_id=payload["memory_id"], tenant_id=payload["tenant_id"], user_id=payload["user_id"],
        session_id=payload["session_id"], layer=payload["layer"], source=payload["source"],
        confidence=payload["confidence"], content=payload["content"], terms=(), tags=tuple(payload["tags"]),
        created_at=datetime.fromtimestamp(payload["created_at"], UTC),
        expires_at=datetime.fromtimestamp(expires, UTC) if expires is not None else None, key=payload["key"],
        derived_from=tuple(payload["derived_from"]), engagement=payload["engagement"],
        archived=bool(payload["archived"]), step_id=payload["step_id"], attributes=payload["attributes"] or {})


@dataclass(frozen=True)
class IndexQuery:
    """What one search asks the index: the filters, a dense and/or a sparse query vector."""

    query: SearchQuery
    dense: list[float] | None
    sparse: SparseVector | None
    now: datetime
    limit: int
    two_stage: bool = False  # sparse candidates, then dense re-ranking of those only


class EdgeVectorIndex:
    """One on-disk shard owned by this process (its WAL lock refuses a second opener)."""

    def __init__(self, path: Path, *, dim: int = DENSE_SIZE, hnsw_m: int = 16, hnsw_ef_construct: int = 100) -> None:
        import qdrant_edge as qe

        self._qe, self.dirty = qe, False
        config = qe.EdgeConfig(
            vectors={"dense": qe.EdgeVectorParams(size=dim, distance=qe.Distance.Cosine)},
            sparse_vectors={"sparse": qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
            hnsw_config=qe.HnswIndexConfig(m=hnsw_m, ef_construct=hnsw_ef_construct, full_scan_threshold=10_000),
        )
        if (path / "edge_config.json").exists():
            self.shard = qe.EdgeShard.load(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.shard = qe.EdgeShard.create(str(path), config)
            self.shard.update(qe.UpdateOperation.create_field_index(
                "tenant_id", qe.KeywordIndexParams(is_tenant=True)))
            for key in ("user_id", "session_id", "tags"):
                self.shard.update(qe.UpdateOperation.create_field_index(key, qe.KeywordIndexParams()))
            for key in ("created_at", "expires_at"):
                self.shard.update(qe.UpdateOperation.create_field_index(key, qe.FloatIndexParams()))
            for key in ("layer", "confidence", "archived"):  # without an index each filter reads every payload
                self.shard.update(qe.UpdateOperation.create_field_index(key, qe.IntegerIndexParams()))

    def _filter(self, tenant_id: str, q: SearchQuery | None = None, now: datetime | None = None):
        qe = self._qe
        must = [qe.FieldCondition(key="tenant_id", match=qe.MatchValue(tenant_id))]
        must_not = []
        if q is not None:
            if q.user_id:
                must.append(qe.FieldCondition(key="user_id", match=qe.MatchValue(q.user_id)))
            if q.session_id:
                must.append(qe.FieldCondition(key="session_id", match=qe.MatchValue(q.session_id)))
            if q.layers:
                must.append(qe.FieldCondition(key="layer", match=qe.MatchAny(list(q.layers))))
            for tag in q.tags:
                must.append(qe.FieldCondition(key="tags", match=qe.MatchValue(tag)))
            if q.since or q.until:
                must.append(qe.FieldCondition(key="created_at", range=qe.RangeFloat(
                    gte=q.since.timestamp() if q.since else None, lt=q.until.timestamp() if q.until else None)))
            if q.min_confidence:
                must.append(qe.FieldCondition(key="confidence", match=qe.MatchAny(list(range(1, q.min_confidence + 1)))))
            if not q.include_archived:
                must_not.append(qe.FieldCondition(key="archived", match=qe.MatchValue(1)))
        if now is not None:
            must_not.append(qe.FieldCondition(key="expires_at", range=qe.RangeFloat(lte=now.timestamp())))
        return qe.Filter(must=must, must_not=must_not or None)

    def upsert(self, documents: list[tuple[Document, list[float], SparseVector]]) -> None:
        qe = self._qe
        points = []
        for d, dense, sparse in documents:
            vector = {"dense": dense}
            if sparse:
                vector["sparse"] = qe.SparseVector(list(sparse.indices), list(sparse.values))
            points.append(qe.Point(id=uuid.UUID(d.memory_id), vector=vector, payload=payload_of(d)))
        if points:
            self.shard.update(qe.UpdateOperation.upsert_points(points))
            self.dirty = True

    def set_payloads(self, tenant_id: str, documents: list[Document]) -> None:
        """Rewrite the payload of these points (archived, confidence, expiry, engagement, tags...) without
        touching their vectors; a point not in the index (not projected yet) is left alone."""
        qe = self._qe
        for d in documents:
            self.shard.update(qe.UpdateOperation.set_payload_by_filter(qe.Filter(must=[
                qe.FieldCondition(key="tenant_id", match=qe.MatchValue(tenant_id)),
                qe.HasIdCondition(point_ids={uuid.UUID(d.memory_id)})]), payload_of(d)))
        self.dirty = self.dirty or bool(documents)

    def query(self, iq: IndexQuery) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
        """(dense hits, sparse hits), each best first, as (memory_id, score)."""
        qe = self._qe
        flt = self._filter(iq.query.tenant_id, iq.query, iq.now)
        sparse_hits: list[tuple[str, float]] = []
        dense_hits: list[tuple[str, float]] = []
        if iq.sparse:
            vec = qe.SparseVector(list(iq.sparse.indices), list(iq.sparse.values))
            hits = self.shard.query(qe.QueryRequest(query=qe.Query.Nearest(vec, using="sparse"), filter=flt,
                                                    limit=iq.limit, with_payload=["memory_id"]))
            sparse_hits = [(h.payload["memory_id"], h.score) for h in hits]
        if iq.dense is not None:
            if iq.two_stage:
                if not sparse_hits:
                    return [], []
                flt = qe.Filter(must=[flt, qe.HasIdCondition(point_ids={uuid.UUID(m) for m, _ in sparse_hits})])
            hits = self.shard.query(qe.QueryRequest(query=qe.Query.Nearest(iq.dense, using="dense"), filter=flt,
                                                    limit=iq.limit, with_payload=["memory_id"]))
            dense_hits = [(h.payload["memory_id"], h.score) for h in hits]
        return dense_hits, sparse_hits

    def retrieve(self, tenant_id: str, memory_ids: list[str]) -> dict[str, dict]:
        """The payloads of these points that belong to `tenant_id`."""
        if not memory_ids:
            return {}
        records = self.shard.retrieve([uuid.UUID(m) for m in memory_ids], with_payload=True, with_vector=False)
        return {r.payload["memory_id"]: r.payload for r in records if r.payload.get("tenant_id") == tenant_id}

    def delete(self, tenant_id: str, memory_ids: list[str]) -> None:
        qe = self._qe
        self.shard.update(qe.UpdateOperation.delete_points_by_filter(qe.Filter(must=[
            qe.FieldCondition(key="tenant_id", match=qe.MatchValue(tenant_id)),
            qe.HasIdCondition(point_ids={uuid.UUID(m) for m in memory_ids}),
        ])))
        self.dirty = True

    def optimize(self) -> bool:
        """Build the HNSW and payload indexes of the segments written since the last call. The engine in
        process runs no background optimizer: without this, queries scan the appendable segment."""
        self.dirty = False
        return self.shard.optimize()

    def count(self, tenant_id: str | None = None) -> int:
        qe = self._qe
        return self.shard.count(qe.CountRequest(exact=True, filter=self._filter(tenant_id) if tenant_id else None))

    def close(self) -> None:
        self.shard.flush()
        self.shard.close()


class ServerVectorIndex:
    """A collection on a Qdrant server, through qdrant-client (":memory:" is its local mode, for tests)."""

    def __init__(self, url: str, *, dim: int = DENSE_SIZE, hnsw_m: int = 16, hnsw_ef_construct: int = 100,
                 collection: str = COLLECTION, client=None) -> None:
        """`client`: share one (qdrant-client's local mode keeps a separate store per client)."""
        from qdrant_client import QdrantClient, models

        self._m, self.collection, self.url = models, collection, url
        self.owns_client, self._guard = client is None, client_guard(url)
        if client is None:
            client = QdrantClient(location=url) if url == ":memory:" else QdrantClient(url=url)
        self.client = client
        if not self.client.collection_exists(collection):
            self.client.create_collection(
                collection,
                vectors_config={"dense": models.VectorParams(size=dim, distance=models.Distance.COSINE)},
                sparse_vectors_config={"sparse": models.SparseVectorParams(modifier=models.Modifier.IDF)},
                hnsw_config=models.HnswConfigDiff(m=hnsw_m, ef_construct=hnsw_ef_construct, payload_m=hnsw_m),
            )
            if url != ":memory:":  # local mode has no payload indexes (and warns about them)
                self.client.create_payload_index(collection, "tenant_id", models.KeywordIndexParams(
                    type=models.KeywordIndexType.KEYWORD, is_tenant=True))
                for key in ("user_id", "session_id", "tags"):
                    self.client.create_payload_index(collection, key, models.PayloadSchemaType.KEYWORD)
                for key in ("created_at", "expires_at"):
                    self.client.create_payload_index(collection, key, models.PayloadSchemaType.FLOAT)
                for key in ("layer", "confidence", "archived"):
                    self.client.create_payload_index(collection, key, models.PayloadSchemaType.INTEGER)

    def _filter(self, tenant_id: str | None, q: SearchQuery | None = None, now: datetime | None = None,
                memory_ids: list[str] | None = None):
        m = self._m
        must: list = [m.FieldCondition(key="tenant_id", match=m.MatchValue(value=tenant_id))] if tenant_id else []
        must_not: list = []
        if memory_ids:
            must.append(m.HasIdCondition(has_id=memory_ids))
        if q is not None:
            if q.user_id:
                must.append(m.FieldCondition(key="user_id", match=m.MatchValue(value=q.user_id)))
            if q.session_id:
                must.append(m.FieldCondition(key="session_id", match=m.MatchValue(value=q.session_id)))
            if q.layers:
                must.append(m.FieldCondition(key="layer", match=m.MatchAny(any=list(q.layers))))
            for tag in q.tags:
                must.append(m.FieldCondition(key="tags", match=m.MatchValue(value=tag)))
            if q.since or q.until:
                must.append(m.FieldCondition(key="created_at", range=m.Range(
                    gte=q.since.timestamp() if q.since else None, lt=q.until.timestamp() if q.until else None)))
            if q.min_confidence:
                must.append(m.FieldCondition(key="confidence", match=m.MatchAny(any=list(range(1, q.min_confidence + 1)))))
            if not q.include_archived:
                must_not.append(m.FieldCondition(key="archived", match=m.MatchValue(value=1)))
        if now is not None:
            must_not.append(m.FieldCondition(key="expires_at", range=m.Range(lte=now.timestamp())))
        return m.Filter(must=must, must_not=must_not or None)

    def upsert(self, documents: list[tuple[Document, list[float], SparseVector]]) -> None:
        m = self._m
        points = []
        for d, dense, sparse in documents:
            vector: dict = {"dense": dense}
            if sparse:
                vector["sparse"] = m.SparseVector(indices=list(sparse.indices), values=list(sparse.values))
            points.append(m.PointStruct(id=d.memory_id, vector=vector, payload=payload_of(d)))
        if points:
            with self._guard:
                self.client.upsert(self.collection, points=points)

    def set_payloads(self, tenant_id: str, documents: list[Document]) -> None:
        """As EdgeVectorIndex.set_payloads: one request for the batch."""
        m = self._m
        if documents:
            with self._guard:
                self.client.batch_update_points(self.collection, [m.SetPayloadOperation(set_payload=m.SetPayload(
                    payload=payload_of(d), filter=self._filter(tenant_id, memory_ids=[d.memory_id])))
                    for d in documents])

    def query(self, iq: IndexQuery) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
        with self._guard:
            return self._query(iq)

    def _query(self, iq: IndexQuery) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
        m = self._m
        flt = self._filter(iq.query.tenant_id, iq.query, iq.now)
        sparse_hits: list[tuple[str, float]] = []
        dense_hits: list[tuple[str, float]] = []
        if iq.sparse:
            vec = m.SparseVector(indices=list(iq.sparse.indices), values=list(iq.sparse.values))
            hits = self.client.query_points(self.collection, query=vec, using="sparse", query_filter=flt,
                                            limit=iq.limit, with_payload=["memory_id"]).points
            sparse_hits = [(h.payload["memory_id"], h.score) for h in hits]
        if iq.dense is not None:
            if iq.two_stage:
                if not sparse_hits:
                    return [], []
                flt = self._filter(iq.query.tenant_id, iq.query, iq.now, [mid for mid, _ in sparse_hits])
            hits = self.client.query_points(self.collection, query=iq.dense, using="dense", query_filter=flt,
                                            limit=iq.limit, with_payload=["memory_id"]).points
            dense_hits = [(h.payload["memory_id"], h.score) for h in hits]
        return dense_hits, sparse_hits

    def retrieve(self, tenant_id: str, memory_ids: list[str]) -> dict[str, dict]:
        if not memory_ids:
            return {}
        with self._guard:
            records = self.client.retrieve(self.collection, ids=memory_ids, with_payload=True, with_vectors=False)
        return {r.payload["memory_id"]: r.payload for r in records if r.payload.get("tenant_id") == tenant_id}

    def delete(self, tenant_id: str, memory_ids: list[str]) -> None:
        with self._guard:
            self.client.delete(self.collection, points_selector=self._m.FilterSelector(
                filter=self._filter(tenant_id, memory_ids=memory_ids)))

    def optimize(self) -> bool:
        return False  # a Qdrant server optimizes its segments itself

    def count(self, tenant_id: str | None = None) -> int:
        with self._guard:
            return self.client.count(self.collection, count_filter=self._filter(tenant_id), exact=True).count

    def close(self) -> None:
        if self.owns_client:
            self.client.close()


def open_vector_index(qdrant_url: str | None, data_dir: Path, *, dim: int = DENSE_SIZE, hnsw_m: int = 16,
                      hnsw_ef_construct: int = 100):
    """The current generation of the index (see generations.py), behind a switch a rebuild can swap."""
    from services.retriever.adapters.generations import EdgeGenerations, ServerGenerations, SwitchableIndex

    hnsw = {"dim": dim, "hnsw_m": hnsw_m, "hnsw_ef_construct": hnsw_ef_construct}
    generations = (ServerGenerations(qdrant_url, **hnsw) if qdrant_url
                   else EdgeGenerations(data_dir / "qdrant", **hnsw))
    return SwitchableIndex(generations)

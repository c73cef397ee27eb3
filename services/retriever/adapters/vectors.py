"""The vector index: the Qdrant engine in process (qdrant-edge) or a Qdrant server (qdrant-client).

One collection of memories: a dense vector (the embedder's size) and a BM25 sparse vector with
Qdrant's IDF modifier (see domain/sparse.py). The payload holds the fields the filters need and
what a hit reports, so a search need not read its hits back from PostgreSQL; content, key and
attributes only when they hold nothing sensitive (`complete`: false otherwise, and the hit is read
back). Tenant isolation is a filter on every operation. Every method blocks: callers run them off
the event loop.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from pathlib import Path

from services.retriever.adapters.payloads import COLLECTION, DENSE_SIZE, IndexQuery, document_of, payload_of
from services.retriever.adapters.qdrant_server import ServerVectorIndex, client_guard
from services.retriever.domain import Document, SearchQuery, SparseVector

__all__ = ["COLLECTION", "DENSE_SIZE", "EdgeVectorIndex", "IndexQuery", "ServerVectorIndex", "document_of",
           "client_guard", "open_vector_index", "payload_of"]


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



def open_vector_index(qdrant_url: str | None, data_dir: Path, *, dim: int = DENSE_SIZE, hnsw_m: int = 16,
                      hnsw_ef_construct: int = 100):
    """The current generation of the index (see generations.py), behind a switch a rebuild can swap."""
    from services.retriever.adapters.generations import EdgeGenerations, ServerGenerations, SwitchableIndex

    hnsw = {"dim": dim, "hnsw_m": hnsw_m, "hnsw_ef_construct": hnsw_ef_construct}
    generations = (ServerGenerations(qdrant_url, **hnsw) if qdrant_url
                   else EdgeGenerations(data_dir / "qdrant", **hnsw))
    return SwitchableIndex(generations)

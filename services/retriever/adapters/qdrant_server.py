"""The vector index on a Qdrant server, through qdrant-client (compose, Kubernetes; ":memory:" is qdrant-client's
local mode, which stands in for a server in tests). Same contract as EdgeVectorIndex (vectors.py)."""

from __future__ import annotations

import contextlib
import threading
from datetime import datetime

from services.retriever.adapters.payloads import COLLECTION, DENSE_SIZE, IndexQuery, payload_of
from services.retriever.domain import Document, SearchQuery, SparseVector

__all__ = ["LOCAL_MODE_LOCK", "ServerVectorIndex", "client_guard"]

# qdrant-client's local mode (":memory:", tests and development) is not thread-safe: a query running while
# another thread upserts reads arrays of different sizes. Its calls take this lock; a server needs none.
LOCAL_MODE_LOCK = threading.RLock()


def client_guard(url: str):
    return LOCAL_MODE_LOCK if url == ":memory:" else contextlib.nullcontext()


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

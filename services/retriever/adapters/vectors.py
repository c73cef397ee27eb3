"""The vector index: the Qdrant engine in process (qdrant-edge) or a Qdrant server (QDRANT_URL).

Both hold one collection of memories with a 384-dimension dense vector (the local
MiniLM model) and a sparse vector; tenant isolation is a payload filter on every
operation. The retriever opens it at start and keeps it in step with forgetting;
filling it on writes and querying it in Search come with the embedding model.
"""

from __future__ import annotations

import uuid
from pathlib import Path

__all__ = ["DENSE_SIZE", "EdgeVectorIndex", "ServerVectorIndex", "open_vector_index"]

DENSE_SIZE = 384
COLLECTION = "memories"


class EdgeVectorIndex:
    """One on-disk shard owned by this process (its WAL lock refuses a second opener)."""

    def __init__(self, path: Path, *, hnsw_m: int = 16, hnsw_ef_construct: int = 100) -> None:
        import qdrant_edge as qe

        self._qe = qe
        config = qe.EdgeConfig(
            vectors={"dense": qe.EdgeVectorParams(size=DENSE_SIZE, distance=qe.Distance.Cosine)},
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

    def _tenant(self, tenant_id: str):
        qe = self._qe
        return qe.Filter(must=[qe.FieldCondition(key="tenant_id", match=qe.MatchValue(tenant_id))])

    def upsert(self, tenant_id: str, memory_id: str, dense: list[float], payload: dict | None = None) -> None:
        qe = self._qe
        self.shard.update(qe.UpdateOperation.upsert_points([qe.Point(
            id=uuid.UUID(memory_id), vector={"dense": dense},
            payload={**(payload or {}), "tenant_id": tenant_id, "memory_id": memory_id})]))

    def search(self, tenant_id: str, dense: list[float], limit: int) -> list[tuple[str, float]]:
        qe = self._qe
        hits = self.shard.query(qe.QueryRequest(query=qe.Query.Nearest(dense, using="dense"),
                                                filter=self._tenant(tenant_id), limit=limit, with_payload=True))
        return [(h.payload["memory_id"], h.score) for h in hits]

    def delete(self, tenant_id: str, memory_ids: list[str]) -> None:
        qe = self._qe
        self.shard.update(qe.UpdateOperation.delete_points_by_filter(qe.Filter(must=[
            qe.FieldCondition(key="tenant_id", match=qe.MatchValue(tenant_id)),
            qe.HasIdCondition(point_ids={uuid.UUID(m) for m in memory_ids}),
        ])))

    def count(self, tenant_id: str | None = None) -> int:
        qe = self._qe
        return self.shard.count(qe.CountRequest(exact=True, filter=self._tenant(tenant_id) if tenant_id else None))

    def close(self) -> None:
        self.shard.flush()
        self.shard.close()


class ServerVectorIndex:
    """A collection on a Qdrant server, through qdrant-client."""

    def __init__(self, url: str, *, hnsw_m: int = 16, hnsw_ef_construct: int = 100) -> None:
        from qdrant_client import QdrantClient, models

        self._m = models
        self.client = QdrantClient(location=url) if url == ":memory:" else QdrantClient(url=url)
        if not self.client.collection_exists(COLLECTION):
            self.client.create_collection(
                COLLECTION,
                vectors_config={"dense": models.VectorParams(size=DENSE_SIZE, distance=models.Distance.COSINE)},
                sparse_vectors_config={"sparse": models.SparseVectorParams(modifier=models.Modifier.IDF)},
                hnsw_config=models.HnswConfigDiff(m=hnsw_m, ef_construct=hnsw_ef_construct),
            )

    def _filter(self, tenant_id: str | None, memory_ids: list[str] | None = None):
        m = self._m
        must = [m.FieldCondition(key="tenant_id", match=m.MatchValue(value=tenant_id))] if tenant_id else []
        if memory_ids:
            must.append(m.HasIdCondition(has_id=memory_ids))
        return m.Filter(must=must)

    def upsert(self, tenant_id: str, memory_id: str, dense: list[float], payload: dict | None = None) -> None:
        self.client.upsert(COLLECTION, points=[self._m.PointStruct(
            id=memory_id, vector={"dense": dense},
            payload={**(payload or {}), "tenant_id": tenant_id, "memory_id": memory_id})])

    def search(self, tenant_id: str, dense: list[float], limit: int) -> list[tuple[str, float]]:
        hits = self.client.query_points(COLLECTION, query=dense, using="dense", query_filter=self._filter(tenant_id),
                                        limit=limit, with_payload=True).points
        return [(h.payload["memory_id"], h.score) for h in hits]

    def delete(self, tenant_id: str, memory_ids: list[str]) -> None:
        self.client.delete(COLLECTION, points_selector=self._m.FilterSelector(
            filter=self._filter(tenant_id, memory_ids)))

    def count(self, tenant_id: str | None = None) -> int:
        return self.client.count(COLLECTION, count_filter=self._filter(tenant_id), exact=True).count

    def close(self) -> None:
        self.client.close()


def open_vector_index(qdrant_url: str | None, data_dir: Path, *, hnsw_m: int, hnsw_ef_construct: int):
    if qdrant_url:
        return ServerVectorIndex(qdrant_url, hnsw_m=hnsw_m, hnsw_ef_construct=hnsw_ef_construct)
    return EdgeVectorIndex(data_dir / "qdrant" / COLLECTION, hnsw_m=hnsw_m, hnsw_ef_construct=hnsw_ef_construct)

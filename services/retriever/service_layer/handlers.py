"""Retriever handlers: index memory events, answer searches."""

from __future__ import annotations

from datetime import UTC, datetime

from services.retriever.domain import Document, Hit, SearchQuery, rank
from services.retriever.service_layer.ports import DocumentStore, VectorIndex

__all__ = ["forget_documents", "index_document", "search"]

CANDIDATES = 500


async def index_document(document: Document, store: DocumentStore) -> None:
    await store.upsert(document)


async def forget_documents(tenant_id: str, memory_ids: list[str], store: DocumentStore, index: VectorIndex) -> int:
    index.delete(tenant_id, memory_ids)
    return await store.delete(tenant_id, memory_ids)


async def search(query: SearchQuery, store: DocumentStore, now: datetime | None = None) -> list[Hit]:
    query = query.validated()
    candidates = await store.candidates(query, CANDIDATES)
    return rank(query, candidates, now or datetime.now(UTC))

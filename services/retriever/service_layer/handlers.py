"""Retriever handlers: index memory events, answer searches."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from services.retriever.domain import Document, Hit, SearchQuery, rank
from services.retriever.service_layer.ports import DocumentStore, VectorIndex

__all__ = ["forget_documents", "index_document", "search"]

CANDIDATES = 500


async def index_document(document: Document, store: DocumentStore) -> None:
    await store.upsert(document)


async def forget_documents(tenant_id: str, memory_ids: list[str], store: DocumentStore, index: VectorIndex) -> int:
    """Tombstone and delete in the store, then purge the index; a failure of either undoes both (retried)."""
    removed = await store.delete(tenant_id, memory_ids)
    await asyncio.to_thread(index.delete, tenant_id, memory_ids)  # a blocking client: off the event loop
    return removed


async def search(query: SearchQuery, store: DocumentStore, now: datetime | None = None) -> list[Hit]:
    query = query.validated()
    candidates = await store.candidates(query, CANDIDATES)
    return rank(query, candidates, now or datetime.now(UTC))

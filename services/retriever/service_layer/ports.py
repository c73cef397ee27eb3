"""Ports of the retriever: where documents live, and the vector index."""

from __future__ import annotations

from typing import Protocol

from services.retriever.domain import Document, SearchQuery

__all__ = ["DocumentStore", "VectorIndex"]


class DocumentStore(Protocol):
    async def upsert(self, document: Document) -> None: ...
    async def delete(self, tenant_id: str, memory_ids: list[str]) -> int: ...
    async def candidates(self, query: SearchQuery, limit: int) -> list[Document]:
        """Documents that pass the query's hard filters (tenant first) and share a term with it."""
        ...


class VectorIndex(Protocol):
    def delete(self, tenant_id: str, memory_ids: list[str]) -> None: ...
    def count(self, tenant_id: str | None = None) -> int: ...
    def close(self) -> None: ...

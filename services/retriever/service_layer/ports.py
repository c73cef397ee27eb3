"""Ports of the retriever: where documents live, and the vector index."""

from __future__ import annotations

from typing import Protocol

from services.retriever.domain import Document, SearchQuery

__all__ = ["DocumentStore", "VectorIndex"]


class DocumentStore(Protocol):
    async def upsert(self, document: Document) -> bool:
        """Index `document`, unless its memory was forgotten (events may come out of order); True if indexed."""
        ...

    async def delete(self, tenant_id: str, memory_ids: list[str]) -> int:
        """Remove the tenant's documents and remember them as forgotten; return how many were removed."""
        ...

    async def candidates(self, query: SearchQuery, limit: int) -> list[Document]:
        """Documents that pass the query's hard filters (tenant first) and share a term with it."""
        ...


class VectorIndex(Protocol):
    """Every operation is confined to one tenant."""

    def upsert(self, tenant_id: str, memory_id: str, dense: list[float], payload: dict | None = None) -> None: ...
    def search(self, tenant_id: str, dense: list[float], limit: int) -> list[tuple[str, float]]: ...
    def delete(self, tenant_id: str, memory_ids: list[str]) -> None: ...
    def count(self, tenant_id: str | None = None) -> int: ...
    def close(self) -> None: ...

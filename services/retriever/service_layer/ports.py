"""Ports of the retriever: where documents live, the vector index, the embedder."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from services.retriever.domain import Document, SparseVector
from services.retriever.domain.router import Vocabulary
from services.retriever.domain.structured import StructuredQuery

__all__ = ["DocumentStore", "Embedder", "StructuredStore", "VectorIndex"]


class DocumentStore(Protocol):
    async def upsert(self, document: Document, then: Callable[[], Awaitable[None]] | None = None,
                     version: int = 0) -> bool:
        """Index `document` unless its memory was forgotten (events may come out of order) or a newer version
        is indexed; True if indexed. `then` runs only if it was, under the memory's lock, before commit."""
        ...

    async def record(self, document: Document, version: int = 0) -> bool:
        """As upsert, but the vectors are left to the projector (`pending`); True if recorded."""
        ...

    async def record_many(self, items: list[tuple[Document, int]]) -> None:
        """As record, for many (document, version) of one tenant in one round."""
        ...

    def pending(self, limit: int) -> AbstractAsyncContextManager[list[Document]]:
        """Up to `limit` recorded documents without vectors, locked; marked projected when the body returns."""
        ...

    async def amend(self, tenant_id: str, memory_ids: list[str], change: Callable[[Document], Document],
                    then: Callable[[list[Document]], Awaitable[None]] | None = None) -> int:
        """Apply `change` to the tenant's documents among these ids, under their locks; `then` rewrites the
        index payload of the changed ones already indexed (before commit); the others, or all without
        `then`, are queued for the projector. Return how many changed."""
        ...

    async def delete(self, tenant_id: str, memory_ids: list[str],
                     then: Callable[[], Awaitable[None]] | None = None, *, tombstone: bool = True) -> int:
        """Remove the tenant's documents and (with `tombstone`) remember them as forgotten; return how many
        were removed."""
        ...

    async def fetch(self, tenant_id: str, memory_ids: list[str]) -> dict[str, Document]:
        """The tenant's documents among these ids."""
        ...


class StructuredStore(Protocol):
    async def query(self, q: StructuredQuery) -> tuple[list[Document], bool]:
        """The tenant's memories matching every condition of a validated query, in its order, at most
        `limit`; and whether more matched."""
        ...

    async def vocabulary(self, tenant_id: str, user_id: str = "") -> Vocabulary:
        """Entity keys, attribute names and short attribute values of the tenant's (user's) memories."""
        ...


class VectorIndex(Protocol):
    """Every operation is confined to one tenant. Every method blocks (run it off the event loop)."""

    def upsert(self, documents: list[tuple[Document, list[float], SparseVector]]) -> None: ...
    def set_payloads(self, tenant_id: str, documents: list[Document]) -> None: ...
    def query(self, iq) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]: ...
    def retrieve(self, tenant_id: str, memory_ids: list[str]) -> dict[str, dict]: ...
    def delete(self, tenant_id: str, memory_ids: list[str]) -> None: ...
    def count(self, tenant_id: str | None = None) -> int: ...
    def optimize(self) -> bool: ...
    def close(self) -> None: ...


class Embedder(Protocol):
    name: str
    dim: int
    batch: int

    def embed(self, texts: list[str]) -> list[list[float]]:
        """Unit-length vectors, one per text (blocking)."""
        ...

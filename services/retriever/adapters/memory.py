"""Documents held in process: the evaluation harness's store (no PostgreSQL needed), same port and rules
as PostgresDocuments (tombstones; `then` runs under the per-memory lock before the change is visible)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable

from services.retriever.domain import Document

__all__ = ["InMemoryDocuments"]


class InMemoryDocuments:
    def __init__(self) -> None:
        self.documents: dict[str, Document] = {}
        self.tombstones: set[str] = set()
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    async def upsert(self, d: Document, then: Callable[[], Awaitable[None]] | None = None) -> bool:
        async with self._locks[d.memory_id]:
            if d.memory_id in self.tombstones:
                return False
            if then is not None:
                await then()
            self.documents[d.memory_id] = d
            return True

    async def delete(self, tenant_id: str, memory_ids: list[str],
                     then: Callable[[], Awaitable[None]] | None = None) -> int:
        removed = 0
        for m in sorted(memory_ids):
            await self._locks[m].acquire()
        try:
            self.tombstones.update(memory_ids)
            for m in memory_ids:
                if m in self.documents and self.documents[m].tenant_id == tenant_id:
                    del self.documents[m]
                    removed += 1
            if then is not None:
                await then()
        finally:
            for m in sorted(memory_ids):
                self._locks[m].release()
        return removed

    async def fetch(self, tenant_id: str, memory_ids: list[str]) -> dict[str, Document]:
        return {m: d for m in memory_ids if (d := self.documents.get(m)) is not None and d.tenant_id == tenant_id}

"""Documents held in process: the evaluation harness's store and the unit tests' (no PostgreSQL needed), same
port and rules as PostgresDocuments (tombstones, versions; `then` runs under the per-memory lock before the
change is visible; recorded documents wait for the projector)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable

from services.retriever.domain import Document

__all__ = ["InMemoryDocuments"]


class InMemoryDocuments:
    def __init__(self) -> None:
        self.documents: dict[str, Document] = {}
        self.versions: dict[str, int] = {}
        self.unprojected: dict[str, None] = {}  # insertion order: the projector's queue
        self.tombstones: set[str] = set()
        self.recorded = asyncio.Event()  # set by record(): the projector's wake-up (NOTIFY in PostgreSQL)
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    def _write(self, d: Document, version: int, projected: bool) -> bool:
        if d.memory_id in self.tombstones or self.versions.get(d.memory_id, 0) > version:
            return False
        self.documents[d.memory_id], self.versions[d.memory_id] = d, version
        if projected:
            self.unprojected.pop(d.memory_id, None)
        else:
            self.unprojected[d.memory_id] = None
        return True

    async def upsert(self, d: Document, then: Callable[[], Awaitable[None]] | None = None,
                     version: int = 0) -> bool:
        async with self._locks[d.memory_id]:
            if d.memory_id in self.tombstones or self.versions.get(d.memory_id, 0) > version:
                return False
            if then is not None:
                await then()
            return self._write(d, version, projected=True)

    async def record(self, d: Document, version: int = 0) -> bool:
        async with self._locks[d.memory_id]:
            recorded = self._write(d, version, projected=False)
        if recorded:
            self.recorded.set()
        return recorded

    async def record_many(self, items: list[tuple[Document, int]]) -> None:
        for d, version in items:
            await self.record(d, version)

    @contextlib.asynccontextmanager
    async def pending(self, limit: int) -> AsyncIterator[list[Document]]:
        taken = []
        for m in list(self.unprojected)[:limit]:
            if not self._locks[m].locked():  # as pg_try_advisory_xact_lock: never wait
                await self._locks[m].acquire()
                taken.append(m)
        try:
            documents = [self.documents[m] for m in taken if m in self.unprojected]
            yield documents
            for d in documents:
                self.unprojected.pop(d.memory_id, None)
        finally:
            for m in taken:
                self._locks[m].release()

    async def amend(self, tenant_id: str, memory_ids: list[str], change: Callable[[Document], Document],
                    then: Callable[[list[Document]], Awaitable[None]] | None = None) -> int:
        changed, indexed, before = 0, [], dict(self.documents)
        queued = dict(self.unprojected)
        for m in sorted(set(memory_ids)):
            await self._locks[m].acquire()
        try:
            for m in memory_ids:
                d = self.documents.get(m)
                if d is None or d.tenant_id != tenant_id or (new := change(d)) == d:
                    continue
                self.documents[m] = new
                changed += 1
                if then is not None and m not in self.unprojected:
                    indexed.append(new)
                    continue
                self.unprojected.pop(m, None)
                self.unprojected[m] = None  # queued again, at the end, for the projector
            if indexed:
                try:
                    await then(indexed)
                except BaseException:  # as a rolled-back transaction: nothing is kept
                    self.documents, self.unprojected = before, queued
                    raise
        finally:
            for m in sorted(set(memory_ids)):
                self._locks[m].release()
        if changed and not indexed:
            self.recorded.set()
        return changed

    async def delete(self, tenant_id: str, memory_ids: list[str],
                     then: Callable[[], Awaitable[None]] | None = None, *, tombstone: bool = True) -> int:
        removed = 0
        for m in sorted(memory_ids):
            await self._locks[m].acquire()
        try:
            if tombstone:
                self.tombstones.update(memory_ids)
            for m in memory_ids:
                if m in self.documents and self.documents[m].tenant_id == tenant_id:
                    del self.documents[m]
                    self.versions.pop(m, None)  # as the deleted row in PostgreSQL
                    self.unprojected.pop(m, None)
                    removed += 1
            if then is not None:
                await then()
        finally:
            for m in sorted(memory_ids):
                self._locks[m].release()
        return removed

    async def fetch(self, tenant_id: str, memory_ids: list[str]) -> dict[str, Document]:
        return {m: d for m in memory_ids if (d := self.documents.get(m)) is not None and d.tenant_id == tenant_id}

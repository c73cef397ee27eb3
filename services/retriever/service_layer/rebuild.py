"""Rebuild the vector index: replay the projection of the memory events into a fresh generation, then
swap it in. Searches keep running on the current generation throughout and move to the new one at the
swap; every index write made meanwhile goes to both (adapters/generations.py), and each copied batch is
read and written under its memories' locks, so the new generation misses nothing and revives nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta

from libs.errors import ValidationFailed
from services.retriever.service_layer.handlers import Retrieval, encode

__all__ = ["DEFAULT_BATCH", "Progress", "rebuild_index"]

DEFAULT_BATCH = 256
MAX_BATCH = 2_000
_FIRST = "00000000-0000-0000-0000-000000000000"
# Changes older than the copy's start by this much are caught up too: a transaction of another replica
# stamps its rows with its own start, which may precede the copy's start while it commits after.
CATCH_UP_MARGIN = timedelta(minutes=5)


@dataclass(frozen=True)
class Progress:
    phase: str  # copying | swapped
    done: int
    total: int
    index: str
    seconds: float = 0.0


async def rebuild_index(store, r: Retrieval, batch: int = 0) -> AsyncIterator[Progress]:
    """`store`: PostgresDocuments (count_all, locked_batch); `r.index`: a SwitchableIndex. Yields progress
    after each batch, then once swapped. Any failure discards the fresh generation: search never noticed."""
    batch = batch or DEFAULT_BATCH
    if not 1 <= batch <= MAX_BATCH:
        raise ValidationFailed(f"must be between 1 and {MAX_BATCH} (0 means {DEFAULT_BATCH})", field="batch")
    switch = r.index
    started, since = time.perf_counter(), await store.clock() - CATCH_UP_MARGIN
    fresh = await asyncio.to_thread(switch.prepare)
    try:
        total, done, after = await store.count_all(), 0, _FIRST
        yield Progress("copying", 0, total, fresh.name)
        while after is not None:
            async with store.locked_batch(after, batch) as (documents, after):
                if documents:
                    encoded = await encode(documents, r)
                    await asyncio.to_thread(fresh.upsert, encoded)
            done += len(documents)
            if documents:
                yield Progress("copying", done, max(total, done), fresh.name, time.perf_counter() - started)
        await asyncio.to_thread(fresh.optimize)  # the HNSW graph built before it serves (embedded engine)
        name = await asyncio.to_thread(switch.commit)
    except BaseException:
        await asyncio.shield(asyncio.to_thread(switch.abort))
        raise
    await _catch_up(store, r, since, batch)
    yield Progress("swapped", done, max(total, done), name, time.perf_counter() - started)


async def _catch_up(store, r: Retrieval, since, batch: int) -> None:
    """Other replicas (a Qdrant server behind several retrievers) wrote the old generation only during the
    copy: what the projection recorded, amended or forgot since the copy began is written again, now to the
    new generation, under the memories' locks. This process's own writes reached both generations already;
    writing them again is harmless (upserts by id). A quarantine leaves no trace to catch up (see README)."""
    changed, forgotten = await store.changed_since(since)
    for start in range(0, len(changed), batch):
        async with store.locked_documents(changed[start:start + batch]) as documents:
            if documents:
                await asyncio.to_thread(r.index.upsert, await encode(documents, r))
    by_tenant: dict[str, list[str]] = {}
    for tenant_id, memory_id in forgotten:
        by_tenant.setdefault(tenant_id, []).append(memory_id)
    for tenant_id, memory_ids in by_tenant.items():
        await asyncio.to_thread(r.index.delete, tenant_id, memory_ids)

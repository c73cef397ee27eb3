"""Rebuild the vector index: replay the projection of the memory events into a fresh generation, then
swap it in. Searches keep running on the current generation throughout and move to the new one at the
swap; every index write made meanwhile goes to both (adapters/generations.py), and each copied batch is
read and written under its memories' locks, so the new generation misses nothing and revives nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from libs.errors import ValidationFailed
from services.retriever.service_layer.handlers import Retrieval, encode

__all__ = ["DEFAULT_BATCH", "Progress", "rebuild_index"]

DEFAULT_BATCH = 256
MAX_BATCH = 2_000
_FIRST = "00000000-0000-0000-0000-000000000000"


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
    started = time.perf_counter()
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
    yield Progress("swapped", done, max(total, done), name, time.perf_counter() - started)

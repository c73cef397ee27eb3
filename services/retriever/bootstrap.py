"""Wire the retriever: document projection in PostgreSQL, vectors in Qdrant (embedded or server)."""

from __future__ import annotations

import asyncio

from libs.events.schema import MEMORY_EVENTS
from libs.runtime import ServiceContext
from services.retriever.adapters.postgres import PostgresDocuments
from services.retriever.adapters.vectors import open_vector_index
from services.retriever.entrypoints import grpc_api, streams

NAME = "retriever"
MIGRATIONS = "services.retriever"


async def bootstrap(ctx: ServiceContext) -> None:
    s = ctx.settings
    index = await asyncio.to_thread(open_vector_index, s.qdrant_url, s.data_dir, hnsw_m=s.hnsw_m,
                                    hnsw_ef_construct=s.hnsw_ef_construct)
    ctx.closers.append(lambda: asyncio.to_thread(index.close))
    ctx.add_grpc(grpc_api.registration(PostgresDocuments(ctx.db)))
    ctx.subscribe(MEMORY_EVENTS, streams.on_memory_event(lambda conn: PostgresDocuments(ctx.db, conn), index))

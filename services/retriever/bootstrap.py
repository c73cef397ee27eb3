"""Wire the retriever: documents in PostgreSQL, vectors in Qdrant (embedded or server), the embedder."""

from __future__ import annotations

import asyncio

from libs.db.notify import Notifier
from libs.events import Envelope
from libs.events.batches import BatchConsumer
from libs.events.schema import MEMORY_ACCESS, MEMORY_EVENTS
from libs.protogen.mnemesh.v1 import common_pb2, events_pb2
from libs.runtime import ServiceContext
from services.retriever.adapters.embedders import open_embedder
from services.retriever.adapters.metrics import RetrieverMetrics
from services.retriever.adapters.postgres import PostgresDocuments
from services.retriever.adapters.structured import PostgresQueries
from services.retriever.adapters.vectors import open_vector_index
from services.retriever.domain import Bm25
from services.retriever.entrypoints import grpc_api, streams
from services.retriever.service_layer.accesses import AccessBatcher
from services.retriever.service_layer.batching import BatchingEmbedder
from services.retriever.service_layer.handlers import Retrieval
from services.retriever.service_layer.projector import Projector
from services.retriever.service_layer.rebuild import rebuild_index

NAME = "retriever"
EVENT_BATCH = 256  # memory events per stream read
EVENT_BLOCK_MS = 200
PROJECTORS = 2  # concurrent projector loops: one embeds while the other writes its batch (disjoint batches)
MIGRATIONS = "services.retriever"


async def bootstrap(ctx: ServiceContext) -> None:
    s = ctx.settings
    embedder = await asyncio.to_thread(
        open_embedder, s.embedder, url=s.embeddings_url, model=s.embeddings_model,
        api_key=s.embeddings_api_key.get_secret_value(), dim=s.embeddings_dim,
        threads=s.embedder_threads, runner=s.embedder_runner)
    if hasattr(embedder, "close"):  # a worker process: stopped with the service
        ctx.closers.append(lambda: asyncio.to_thread(embedder.close))
    index = await asyncio.to_thread(open_vector_index, s.qdrant_url, s.data_dir, dim=embedder.dim, hnsw_m=s.hnsw_m,
                                    hnsw_ef_construct=s.hnsw_ef_construct)
    ctx.closers.append(lambda: asyncio.to_thread(index.close))

    async def optimize_index() -> None:  # the embedded engine has no background optimizer of its own
        while True:
            await asyncio.sleep(s.index_optimize_seconds)
            if getattr(index, "dirty", False):
                await asyncio.to_thread(index.optimize)

    ctx.tasks.append(optimize_index)

    async def publish_accesses(tenant_id: str, user_id: str, memory_ids: list[str], at) -> None:
        message = events_pb2.MemoryAccessed(tenant=common_pb2.TenantContext(tenant_id=tenant_id, user_id=user_id),
                                            memory_ids=memory_ids)
        message.accessed_at.FromDatetime(at)
        await ctx.bus.publish(Envelope.wrap(message, event_type="memory.accessed", tenant_id=tenant_id),
                              stream=MEMORY_ACCESS)

    accesses = AccessBatcher(publish_accesses)
    ctx.tasks.append(accesses.run)  # flushes once more when cancelled, before the bus stops
    bm25 = Bm25(avg_len=s.bm25_avg_len)
    await asyncio.to_thread(bm25.load)
    retrieval = Retrieval(index, BatchingEmbedder(embedder), bm25, RetrieverMetrics(index.count), accesses)
    # memory.written events are recorded by the stream handler; the projector embeds and indexes them in
    # batches, woken by the NOTIFY of each recording's commit.
    notifier = Notifier(ctx.db.connect, PostgresDocuments.channel(ctx.db))
    ctx.closers.append(notifier.close)
    for _ in range(PROJECTORS):
        ctx.tasks.append(Projector(PostgresDocuments(ctx.db), retrieval, notifier.mark, notifier.wait).run)
    ctx.add_grpc(grpc_api.registration(PostgresDocuments(ctx.db), PostgresQueries(ctx.db), retrieval,
                                       rebuild=lambda batch: rebuild_index(PostgresDocuments(ctx.db), retrieval, batch)))
    # Memory events in batches (one XREADGROUP and one transaction per batch and tenant): consecutive
    # memory.written are recorded in one round; the projector then embeds them as one model batch.
    consumer = BatchConsumer(ctx.bus, ctx.db, MEMORY_EVENTS, ctx.group,
                             streams.on_memory_batch(lambda conn: PostgresDocuments(ctx.db, conn), retrieval),
                             ctx.verifier, batch_size=EVENT_BATCH, block_ms=EVENT_BLOCK_MS)
    ctx.tasks.append(consumer.run)

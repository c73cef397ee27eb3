"""Wire the memory-writer: real adapters here; tests call the handlers with fakes."""

from __future__ import annotations

import gc
from datetime import timedelta

import redis.asyncio

from libs.crypto import key_provider
from libs.events.batches import BatchConsumer
from libs.events.schema import MEMORY_ACCESS, MEMORY_COMMANDS
from libs.lease import RedisLease
from libs.runtime import ServiceContext
from services.memory_writer.adapters.keys import KeyRing
from services.memory_writer.adapters.llm import OpenAICompatibleSummarizer
from services.memory_writer.adapters.postgres import PostgresUnitOfWork
from services.memory_writer.adapters.stream_copies import RedisStreamCopies
from services.memory_writer.domain.compression import Triggers
from services.memory_writer.domain.policy import WritePolicy
from services.memory_writer.entrypoints import grpc_api, streams
from services.memory_writer.entrypoints.sweeper import Sweeper
from services.memory_writer.service_layer.upkeep import SweepPolicy

NAME = "memory-writer"
MIGRATIONS = "services.memory_writer"


async def bootstrap(ctx: ServiceContext) -> None:
    settings = ctx.settings
    keys = KeyRing(key_provider(settings.master_key, settings.data_dir, pin=settings.pkcs11_pin.get_secret_value(),
                                dev_mode=settings.dev_mode))

    def uow():
        return PostgresUnitOfWork(ctx.db, ctx.event_store, ctx.outbox, keys)

    def uow_in(conn):
        return PostgresUnitOfWork(ctx.db, ctx.event_store, ctx.outbox, keys, conn=conn)

    summarizer = None
    if settings.llm_base_url and settings.llm_model:
        summarizer = OpenAICompatibleSummarizer(settings.llm_base_url, settings.llm_model,
                                                settings.llm_api_key.get_secret_value())
        ctx.closers.append(summarizer.close)
    triggers = Triggers(turns=settings.memory_compress_turns, share=settings.memory_compress_share,
                        window_tokens=settings.memory_context_window_tokens)
    policy = WritePolicy.of(settings.memory_burst_limit, settings.memory_sensitive_contacts)
    ctx.add_grpc(grpc_api.registration(uow, summarizer, triggers, policy, RedisStreamCopies(ctx.bus)))
    # Commands are taken in batches (one transaction per batch and tenant), not one by one through
    # ctx.subscribe: that is what lets the stream reach thousands of writes per second.
    consumer = BatchConsumer(ctx.bus, ctx.db, MEMORY_COMMANDS, ctx.group, streams.on_write_batch(uow_in, policy),
                             ctx.verifier, batch_size=ctx.settings.memory_batch_size,
                             block_ms=ctx.settings.memory_batch_block_ms,
                             # A command may hold a secret: once written (sealed), its entry is deleted, and a
                             # dead-lettered one keeps only the redacted text.
                             delete_handled=True, scrub=streams.scrub_command, scrub_reason=streams.scrub_reason,
                             # The next batch is read and checked while the last commits; one user's commands
                             # keep their order.
                             in_flight=ctx.settings.memory_batches_in_flight, order_key=streams.command_user)
    ctx.tasks.append(consumer.run)

    sweep = SweepPolicy(archive_after=timedelta(days=settings.memory_archive_after_days),
                        half_life=timedelta(days=settings.memory_engagement_half_life_days))
    ctx.subscribe(MEMORY_ACCESS, streams.on_access(uow_in, sweep))
    lease_client = redis.asyncio.from_url(settings.redis_url)
    ctx.closers.append(lease_client.aclose)
    lease = RedisLease(lease_client, ctx.bus.stream_name("mnemesh.memory-writer.sweeper"),
                       ttl_ms=int(max(settings.memory_sweep_seconds * 3, 10) * 1000))
    ctx.tasks.append(Sweeper(ctx.db, uow, lease, sweep, every_seconds=settings.memory_sweep_seconds).run)
    # Everything alive now (modules, protobuf descriptors, gRPC, telemetry) lives as long as the process:
    # frozen out of the collector's sight, a full collection no longer walks it. Under the write bench a
    # full collection took about 70 ms (three per 3,000 stream writes, a tenth of the writer's CPU); frozen,
    # about 8 ms.
    gc.freeze()

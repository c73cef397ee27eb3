"""Wire the memory-writer: real adapters here; tests call the handlers with fakes."""

from __future__ import annotations

from libs.events.schema import MEMORY_COMMANDS
from libs.runtime import ServiceContext
from services.memory_writer.adapters.postgres import PostgresUnitOfWork
from services.memory_writer.entrypoints import grpc_api, streams

NAME = "memory-writer"
MIGRATIONS = "services.memory_writer"


async def bootstrap(ctx: ServiceContext) -> None:
    def uow():
        return PostgresUnitOfWork(ctx.db, ctx.event_store, ctx.outbox)

    def uow_in(conn, envelope):
        return PostgresUnitOfWork(ctx.db, ctx.event_store, ctx.outbox, conn=conn, causation=envelope)

    ctx.add_grpc(grpc_api.registration(uow))
    ctx.subscribe(MEMORY_COMMANDS, streams.on_write_requested(uow_in))

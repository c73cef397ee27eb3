"""The memory commands stream: each event becomes a WriteMemory command, like a gRPC Write."""

from __future__ import annotations

from collections.abc import Callable

import asyncpg

from libs.events import Envelope
from services.memory_writer.adapters.mapping import command_from_proto
from services.memory_writer.service_layer import handlers
from services.memory_writer.service_layer.unit_of_work import UnitOfWork

__all__ = ["on_write_requested"]


def on_write_requested(uow_for: Callable[[asyncpg.Connection, Envelope], UnitOfWork]):
    async def handle(envelope: Envelope, conn: asyncpg.Connection) -> None:
        await handlers.write_memory(command_from_proto(envelope.message()), uow_for(conn, envelope),
                                    on_behalf_of=envelope.tenant_id)

    return handle

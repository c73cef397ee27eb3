"""The memory commands stream: each event becomes a WriteMemory command, like a gRPC Write."""

from __future__ import annotations

from collections.abc import Callable

from psycopg import AsyncConnection

from libs.errors import ValidationFailed
from libs.events import Envelope
from services.memory_writer.adapters.mapping import command_from_proto
from services.memory_writer.service_layer import handlers
from services.memory_writer.service_layer.unit_of_work import UnitOfWork

__all__ = ["on_write_requested"]


def on_write_requested(uow_for: Callable[[AsyncConnection, Envelope], UnitOfWork]):
    async def handle(envelope: Envelope, conn: AsyncConnection) -> None:
        command = command_from_proto(envelope.message())
        if command.tenant_id and command.tenant_id != envelope.tenant_id:
            raise ValidationFailed("differs from the envelope's tenant_id", field="payload.tenant.tenant_id",
                                   hint="publish commands under the tenant they belong to")
        await handlers.write_memory(command, uow_for(conn, envelope))

    return handle

"""Idempotent event handling: the processed-event row commits with the handler's effect.

The handler's transaction acts as the event's tenant (row-level security), so a
handler can only touch the data of the tenant its event names.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncpg

from libs.db import ALL_TENANTS, Database
from libs.events import Envelope, MalformedEvent

__all__ = ["TransactionalHandler", "idempotent"]

TransactionalHandler = Callable[[Envelope, asyncpg.Connection], Awaitable[None]]


def idempotent(db: Database, consumer: str, handler: TransactionalHandler) -> Callable[[Envelope], Awaitable[None]]:
    """Wrap `handler` so each event id takes effect once for `consumer`, however often it is delivered."""

    async def handle(envelope: Envelope) -> None:
        if envelope.tenant_id == ALL_TENANTS:
            raise MalformedEvent(field="tenant_id", reason=f"{ALL_TENANTS!r} names no tenant",
                                 hint="publish with the tenant id of your token")
        async with db.transaction(envelope.tenant_id) as conn:
            first = await conn.fetchval(
                "INSERT INTO processed_events (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING"
                " RETURNING true", consumer, envelope.event_id)
            if not first:
                return  # already done: redelivery after a crash before ack, or a republished outbox row
            await handler(envelope, conn)

    return handle

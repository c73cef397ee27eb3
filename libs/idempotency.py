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

# Per tenant: producers choose event ids, and one tenant's must never mark another's event done. A row from
# before tenants were kept (tenant_id '') counts for every tenant: an event pending across that upgrade
# takes effect once.
_MARK = ("INSERT INTO processed_events (consumer, tenant_id, event_id) SELECT $1::text, $2::text, $3::uuid"
         " WHERE NOT EXISTS (SELECT 1 FROM processed_events WHERE consumer = $1 AND tenant_id = '' AND event_id = $3)"
         " ON CONFLICT DO NOTHING RETURNING true")


def idempotent(db: Database, consumer: str, handler: TransactionalHandler) -> Callable[[Envelope], Awaitable[None]]:
    """Wrap `handler` so each event id of a tenant takes effect once for `consumer`, however often it is
    delivered."""

    async def handle(envelope: Envelope) -> None:
        if envelope.tenant_id == ALL_TENANTS:
            raise MalformedEvent(field="tenant_id", reason=f"{ALL_TENANTS!r} names no tenant",
                                 hint="publish with the tenant id of your token")
        async with db.transaction(envelope.tenant_id) as conn:
            first = await conn.fetchval(_MARK, consumer, envelope.tenant_id, envelope.event_id)
            if not first:
                return  # already done: redelivery after a crash before ack, or a republished outbox row
            await handler(envelope, conn)

    return handle

"""Idempotent event handling: the processed-event row commits with the handler's effect."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from psycopg import AsyncConnection

from libs.db import Database
from libs.events import Envelope

__all__ = ["TransactionalHandler", "idempotent"]

TransactionalHandler = Callable[[Envelope, AsyncConnection], Awaitable[None]]


def idempotent(db: Database, consumer: str, handler: TransactionalHandler) -> Callable[[Envelope], Awaitable[None]]:
    """Wrap `handler` so each event id takes effect once for `consumer`, however often it is delivered."""

    async def handle(envelope: Envelope) -> None:
        async with db.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "INSERT INTO processed_events (consumer, event_id) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                [consumer, envelope.event_id],
            )
            if cur.rowcount == 0:
                return  # already done: redelivery after a crash before ack, or a republished outbox row
            await handler(envelope, conn)

    return handle

"""Transactional outbox and its relay.

``add`` writes an event row in the caller's transaction, beside the change it
announces: both commit or neither does. The relay publishes unpublished rows to
Redis Streams and marks them. It marks only after the stream accepted the entry,
so a relay killed between the two republishes on restart; consumers are
idempotent by event id, so the effect still happens once.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import psycopg
import redis.exceptions
from psycopg import AsyncConnection, sql

from libs.db import Database
from libs.events import Envelope
from libs.events.bus import EventBus
from libs.logs import get_logger

__all__ = ["Outbox", "OutboxRelay"]

log = get_logger(__name__)


class Outbox:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.channel = f"mnemesh_outbox_{db.schema}"

    async def add(self, conn: AsyncConnection, envelope: Envelope, stream: str | None = None) -> None:
        """Record `envelope` for publication; call inside the transaction of the change."""
        await conn.execute(
            "INSERT INTO outbox (stream, event_id, fields) VALUES (%s, %s, %s)",
            [stream or envelope.stream, envelope.event_id, json.dumps(envelope.to_fields())],
        )
        await conn.execute("SELECT pg_notify(%s, '')", [self.channel])

    async def pending(self) -> int:
        async with self.db.connection() as conn:
            cur = await conn.execute("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            return (await cur.fetchone())[0]


class OutboxRelay:
    """Publishes a service's outbox; several replicas may run (rows are locked, skipped)."""

    def __init__(self, outbox: Outbox, bus: EventBus, *, poll_seconds: float = 0.5, batch: int = 100,
                 keep_published: timedelta = timedelta(days=1)) -> None:
        self.outbox, self.bus = outbox, bus
        self.poll_seconds, self.batch, self.keep_published = poll_seconds, batch, keep_published

    async def publish_pending(self) -> int:
        """Publish one batch; return how many rows were published."""
        async with self.outbox.db.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "SELECT id, stream, fields FROM outbox WHERE published_at IS NULL"
                " ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED",
                [self.batch],
            )
            rows = await cur.fetchall()
            for _id, stream, fields in rows:
                await self.bus.publish(Envelope.from_fields(fields), stream=stream)
            if rows:
                await conn.execute("UPDATE outbox SET published_at = now() WHERE id = ANY(%s)",
                                   [[row[0] for row in rows]])
        return len(rows)

    async def purge_published(self) -> int:
        async with self.outbox.db.connection() as conn:
            cur = await conn.execute("DELETE FROM outbox WHERE published_at < now() - %s", [self.keep_published])
            return cur.rowcount

    async def run(self) -> None:
        """Publish until cancelled; wake on NOTIFY, poll as a safety net."""
        listen = await self.outbox.db.listen_connection()
        try:
            await listen.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.outbox.channel)))
            rounds = 0
            while True:
                try:
                    while await self.publish_pending() == self.batch:
                        pass
                    rounds += 1
                    if rounds % 7200 == 0:
                        await self.purge_published()
                except (OSError, psycopg.OperationalError, redis.exceptions.RedisError) as exc:  # Redis or PostgreSQL away: retry, lose nothing
                    log.warning("outbox relay could not publish; will retry", error=str(exc))
                async for _ in listen.notifies(timeout=self.poll_seconds, stop_after=1):
                    pass
        finally:
            await asyncio.shield(listen.close())

"""Transactional outbox and its relay.

``add`` writes an event row in the caller's transaction, beside the change it
announces: both commit or neither does. The relay leases a batch of rows in a
short transaction, publishes them to Redis Streams outside any transaction, and
then marks them published. A relay that dies after publishing and before marking
leaves a lease that runs out: the rows are published again, and consumers, being
idempotent by event id, apply them once. A row that can never be published (it
no longer parses) records why and goes to the dead-letter stream, so it cannot
block the rows behind it.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import redis.exceptions
from psycopg import AsyncConnection

from libs.db import Database
from libs.db.notify import Notifier
from libs.events import Envelope, MalformedEvent
from libs.events.bus import EventBus
from libs.logs import get_logger
from libs.transient import TRANSIENT_ERRORS

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
            cur = await conn.execute("SELECT count(*) FROM outbox WHERE published_at IS NULL AND failure IS NULL")
            return (await cur.fetchone())[0]


class OutboxRelay:
    """Publishes a service's outbox; several replicas may run (leases keep them apart)."""

    def __init__(self, outbox: Outbox, bus: EventBus, *, poll_seconds: float = 0.5, batch: int = 100,
                 lease: timedelta = timedelta(seconds=30)) -> None:
        self.outbox, self.bus = outbox, bus
        self.poll_seconds, self.batch, self.lease = poll_seconds, batch, lease
        self.listening = asyncio.Event()

    async def _lease(self) -> list[tuple[int, str, dict]]:
        async with self.outbox.db.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "UPDATE outbox SET leased_until = now() + %s WHERE id IN ("
                "  SELECT id FROM outbox WHERE published_at IS NULL AND failure IS NULL"
                "    AND (leased_until IS NULL OR leased_until < now())"
                "  ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)"
                " RETURNING id, stream, fields",
                [self.lease, self.batch],
            )
            return sorted(await cur.fetchall())

    async def publish_pending(self) -> int:
        """Publish one leased batch in order; return how many rows it held.

        If publishing stops part-way (Redis away, the relay cancelled), what went out is
        marked and the rest of the batch is released at once, so the next attempt starts
        where this one stopped instead of skipping ahead of it.
        """
        rows = await self._lease()
        published: list[int] = []
        failed: list[tuple[int, str]] = []
        try:
            for row_id, stream, fields in rows:
                try:
                    envelope = Envelope.from_fields(fields)
                except MalformedEvent as exc:
                    await self.bus.dead_letter(self.bus.stream_name(stream), fields, exc.to_dict())
                    failed.append((row_id, json.dumps(exc.to_dict())))
                    continue
                await self.bus.publish(envelope, stream=stream)
                published.append(row_id)
        finally:
            if rows:
                await asyncio.shield(self._settle(rows, published, failed))
        return len(rows)

    async def _settle(self, rows: list, published: list[int], failed: list[tuple[int, str]]) -> None:
        async with self.outbox.db.connection() as conn, conn.transaction():
            await conn.execute("UPDATE outbox SET published_at = now() WHERE id = ANY(%s)", [published])
            for row_id, reason in failed:
                await conn.execute("UPDATE outbox SET failure = %s WHERE id = %s", [reason, row_id])
            await conn.execute("UPDATE outbox SET leased_until = NULL WHERE id = ANY(%s) AND published_at IS NULL",
                               [[row[0] for row in rows]])

    async def purge_published(self, older_than: timedelta = timedelta(days=1)) -> int:
        async with self.outbox.db.connection() as conn:
            cur = await conn.execute("DELETE FROM outbox WHERE published_at < now() - %s", [older_than])
            return cur.rowcount

    async def run(self) -> None:
        """Publish until cancelled; wake on NOTIFY, poll as a safety net (and for expired leases).

        A lost database or Redis connection is waited out, never fatal.
        """
        notifier = Notifier(self.outbox.db.listen_connection, self.outbox.channel)
        try:
            while True:
                mark = notifier.mark()
                if notifier.listening.is_set():
                    self.listening.set()
                try:
                    while await self.publish_pending() == self.batch:
                        pass
                except (*TRANSIENT_ERRORS, OSError, redis.exceptions.RedisError) as exc:
                    log.warning("outbox relay could not publish; will retry", error=str(exc))
                await notifier.wait(mark, self.poll_seconds)
        finally:
            await notifier.close()

"""Transactional outbox and its relay.

``add`` writes an event row in the caller's transaction, beside the change it
announces: both commit or neither does. The relay publishes the rows to Redis
Streams outside any transaction, in id order, then marks them published.

Order across replicas: every service process runs a relay, but only one per
outbox publishes: the holder of a PostgreSQL session advisory lock (the leader).
The others wait and take over when the leader's connection goes (a crash closes
it). Rows of one aggregate are written in version order (a version is appended
after the previous one committed), so one leader publishing in id order keeps each
aggregate's order. A deposed leader whose XADD hung cannot publish after its
successor: every publish carries the leader's term, and a fence in Redis (raised
by each new leader) refuses older terms atomically with the XADD.

A relay that dies after publishing and before marking makes its successor publish
those rows again; consumers, being idempotent by event id, apply them once. A row
that can never be published (its fields no longer parse, or an older schema version
cannot be upcast) records why and goes to the dead-letter stream, so it cannot block the
rows behind it. A current-version payload is not parsed again here (the service printed it
from its message); the consumers check it, and dead-letter it if it is broken.

A transaction that deletes rows no one may publish any more (a forgotten user's events) calls
`Outbox.withhold` last: a relay round reads and publishes under a lock it holds shared, and `withhold`
takes it exclusively until that transaction ends, so by its commit every copy a relay read before is on
the stream (where the caller then removes it), and no round reads the deleted rows again.

The relay reads a row's fields back only when it must. While it leads, `add`/`add_many` keep, in the
process, the envelope each new row holds (by row id, at most `KNOWN` of them); the relay reads the ids and streams of the
pending rows and takes a committed row's envelope from there, and reads `fields` only for the rows it
does not know (written by another process, before a restart, or forgotten). The row stays the durable
record: what is published is only ever a committed row, in id order, marked after publication.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import timedelta

import asyncpg
import redis.exceptions

from libs.db import ALL_TENANTS, Database, act_as, rowcount
from libs.db.notify import Notifier
from libs.events import Envelope, MalformedEvent
from libs.events.bus import EventBus, Fenced
from libs.logs import get_logger
from libs.transient import is_transient

__all__ = ["Outbox", "OutboxRelay"]

log = get_logger(__name__)
# A relay round's first statement: every tenant's rows, and the publishing lock, shared, until the round's
# read-only transaction ends (after its XADDs).
_READ_TO_PUBLISH = "SELECT set_config('mnemesh.tenant_id', $1, true), pg_advisory_xact_lock_shared(hashtext($2))"


class Outbox:
    KNOWN = 2_000  # envelopes of rows written by this process kept for its leading relay (the oldest go first)

    def __init__(self, db: Database) -> None:
        self.db = db
        self.channel = f"mnemesh_outbox_{db.schema}"
        # Row id -> the envelope it holds, for the relay (in id order: ids come from a sequence). A row
        # rolled back, published by another process or deleted is never asked for and ages out.
        self._known: dict[int, Envelope] = {}
        self.keeping = False  # set while this process's relay leads: a follower keeps nothing

    def keep(self, on: bool) -> None:
        self.keeping = on
        if not on:
            self._known.clear()

    def _remember(self, rows: list[tuple[int, Envelope]]) -> None:
        if not self.keeping:
            return
        known = self._known
        for row_id, envelope in rows:
            known[row_id] = envelope
        while len(known) > self.KNOWN:
            del known[next(iter(known))]

    def known(self, row_ids: list[int]) -> dict[int, Envelope]:
        """The envelopes this process wrote in the rows `row_ids` (ascending), of those it still holds; the
        rows below the first are forgotten (published, rolled back, deleted, or to be read back)."""
        known = self._known
        if row_ids:
            while known and (oldest := next(iter(known))) < row_ids[0]:
                del known[oldest]
        return {row_id: envelope for row_id in row_ids if (envelope := known.get(row_id)) is not None}

    def forget(self, row_ids: list[int]) -> None:
        for row_id in row_ids:
            self._known.pop(row_id, None)

    @property
    def publishing_lock(self) -> str:
        return f"outbox-publishing:{self.db.schema}"

    async def withhold(self, conn: asyncpg.Connection) -> None:
        """Call last in a transaction that deletes rows no one may publish any more (a forgotten user's
        events): it waits until no relay is publishing rows it read before, and keeps relays from reading
        until the transaction ends. After the commit, every copy a relay published of those rows is on its
        stream, where the caller can remove it, and none is published later."""
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", self.publishing_lock)

    async def add(self, conn: asyncpg.Connection, envelope: Envelope, stream: str | None = None) -> None:
        """Record `envelope` for publication; call inside the (tenant-scoped) transaction of the change."""
        row_id = await conn.fetchval(
            "INSERT INTO outbox (stream, event_id, fields, tenant_id) VALUES ($1, $2, $3, $4) RETURNING id",
            stream or envelope.stream, envelope.event_id, envelope.to_fields(), envelope.tenant_id)
        await conn.execute("SELECT pg_notify($1, '')", self.channel)
        self._remember([(row_id, envelope)])

    async def add_many(self, conn: asyncpg.Connection, envelopes: list[Envelope], stream: str | None = None) -> None:
        """Record many envelopes for publication, in order, with one statement and one notification;
        call inside the (tenant-scoped) transaction of the change."""
        if not envelopes:
            return
        rows = await conn.fetch(
            "WITH added AS (INSERT INTO outbox (stream, event_id, fields, tenant_id)"
            " SELECT s, e, f, t FROM unnest($1::text[], $2::uuid[], $3::jsonb[], $4::text[])"
            " WITH ORDINALITY AS r(s, e, f, t, n) ORDER BY n RETURNING id, event_id::text AS e),"
            " notified AS (SELECT pg_notify($5, '') FROM (SELECT count(*) FROM added) AS c)"
            " SELECT id, e FROM added, notified",
            [stream or e.stream for e in envelopes], [e.event_id for e in envelopes],
            [e.to_fields() for e in envelopes], [e.tenant_id for e in envelopes], self.channel)
        by_event = {e.event_id: e for e in envelopes}
        self._remember(sorted((row_id, by_event[event_id]) for row_id, event_id in rows))

    async def pending(self) -> int:
        async with self.db.system_transaction() as conn:
            return await conn.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL AND failure IS NULL")


class OutboxRelay:
    """Publishes a service's outbox while it leads; several replicas may run, one leads."""

    def __init__(self, outbox: Outbox, bus: EventBus, *, poll_seconds: float = 0.5, batch: int = 500) -> None:
        self.outbox, self.bus = outbox, bus
        self.poll_seconds, self.batch = poll_seconds, batch
        self.listening = asyncio.Event()
        self.leading = asyncio.Event()
        self.term = 0
        self.read_back = 0  # rows whose fields had to be read back (not written by this process, or forgotten)
        self._conn: asyncpg.Connection | None = None
        self._lock_key = f"outbox:{outbox.db.schema}"
        self.fence_key = bus.stream_name(f"mnemesh.outbox.fence.{outbox.db.schema}")

    async def _lead(self) -> bool:
        """Become (or stay) the leader; False while another relay leads.

        A follower keeps its connection and asks for the lock again at each poll, so taking
        over costs one query, not a new connection.
        """
        if self._conn is None or self._conn.is_closed():
            await self.resign()
            self._conn = await self.outbox.db.connect()
        if self.leading.is_set():
            return True
        conn = self._conn
        try:
            if not await conn.fetchval("SELECT pg_try_advisory_lock(hashtext($1))", self._lock_key):
                return False
            term = await conn.fetchval("SELECT nextval('outbox_leader_term')")
            await self.bus.raise_fence(self.fence_key, term)
        except BaseException:
            await self.resign()  # the lock, if taken, goes with the connection
            raise
        self.term = term
        self.leading.set()
        self.outbox.keep(True)
        log.info("outbox relay leads", schema=self.outbox.db.schema, term=term)
        return True

    async def resign(self) -> None:
        """Stop leading, or waiting to lead (closing the connection releases the lock)."""
        conn, self._conn = self._conn, None
        self.leading.clear()
        self.outbox.keep(False)
        if conn is not None and not conn.is_closed():
            try:
                await asyncio.wait_for(conn.close(), 2)
            except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError):
                conn.terminate()

    async def publish_pending(self) -> int:
        """Publish one batch in id order while leading; return how many rows it held (0 when not leading).

        If publishing stops part-way (Redis away, the relay cancelled), what went out is
        marked, and the next attempt starts where this one stopped. The rows are read and published
        under the outbox's publishing lock, shared (see Outbox.withhold).
        """
        if not await self._lead():
            return 0
        conn = self._conn
        rows: list = []
        published: list[int] = []
        failed: list[tuple[int, dict]] = []
        fenced = False
        try:
            async with conn.transaction(readonly=True):  # held open while publishing: the lock goes with it
                await conn.execute(_READ_TO_PUBLISH, ALL_TENANTS, self.outbox.publishing_lock)
                rows = await conn.fetch("SELECT id, stream FROM outbox WHERE published_at IS NULL"
                                        " AND failure IS NULL ORDER BY id LIMIT $1", self.batch)
                known = self.outbox.known([row_id for row_id, _ in rows])
                unknown = [row_id for row_id, _ in rows if row_id not in known]
                fields_of = dict(await conn.fetch("SELECT id, fields FROM outbox WHERE id = ANY($1::bigint[])",
                                                  unknown)) if unknown else {}
                self.read_back += len(unknown)
                ready: list[tuple[int, Envelope, str]] = []
                for row_id, stream in rows:
                    if row_id in known:  # written by this process: the envelope it printed, not read back
                        ready.append((row_id, known[row_id], stream))
                        continue
                    fields = fields_of.get(row_id)
                    if fields is None:  # deleted since (a forgotten user's): nothing left to publish
                        continue
                    try:
                        # The row's fields are checked, not its payload parsed again: this service printed it
                        # from a message (an older version is still upcast and checked); consumers check it.
                        ready.append((row_id, Envelope.from_fields(fields, check_payload=False), stream))
                    except MalformedEvent as exc:
                        failed.append((row_id, exc.to_dict()))
                        await self.bus.dead_letter(self.bus.stream_name(stream), fields, exc.to_dict())
                try:
                    sent = await self.bus.publish_fenced_batch([(e, s) for _, e, s in ready],
                                                               (self.fence_key, self.term))
                    published = [row_id for row_id, _, _ in ready[:sent]]
                    if sent < len(ready):
                        raise Fenced(f"term {self.term} was fenced after {sent} of {len(ready)} events")
                except Fenced:
                    fenced = True
        except (asyncpg.InterfaceError, asyncpg.PostgresError, OSError):
            if not conn.is_closed():
                raise
            # The session ended under the round (and the leadership with it): the next leader publishes
            # again what went out unmarked, as after a crash.
            fenced = True
        finally:
            if (published or failed) and not conn.is_closed():
                await asyncio.shield(self._settle(conn, published, failed))
            self.outbox.forget(published)
        if fenced:
            log.warning("outbox relay was deposed; another leads now", schema=self.outbox.db.schema, term=self.term)
            await self.resign()
        return len(rows)

    @staticmethod
    async def _settle(conn: asyncpg.Connection, published: list[int], failed: list[tuple[int, dict]]) -> None:
        async with conn.transaction():
            await act_as(conn, ALL_TENANTS)
            await conn.execute("UPDATE outbox SET published_at = now() WHERE id = ANY($1::bigint[])", published)
            if failed:
                await conn.executemany("UPDATE outbox SET failure = $2 WHERE id = $1",
                                       [(row_id, json.dumps(reason)) for row_id, reason in failed])

    async def purge_published(self, older_than: timedelta = timedelta(days=1)) -> int:
        async with self.outbox.db.system_transaction() as conn:
            return rowcount(await conn.execute("DELETE FROM outbox WHERE published_at < now() - $1::interval",
                                               older_than))

    async def run(self) -> None:
        """Publish until cancelled; wake on NOTIFY, poll as a safety net (and to take over from a dead leader).

        A lost database or Redis connection is waited out, never fatal.
        """
        notifier = Notifier(self.outbox.db.connect, self.outbox.channel)
        try:
            while True:
                mark = notifier.mark()
                if notifier.listening.is_set():
                    self.listening.set()
                try:
                    while await self.publish_pending() == self.batch:
                        pass
                except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, redis.exceptions.RedisError) as exc:
                    if not is_transient(exc):
                        raise
                    log.warning("outbox relay could not publish; will retry", error=str(exc))
                    await self.resign()
                await notifier.wait(mark, self.poll_seconds)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.resign())
            await notifier.close()

"""PostgreSQL event store: optimistic appends and gap-safe catch-up subscriptions.

Per-stream versions are gapless and unique: an append names the version it
expects, and a concurrent writer gets ``Conflict``, never a silent overwrite.

The global feed is ordered by each event's place ``(transaction id, position)``,
except that an event never sorts before the previous version of its stream: one
whose transaction took its id early (it did other work before appending) inherits
the previous version's place (``feed_tx``, ``feed_pos``), and ties go by version.
A catch-up reader only reads places older than the oldest transaction still running
(``pg_snapshot_xmin``), so an event whose transaction took an earlier place but
commits later is never skipped: the reader waits at that fence.

Events are tenant-owned rows under row-level security: appends run in the caller's
tenant-scoped transaction; reads state their tenant, and the global feed reads as
the mesh itself (every tenant).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import asyncpg

from libs.db import Database
from libs.db.notify import Notifier
from libs.errors import Conflict
from libs.events import Envelope

__all__ = ["ANY_VERSION", "Checkpoint", "EventStore", "StoredEvent"]

ANY_VERSION = -1
_APPEND = """
WITH current AS (SELECT coalesce(max(version), 0) AS version FROM events WHERE stream_id = $1),
prev AS (SELECT coalesce(feed_tx, transaction_id) AS tx, coalesce(feed_pos, position) AS pos
         FROM events WHERE stream_id = $1 ORDER BY version DESC LIMIT 1),
inserted AS (
    INSERT INTO events (stream_id, version, event_id, event_type, schema_version, tenant_id, payload, metadata,
                        occurred_at, feed_tx, feed_pos)
    SELECT $1, current.version + e.ord, e.event_id, e.event_type, e.schema_version, e.tenant_id, e.payload,
           e.metadata, e.occurred_at,
           CASE WHEN prev.tx > pg_current_xact_id() THEN prev.tx END,
           CASE WHEN prev.tx > pg_current_xact_id() THEN prev.pos END
    FROM current LEFT JOIN prev ON true,
         unnest($4::uuid[], $5::text[], $6::int[], $7::text[], $8::text[], $9::jsonb[], $10::timestamptz[])
             WITH ORDINALITY AS e(event_id, event_type, schema_version, tenant_id, payload, metadata, occurred_at, ord)
    WHERE $2 = -1 OR current.version = $2
    ORDER BY e.ord
    RETURNING version),
appended AS (SELECT max(version) AS version FROM inserted)
SELECT version, CASE WHEN version IS NOT NULL THEN pg_notify($3, $1) END FROM appended
"""
# Many streams in one statement: each stream's current version and feed place, checked against the
# version its writer expects ($2, per event: the same for every event of a stream); if every stream is
# where its writer expects, every event is inserted (none otherwise) in argument order (so outbox and feed order follow it), and each stream announced once.
_APPEND_MANY = """
WITH e AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $4::uuid[], $5::text[], $6::int[], $7::text[], $8::text[],
                         $9::jsonb[], $10::timestamptz[])
        WITH ORDINALITY AS e(stream_id, expected, event_id, event_type, schema_version, tenant_id, payload,
                             metadata, occurred_at, ord)),
s AS (SELECT stream_id, min(expected) AS expected FROM e GROUP BY stream_id),
cur AS (
    SELECT s.stream_id, s.expected, coalesce(p.version, 0) AS version, p.tx, p.pos
    FROM s LEFT JOIN LATERAL (
        SELECT version, coalesce(feed_tx, transaction_id) AS tx, coalesce(feed_pos, position) AS pos
        FROM events WHERE events.stream_id = s.stream_id ORDER BY version DESC LIMIT 1) p ON true),
inserted AS (
    INSERT INTO events (stream_id, version, event_id, event_type, schema_version, tenant_id, payload, metadata,
                        occurred_at, feed_tx, feed_pos)
    SELECT e.stream_id, cur.version + row_number() OVER (PARTITION BY e.stream_id ORDER BY e.ord), e.event_id,
           e.event_type, e.schema_version, e.tenant_id, e.payload, e.metadata, e.occurred_at,
           CASE WHEN cur.tx > pg_current_xact_id() THEN cur.tx END,
           CASE WHEN cur.tx > pg_current_xact_id() THEN cur.pos END
    FROM e JOIN cur USING (stream_id)
    WHERE NOT EXISTS (SELECT 1 FROM cur AS c WHERE c.expected <> -1 AND c.version <> c.expected)
    ORDER BY e.ord
    RETURNING stream_id, version)
SELECT stream_id, max(version) AS version, pg_notify($3, stream_id) FROM inserted GROUP BY stream_id
"""
# Text forms: asyncpg has no codec for xid8, and text order would put "1000" before "999", so
# the reader orders by the expressions and returns their text separately.
_FEED_TX = "coalesce(feed_tx, transaction_id)"
_FEED_POS = "coalesce(feed_pos, position)"
_COLUMNS = (f"{_FEED_TX}::text AS tx, {_FEED_POS} AS pos, stream_id, version, event_id::text AS event_id,"
            " event_type, schema_version, tenant_id, payload, metadata, occurred_at")
_READ_ALL = (f"SELECT {_COLUMNS} FROM events"
             f" WHERE ({_FEED_TX}, {_FEED_POS}, version) > ($1::text::xid8, $2, $3)"
             f"   AND {_FEED_TX} < pg_snapshot_xmin(pg_current_snapshot())"
             f" ORDER BY {_FEED_TX}, {_FEED_POS}, version LIMIT $4")


@dataclass(frozen=True, order=True)
class Checkpoint:
    """Where a catch-up reader stands in the global feed: (transaction id, position, version)."""

    transaction_id: int = 0
    position: int = 0
    version: int = 0

    def __str__(self) -> str:
        return f"{self.transaction_id}:{self.position}:{self.version}"

    @classmethod
    def parse(cls, text: str) -> Checkpoint:
        parts = text.split(":")
        if len(parts) == 2:  # written before per-stream ties: everything at that place was read
            return cls(int(parts[0]), int(parts[1]), 2**62)
        tx, pos, version = parts
        return cls(int(tx), int(pos), int(version))


@dataclass(frozen=True)
class StoredEvent:
    stream_id: str
    version: int
    checkpoint: Checkpoint
    envelope: Envelope

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> StoredEvent:
        meta = row["metadata"]
        envelope = Envelope(
            event_type=row["event_type"], tenant_id=row["tenant_id"], payload=row["payload"],
            event_id=row["event_id"], schema_version=row["schema_version"], occurred_at=row["occurred_at"],
            correlation_id=meta.get("correlation_id", ""), causation_id=meta.get("causation_id", ""),
            traceparent=meta.get("traceparent", ""),
        ).upcast()
        return cls(row["stream_id"], row["version"], Checkpoint(int(row["tx"]), row["pos"], row["version"]),
                   envelope)


class EventStore:
    """The event store of one service schema; `channel` is its NOTIFY channel (payload: the stream id)."""

    def __init__(self, db: Database, *, poll_seconds: float = 0.5, stream_poll_seconds: float = 5.0) -> None:
        self.db = db
        self.channel = f"mnemesh_events_{db.schema}"
        self.poll_seconds, self.stream_poll_seconds = poll_seconds, stream_poll_seconds
        self.notifier = Notifier(db.connect, self.channel)

    async def append(
        self, conn: asyncpg.Connection, stream_id: str, expected_version: int, envelopes: Sequence[Envelope]
    ) -> int:
        """Append inside the caller's transaction; return the stream's new version.

        `expected_version` is the version the writer saw (0: the stream must not
        exist yet) or ANY_VERSION. Raises Conflict when another writer got there first;
        the caller's transaction must then be rolled back (nothing of it was appended).
        One statement on the common path: read the version, insert, announce.
        """
        if not envelopes:
            raise ValueError("append needs at least one event")
        if expected_version < ANY_VERSION:
            raise ValueError(f"expected_version must be {ANY_VERSION} (any) or a version >= 0, not {expected_version}")
        if expected_version == ANY_VERSION:
            # Serialise "append anywhere" writers of one stream; exact-version writers need no lock.
            await self.lock_stream(conn, stream_id)
        metas = [{"correlation_id": e.correlation_id, "causation_id": e.causation_id, "traceparent": e.traceparent}
                 for e in envelopes]
        try:
            new_version = await conn.fetchval(
                _APPEND, stream_id, expected_version, self.channel, [e.event_id for e in envelopes],
                [e.event_type for e in envelopes], [e.schema_version for e in envelopes],
                [e.tenant_id for e in envelopes], [e.payload for e in envelopes], metas,
                [e.occurred_at for e in envelopes])
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name == "events_event_id_key":
                raise Conflict("an event with this event_id is already stored", field="event_id",
                               retryable=False, hint="event ids are unique; this append was already done") from None
            moved = "another writer appended at the same time" if expected_version == ANY_VERSION else \
                f"moved past version {expected_version} while appending"
            raise Conflict(f"stream {stream_id}: {moved}", field="expected_version",
                           hint="read the stream again and retry") from None
        if new_version is None:  # the stream was not at the expected version: nothing was inserted
            current = await conn.fetchval("SELECT coalesce(max(version), 0) FROM events WHERE stream_id = $1",
                                          stream_id)
            raise Conflict(f"stream {stream_id} is at version {current}, not {expected_version}",
                           field="expected_version", hint="read the stream again and retry on the new version")
        return new_version

    async def append_many(
        self, conn: asyncpg.Connection, appends: Sequence[tuple[str, int, Sequence[Envelope]]]
    ) -> list[int]:
        """Append to many streams inside the caller's transaction, in one statement; return each append's
        new stream version, in order.

        `appends` holds (stream id, expected version, envelopes), each stream at most once; the versions
        mean what they mean to `append`. Raises Conflict, and appends nothing, when any stream is not
        at its expected version (the caller's transaction must then be rolled back).
        """
        if not appends:
            return []
        streams = [stream_id for stream_id, _, _ in appends]
        if len(set(streams)) != len(streams):
            raise ValueError("append_many takes each stream once: put all of a stream's events in one append")
        for stream_id, expected, envelopes in appends:
            if not envelopes:
                raise ValueError(f"append to {stream_id} needs at least one event")
            if expected < ANY_VERSION:
                raise ValueError(f"expected_version must be {ANY_VERSION} (any) or a version >= 0, not {expected}")
        anywhere = sorted(s for s, expected, _ in appends if expected == ANY_VERSION)
        if anywhere:  # the lock `append` takes, in one order for every writer (no deadlock between two batches)
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext('stream:' || s))"
                               " FROM unnest($1::text[]) AS s ORDER BY s", anywhere)
        flat = [(stream_id, expected, e) for stream_id, expected, envelopes in appends for e in envelopes]
        try:
            rows = await conn.fetch(
                _APPEND_MANY, [f[0] for f in flat], [f[1] for f in flat], self.channel,
                [f[2].event_id for f in flat], [f[2].event_type for f in flat], [f[2].schema_version for f in flat],
                [f[2].tenant_id for f in flat], [f[2].payload for f in flat],
                [{"correlation_id": f[2].correlation_id, "causation_id": f[2].causation_id,
                  "traceparent": f[2].traceparent} for f in flat], [f[2].occurred_at for f in flat])
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name == "events_event_id_key":
                raise Conflict("an event with this event_id is already stored", field="event_id",
                               retryable=False, hint="event ids are unique; this append was already done") from None
            raise Conflict("another writer appended to one of the streams at the same time",
                           field="expected_version", hint="read the streams again and retry") from None
        versions = {row["stream_id"]: row["version"] for row in rows}
        if len(versions) < len(streams):  # a stream was not at its expected version: nothing was inserted
            currents = dict(await conn.fetch(
                "SELECT stream_id, max(version) FROM events WHERE stream_id = ANY($1::text[]) GROUP BY stream_id",
                streams))
            behind = [(s, e) for s, e, _ in appends if e != ANY_VERSION and currents.get(s, 0) != e] or \
                [(s, e) for s, e, _ in appends if e != ANY_VERSION]  # moved again since: name one that expected
            stream_id, expected = behind[0]
            raise Conflict(f"stream {stream_id} is at version {currents.get(stream_id, 0)}, not {expected}",
                           field="expected_version", hint="read the stream again and retry on the new version")
        return [versions[s] for s in streams]

    @staticmethod
    async def lock_stream(conn: asyncpg.Connection, stream_id: str) -> None:
        """Hold `stream_id`'s append lock until the caller's transaction ends: read, decide and append
        with no other writer in between (the lock ANY_VERSION appends take)."""
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"stream:{stream_id}")

    @staticmethod
    async def read_stream_in(conn: asyncpg.Connection, stream_id: str, after_version: int = 0) -> list[StoredEvent]:
        """All of one stream's events after `after_version`, inside the caller's transaction."""
        rows = await conn.fetch(f"SELECT {_COLUMNS} FROM events WHERE stream_id = $1 AND version > $2"
                                " ORDER BY version", stream_id, after_version)
        return [StoredEvent.from_row(r) for r in rows]

    async def read_stream(self, stream_id: str, after_version: int = 0, limit: int = 1000,
                          tenant_id: str | None = None) -> list[StoredEvent]:
        """One stream's events after `after_version`; with `tenant_id`, as that tenant (only its events)."""
        query = (f"SELECT {_COLUMNS} FROM events WHERE stream_id = $1 AND version > $2"
                 " ORDER BY version LIMIT $3")
        scope = self.db.transaction(tenant_id) if tenant_id is not None else self.db.system_transaction()
        async with scope as conn:
            return [StoredEvent.from_row(r) for r in await conn.fetch(query, stream_id, after_version, limit)]

    async def read_all(self, after: Checkpoint = Checkpoint(), limit: int = 1000) -> list[StoredEvent]:
        """Events after `after` in global order, stopping at the oldest running transaction."""
        async with self.db.system_transaction() as conn:
            rows = await conn.fetch(_READ_ALL, str(after.transaction_id), after.position, after.version, limit)
            return [StoredEvent.from_row(r) for r in rows]

    async def current_version(self, stream_id: str, tenant_id: str | None = None) -> int:
        scope = self.db.transaction(tenant_id) if tenant_id is not None else self.db.system_transaction()
        async with scope as conn:
            return await conn.fetchval("SELECT coalesce(max(version), 0) FROM events WHERE stream_id = $1",
                                       stream_id)

    async def subscribe_all(self, after: Checkpoint = Checkpoint()) -> AsyncIterator[StoredEvent]:
        """Catch up from `after`, then follow live; never skips, never repeats.

        Polls every `poll_seconds` besides NOTIFY: an event held back by the fence
        is announced before it becomes readable.
        """
        checkpoint = after
        while True:
            mark = self.notifier.mark()
            while batch := await self.read_all(checkpoint):
                for event in batch:
                    checkpoint = event.checkpoint
                    yield event
            await self.notifier.wait(mark, self.poll_seconds)

    async def subscribe_stream(self, stream_id: str, after_version: int = 0,
                               tenant_id: str | None = None) -> AsyncIterator[StoredEvent]:
        """Catch up one stream from `after_version`, then follow it live.

        Per-stream versions are gapless, so no fence is needed: a NOTIFY naming this
        stream wakes the reader (appends to other streams do not), and a slow poll
        covers a lost notification.
        """
        version = after_version
        while True:
            mark = self.notifier.mark(stream_id)
            while batch := await self.read_stream(stream_id, version, tenant_id=tenant_id):
                for event in batch:
                    version = event.version
                    yield event
            await self.notifier.wait(mark, self.stream_poll_seconds, stream_id)

    async def close(self) -> None:
        await self.notifier.close()

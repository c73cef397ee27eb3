"""PostgreSQL event store: optimistic appends and gap-safe catch-up subscriptions.

Per-stream versions are gapless and unique: an append names the version it
expects, and a concurrent writer gets ``Conflict``, never a silent overwrite.

The global order is ``(transaction_id, position)``. A catch-up reader only reads
events whose writing transaction is older than the oldest transaction still
running (``pg_snapshot_xmin``), so an event whose transaction took an earlier
position but commits later is never skipped: the reader waits at the fence
until that transaction has committed or aborted.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from psycopg import AsyncConnection, errors
from psycopg.rows import dict_row

from libs.db import Database
from libs.db.notify import Notifier
from libs.errors import Conflict
from libs.events import Envelope

__all__ = ["ANY_VERSION", "Checkpoint", "EventStore", "StoredEvent"]

ANY_VERSION = -1
_APPEND = """
WITH current AS (SELECT coalesce(max(version), 0) AS version FROM events WHERE stream_id = %(stream)s),
inserted AS (
    INSERT INTO events (stream_id, version, event_id, event_type, schema_version, tenant_id, payload, metadata,
                        occurred_at)
    SELECT %(stream)s, current.version + e.ord, e.event_id, e.event_type, e.schema_version, e.tenant_id, e.payload,
           e.metadata, e.occurred_at
    FROM current, unnest(%(ids)s::uuid[], %(types)s::text[], %(versions)s::int[], %(tenants)s::text[],
                         %(payloads)s::text[], %(metas)s::jsonb[], %(times)s::timestamptz[])
                  WITH ORDINALITY AS e(event_id, event_type, schema_version, tenant_id, payload, metadata,
                                       occurred_at, ord)
    WHERE %(expected)s = -1 OR current.version = %(expected)s
    ORDER BY e.ord
    RETURNING version),
appended AS (SELECT max(version) AS version FROM inserted)
SELECT version, CASE WHEN version IS NOT NULL THEN pg_notify(%(channel)s, %(stream)s) END FROM appended
"""
# The text form of the transaction id is named `tx`, not `transaction_id`: ORDER BY prefers an output
# name over a column, and text order puts "1000" before "999".
_COLUMNS = ("position, transaction_id::text AS tx, stream_id, version, event_id::text AS event_id,"
            " event_type, schema_version, tenant_id, payload, metadata, occurred_at")


@dataclass(frozen=True, order=True)
class Checkpoint:
    """Where a catch-up reader stands in the global order."""

    transaction_id: int = 0
    position: int = 0

    def __str__(self) -> str:
        return f"{self.transaction_id}:{self.position}"

    @classmethod
    def parse(cls, text: str) -> Checkpoint:
        tx, _, pos = text.partition(":")
        return cls(int(tx), int(pos))


@dataclass(frozen=True)
class StoredEvent:
    stream_id: str
    version: int
    checkpoint: Checkpoint
    envelope: Envelope

    @classmethod
    def from_row(cls, row: dict) -> StoredEvent:
        meta = row["metadata"]
        envelope = Envelope(
            event_type=row["event_type"], tenant_id=row["tenant_id"], payload=row["payload"],
            event_id=row["event_id"], schema_version=row["schema_version"], occurred_at=row["occurred_at"],
            correlation_id=meta.get("correlation_id", ""), causation_id=meta.get("causation_id", ""),
            traceparent=meta.get("traceparent", ""),
        )
        return cls(row["stream_id"], row["version"], Checkpoint(int(row["tx"]), row["position"]),
                   envelope)


class EventStore:
    """The event store of one service schema; `channel` is its NOTIFY channel."""

    def __init__(self, db: Database, *, poll_seconds: float = 0.5, stream_poll_seconds: float = 5.0) -> None:
        self.db = db
        self.channel = f"mnemesh_events_{db.schema}"
        self.poll_seconds, self.stream_poll_seconds = poll_seconds, stream_poll_seconds
        self.notifier = Notifier(db.listen_connection, self.channel)

    async def append(
        self, conn: AsyncConnection, stream_id: str, expected_version: int, envelopes: Sequence[Envelope]
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
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"stream:{stream_id}"])
        params = {
            "stream": stream_id, "expected": expected_version, "channel": self.channel,
            "ids": [e.event_id for e in envelopes], "types": [e.event_type for e in envelopes],
            "versions": [e.schema_version for e in envelopes], "tenants": [e.tenant_id for e in envelopes],
            "payloads": [e.payload for e in envelopes], "times": [e.occurred_at for e in envelopes],
            "metas": [json.dumps({"correlation_id": e.correlation_id, "causation_id": e.causation_id,
                                  "traceparent": e.traceparent}) for e in envelopes],
        }
        try:
            cur = await conn.execute(_APPEND, params)
        except errors.UniqueViolation as exc:
            if exc.diag.constraint_name == "events_event_id_key":
                raise Conflict("an event with this event_id is already stored", field="event_id",
                               retryable=False, hint="event ids are unique; this append was already done") from None
            moved = "another writer appended at the same time" if expected_version == ANY_VERSION else \
                f"moved past version {expected_version} while appending"
            raise Conflict(f"stream {stream_id}: {moved}", field="expected_version",
                           hint="read the stream again and retry") from None
        new_version = (await cur.fetchone())[0]
        if new_version is None:  # the stream was not at the expected version: nothing was inserted
            cur = await conn.execute("SELECT coalesce(max(version), 0) FROM events WHERE stream_id = %s", [stream_id])
            current = (await cur.fetchone())[0]
            raise Conflict(f"stream {stream_id} is at version {current}, not {expected_version}",
                           field="expected_version", hint="read the stream again and retry on the new version")
        return new_version

    async def read_stream(self, stream_id: str, after_version: int = 0, limit: int = 1000,
                          tenant_id: str | None = None) -> list[StoredEvent]:
        """One stream's events after `after_version`; with `tenant_id`, only that tenant's."""
        tenant_filter = "" if tenant_id is None else " AND tenant_id = %(tenant)s"
        async with self.db.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                f"SELECT {_COLUMNS} FROM events WHERE stream_id = %(stream)s AND version > %(after)s{tenant_filter}"
                " ORDER BY version LIMIT %(limit)s",
                {"stream": stream_id, "after": after_version, "limit": limit, "tenant": tenant_id},
            )
            return [StoredEvent.from_row(r) for r in await cur.fetchall()]

    async def read_all(self, after: Checkpoint = Checkpoint(), limit: int = 1000) -> list[StoredEvent]:
        """Events after `after` in global order, stopping at the oldest running transaction."""
        async with self.db.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                f"SELECT {_COLUMNS} FROM events"
                " WHERE (transaction_id, position) > (%s::text::xid8, %s)"
                "   AND transaction_id < pg_snapshot_xmin(pg_current_snapshot())"
                " ORDER BY events.transaction_id, events.position LIMIT %s",
                [str(after.transaction_id), after.position, limit],
            )
            return [StoredEvent.from_row(r) for r in await cur.fetchall()]

    async def current_version(self, stream_id: str) -> int:
        async with self.db.connection() as conn:
            cur = await conn.execute("SELECT coalesce(max(version), 0) FROM events WHERE stream_id = %s",
                                     [stream_id])
            return (await cur.fetchone())[0]

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

        Per-stream versions are gapless, so no fence is needed: NOTIFY wakes the
        reader, and a slow poll covers a lost notification.
        """
        version = after_version
        while True:
            mark = self.notifier.mark()
            while batch := await self.read_stream(stream_id, version, tenant_id=tenant_id):
                for event in batch:
                    version = event.version
                    yield event
            await self.notifier.wait(mark, self.stream_poll_seconds)

    async def close(self) -> None:
        await self.notifier.close()

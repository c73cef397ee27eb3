"""The PostgreSQL unit of work: memory rows, the event store and the outbox in one transaction.

The unit acts as one tenant (row-level security): the tenant of its first call, set with
SET LOCAL for the rest of the transaction; a call for another tenant is refused.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import datetime, timedelta

import asyncpg

from libs.crypto import open_sealed, seal
from libs.db import Database, act_as, rowcount
from libs.events import Envelope
from libs.eventstore import EventStore
from libs.outbox import Outbox
from services.memory_writer.adapters.keys import KeyRing
from services.memory_writer.adapters.mapping import event_to_proto
from services.memory_writer.domain import (
    Confidence,
    DomainEvent,
    Layer,
    MemoryRecord,
    MemoryWritten,
    Source,
    Status,
)
from services.memory_writer.domain.similarity import bands

__all__ = ["PostgresUnitOfWork"]

_INSERT = (
    "INSERT INTO memories (memory_id, tenant_id, user_id, session_id, layer, source, content, key, confidence,"
    " engagement, tags, derived_from, step_id, attributes, created_at, expires_at, idempotency_key, request_hash,"
    " status, written_by, reason, sensitive_kind, sealed, content_hmac, sensitive_hashes, quarantine_reasons,"
    " content_digest, minhash, near_duplicate_of)"
    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21,"
    " $22, $23, $24, $25, $26, $27, $28, $29::uuid)"
    " ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING"
)


def _record(row: asyncpg.Record) -> MemoryRecord:
    return MemoryRecord(
        memory_id=str(row["memory_id"]), tenant_id=row["tenant_id"], user_id=row["user_id"],
        session_id=row["session_id"], layer=Layer(row["layer"]), source=Source(row["source"]),
        content=row["content"], key=row["key"], confidence=Confidence(row["confidence"]), tags=tuple(row["tags"]),
        derived_from=tuple(row["derived_from"]), step_id=row["step_id"], created_at=row["created_at"],
        expires_at=row["expires_at"], idempotency_key=row["idempotency_key"] or "", attributes=row["attributes"],
        engagement=row["engagement"], request_hash=row["request_hash"] or "", status=Status(row["status"]),
        superseded_by=str(row["superseded_by"] or ""), changed_at=row["changed_at"], written_by=row["written_by"],
        reason=row["reason"], sensitive_kind=row["sensitive_kind"],
        redacted=row["content"] if row["sensitive_kind"] else "", sealed=row["sealed"] or b"",
        content_hmac=row["content_hmac"], sensitive_hashes=tuple(row["sensitive_hashes"]),
        quarantine_reasons=tuple(row["quarantine_reasons"]), content_digest=row["content_digest"],
        minhash=tuple(row["minhash"] or ()), near_duplicate_of=str(row["near_duplicate_of"] or ""),
        merged_count=row["merged_count"],
    )


def _aad(record: MemoryRecord) -> bytes:
    return f"mnemesh/memory/{record.tenant_id}/{record.user_id}/{record.memory_id}".encode()


class PostgresUnitOfWork:
    """A new unit per command. With `conn`, it joins that connection's transaction (stream handlers,
    whose processed-event row must commit with the effect); otherwise it takes a pooled connection."""

    def __init__(self, db: Database, store: EventStore, outbox: Outbox, keys: KeyRing, *,
                 conn: asyncpg.Connection | None = None, causation: Envelope | None = None) -> None:
        self.db, self.store, self.outbox, self.keys = db, store, outbox, keys
        self._user_keys: dict[str, bytes] = {}  # this unit's user data keys; never kept beyond it
        self._sealed: dict[str, bytes] = {}
        self._outer, self.causation = conn, causation
        self._conn: asyncpg.Connection | None = None
        self._tenant: str | None = None
        self._cm = self._tx = None

    async def __aenter__(self) -> PostgresUnitOfWork:
        if self._outer is not None:
            self._conn = self._outer
        else:
            self._cm = self.db.connection()
            self._conn = await self._cm.__aenter__()
        self._tx = self._conn.transaction()  # a savepoint when joining an outer transaction
        await self._tx.start()
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                await self._tx.commit()
            else:
                await self._tx.rollback()
        finally:
            if self._cm is not None:
                await self._cm.__aexit__(exc_type, exc, tb)

    async def _as(self, tenant_id: str) -> asyncpg.Connection:
        """The connection, acting as `tenant_id` (set once per unit)."""
        assert self._conn is not None, "use the unit of work in `async with`"
        if self._tenant is None:
            await act_as(self._conn, tenant_id)
            self._tenant = tenant_id
        elif self._tenant != tenant_id:
            raise ValueError(f"this unit of work acts for tenant {self._tenant!r}, not {tenant_id!r}")
        return self._conn

    async def _one(self, tenant_id: str, query: str, *args: object) -> MemoryRecord | None:
        row = await (await self._as(tenant_id)).fetchrow(query, *args)
        return _record(row) if row else None

    async def find_by_idempotency_key(self, tenant_id: str, key: str) -> MemoryRecord | None:
        return await self._one(tenant_id, "SELECT * FROM memories WHERE tenant_id = $1 AND idempotency_key = $2",
                               tenant_id, key)

    async def get(self, tenant_id: str, memory_id: str) -> MemoryRecord | None:
        return await self._one(tenant_id, "SELECT * FROM memories WHERE tenant_id = $1 AND memory_id::text = $2",
                               tenant_id, memory_id)

    async def _user_key(self, tenant_id: str, user_id: str, *, create: bool) -> bytes:
        if user_id not in self._user_keys:
            self._user_keys[user_id] = await self.keys.user_key(await self._as(tenant_id), tenant_id, user_id,
                                                                create=create)
        return self._user_keys[user_id]

    async def add(self, record: MemoryRecord) -> bool:
        conn = await self._as(record.tenant_id)
        content, sealed = record.content, None
        if record.sensitive_kind:  # the plaintext is sealed here; only the redacted text is stored in clear
            key = await self._user_key(record.tenant_id, record.user_id, create=True)
            content, sealed = record.redacted, seal(key, record.content.encode(), _aad(record))
            self._sealed[record.memory_id] = sealed
        status = await conn.execute(
            _INSERT, record.memory_id, record.tenant_id, record.user_id, record.session_id, int(record.layer),
            int(record.source), content, record.key, int(record.confidence), record.engagement,
            list(record.tags), list(record.derived_from), record.step_id, record.attributes, record.created_at,
            record.expires_at, record.idempotency_key or None, record.request_hash or None, int(record.status),
            record.written_by, record.reason, record.sensitive_kind, sealed, record.content_hmac,
            list(record.sensitive_hashes), list(record.quarantine_reasons), record.content_digest,
            list(record.minhash) or None, record.near_duplicate_of or None)
        if rowcount(status) != 1:
            return False
        if record.minhash and record.status is not Status.QUARANTINED:
            await conn.execute(
                "INSERT INTO memory_buckets (tenant_id, user_id, layer, bucket, memory_id)"
                " SELECT $1, $2, $3, b, $4::uuid FROM unnest($5::text[]) AS b ON CONFLICT DO NOTHING",
                record.tenant_id, record.user_id, int(record.layer), record.memory_id, bands(list(record.minhash)))
        return True

    async def find_identical(self, tenant_id: str, user_id: str, layer: int, digest: str) -> MemoryRecord | None:
        return await self._one(tenant_id, "SELECT * FROM memories WHERE tenant_id = $1 AND user_id = $2 AND layer = $3"
                               " AND content_digest = $4 AND status = 1 ORDER BY created_at LIMIT 1 FOR UPDATE",
                               tenant_id, user_id, layer, digest)

    async def merge_into(self, kept: MemoryRecord) -> None:
        await (await self._as(kept.tenant_id)).execute(
            "UPDATE memories SET engagement = $3, merged_count = $4, tags = $5, derived_from = $6"
            " WHERE tenant_id = $1 AND memory_id = $2::uuid", kept.tenant_id, kept.memory_id, kept.engagement,
            kept.merged_count, list(kept.tags), list(kept.derived_from))

    async def near_candidates(self, tenant_id: str, user_id: str, layer: int,
                              buckets: list[str]) -> list[tuple[str, list[int]]]:
        rows = await (await self._as(tenant_id)).fetch(
            "SELECT DISTINCT m.memory_id::text AS id, m.minhash FROM memory_buckets b JOIN memories m USING (memory_id)"
            " WHERE b.tenant_id = $1 AND b.user_id = $2 AND b.layer = $3 AND b.bucket = ANY($4::text[])"
            " AND m.status = 1 LIMIT 50", tenant_id, user_id, layer, buckets)
        return [(row["id"], list(row["minhash"])) for row in rows]

    async def recent_writes(self, tenant_id: str, user_id: str, since: datetime) -> int:
        return await (await self._as(tenant_id)).fetchval(
            "SELECT count(*) FROM memories WHERE tenant_id = $1 AND user_id = $2 AND created_at >= $3",
            tenant_id, user_id, since)

    async def quarantined(self, tenant_id: str, user_id: str, limit: int) -> list[MemoryRecord]:
        rows = await (await self._as(tenant_id)).fetch(
            "SELECT * FROM memories WHERE tenant_id = $1 AND status = 4 AND ($2 = '' OR user_id = $2)"
            " ORDER BY created_at, memory_id LIMIT $3", tenant_id, user_id, limit)
        return [_record(row) for row in rows]

    async def take_expired(self, tenant_id: str, now: datetime, limit: int) -> list[str]:
        rows = await (await self._as(tenant_id)).fetch(
            "DELETE FROM memories WHERE memory_id IN (SELECT memory_id FROM memories WHERE tenant_id = $1"
            " AND expires_at <= $2 ORDER BY expires_at LIMIT $3 FOR UPDATE SKIP LOCKED) RETURNING memory_id::text",
            tenant_id, now, limit)
        return [row[0] for row in rows]

    async def archive_idle(self, tenant_id: str, idle_since: datetime, limit: int) -> list[str]:
        rows = await (await self._as(tenant_id)).fetch(
            "UPDATE memories SET status = 5, changed_at = now() WHERE memory_id IN (SELECT memory_id FROM memories"
            " WHERE tenant_id = $1 AND status = 1 AND coalesce(last_accessed_at, created_at) < $2 LIMIT $3"
            " FOR UPDATE SKIP LOCKED) RETURNING memory_id::text", tenant_id, idle_since, limit)
        return [row[0] for row in rows]

    async def touch(self, tenant_id: str, memory_ids: list[str], at: datetime, half_life: timedelta) -> int:
        # engagement * 0.5^(elapsed / half-life) + 1, in one statement (decay, then the access).
        status = await (await self._as(tenant_id)).execute(
            "UPDATE memories SET engagement = engagement * power(0.5, greatest(0, extract(epoch FROM"
            " ($3 - coalesce(engagement_at, created_at)))) / $4) + 1, engagement_at = $3,"
            " last_accessed_at = greatest(coalesce(last_accessed_at, $3), $3),"
            " status = CASE WHEN status = 5 AND key = '' THEN 1 ELSE status END"  # keyed: a newer value may be current
            " WHERE tenant_id = $1 AND memory_id::text = ANY($2::text[])",
            tenant_id, memory_ids, at, half_life.total_seconds())
        return rowcount(status)

    async def uncovered_turns(self, tenant_id: str, user_id: str, session_id: str) -> list[MemoryRecord]:
        rows = await (await self._as(tenant_id)).fetch(
            "SELECT * FROM memories m WHERE tenant_id = $1 AND user_id = $2 AND session_id = $3 AND layer = 1"
            " AND status = 1 AND NOT EXISTS (SELECT 1 FROM memories s WHERE s.tenant_id = $1 AND s.user_id = $2"
            " AND s.session_id = $3 AND 'summary' = ANY(s.tags) AND m.memory_id::text = ANY(s.derived_from))"
            " ORDER BY created_at, memory_id", tenant_id, user_id, session_id)
        return [_record(row) for row in rows]

    async def keyed_hash(self, tenant_id: str, value: str) -> str:
        return await self.keys.keyed_hash(await self._as(tenant_id), tenant_id, value)

    async def reveal(self, record: MemoryRecord) -> str:
        key = await self._user_key(record.tenant_id, record.user_id, create=False)
        return open_sealed(key, record.sealed, _aad(record)).decode()

    async def shred_user_key(self, tenant_id: str, user_id: str) -> bool:
        self._user_keys.pop(user_id, None)
        return await self.keys.shred(await self._as(tenant_id), tenant_id, user_id)

    async def rotate_tenant_key(self, tenant_id: str) -> tuple[int, int]:
        return await self.keys.rotate_tenant(await self._as(tenant_id), tenant_id)

    @contextlib.asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        assert self._conn is not None, "use the unit of work in `async with`"
        async with self._conn.transaction():
            yield

    async def entity_schemas(self, tenant_id: str, keys: set[str]) -> dict[str, dict]:
        conn = await self._as(tenant_id)
        if not keys:
            return {}
        rows = await conn.fetch("SELECT key, schema FROM entity_schemas WHERE tenant_id = $1 AND key = ANY($2::text[])",
                                tenant_id, sorted(keys))
        return {row["key"]: row["schema"] for row in rows}

    async def put_entity_schema(self, tenant_id: str, key: str, schema: dict) -> None:
        await (await self._as(tenant_id)).execute(
            "INSERT INTO entity_schemas (tenant_id, key, schema) VALUES ($1, $2, $3) ON CONFLICT (tenant_id, key)"
            " DO UPDATE SET schema = excluded.schema, updated_at = now()", tenant_id, key, schema)

    async def current_of(self, tenant_id: str, user_id: str, key: str) -> MemoryRecord | None:
        conn = await self._as(tenant_id)
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"memory-key:{tenant_id}:{user_id}:{key}")
        return await self._one(tenant_id, "SELECT * FROM memories WHERE tenant_id = $1 AND user_id = $2 AND key = $3"
                                          " AND status = 1", tenant_id, user_id, key)

    async def supersede(self, tenant_id: str, memory_id: str, by: str, at: datetime) -> None:
        await (await self._as(tenant_id)).execute(
            "UPDATE memories SET status = 3, superseded_by = $3::uuid, changed_at = $4"
            " WHERE tenant_id = $1 AND memory_id = $2::uuid", tenant_id, memory_id, by, at)

    async def update(self, record: MemoryRecord) -> None:
        await (await self._as(record.tenant_id)).execute(
            "UPDATE memories SET confidence = $3, status = $4, expires_at = $5, changed_at = $6, reason = $7,"
            " quarantine_reasons = $8 WHERE tenant_id = $1 AND memory_id = $2::uuid", record.tenant_id,
            record.memory_id, int(record.confidence), int(record.status), record.expires_at, record.changed_at,
            record.reason, list(record.quarantine_reasons))

    async def history(self, tenant_id: str, user_id: str, key: str) -> list[MemoryRecord]:
        rows = await (await self._as(tenant_id)).fetch(
            "SELECT * FROM memories WHERE tenant_id = $1 AND user_id = $2 AND key = $3 ORDER BY created_at, memory_id",
            tenant_id, user_id, key)
        return [_record(row) for row in rows]

    async def delete(self, tenant_id: str, memory_ids: list[str]) -> list[str]:
        rows = await (await self._as(tenant_id)).fetch(
            "DELETE FROM memories WHERE tenant_id = $1 AND memory_id::text = ANY($2::text[]) RETURNING memory_id::text",
            tenant_id, memory_ids)
        return [row[0] for row in rows]

    async def ids_of_user(self, tenant_id: str, user_id: str) -> list[str]:
        rows = await (await self._as(tenant_id)).fetch(
            "SELECT memory_id::text FROM memories WHERE tenant_id = $1 AND user_id = $2", tenant_id, user_id)
        return [row[0] for row in rows]

    async def record(self, stream_id: str, expected_version: int, event: DomainEvent) -> int:
        if isinstance(event, MemoryWritten) and event.record.sensitive_kind:  # announced sealed, never in clear
            event = MemoryWritten(replace(event.record, sealed=self._sealed.get(event.record.memory_id,
                                                                                 event.record.sealed)))
        event_type, payload = event_to_proto(event)
        tenant_id = payload.memory.tenant.tenant_id if event_type == "memory.written" else payload.tenant.tenant_id
        envelope = Envelope.wrap(payload, event_type=event_type, tenant_id=tenant_id, causation=self.causation)
        conn = await self._as(tenant_id)
        version = await self.store.append(conn, stream_id, expected_version, [envelope])
        await self.outbox.add(conn, envelope)
        return version

"""The PostgreSQL unit of work: memory rows, the event store and the outbox in one transaction.

The unit acts as one tenant (row-level security): the tenant of its first call, set with
SET LOCAL for the rest of the transaction; a call for another tenant is refused.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import datetime, timedelta

import asyncpg

from libs.crypto import open_sealed, seal
from libs.db import Database, act_as, rowcount
from libs.errors import Busy
from libs.events import Envelope
from libs.eventstore import EventStore
from libs.outbox import Outbox
from services.memory_writer.adapters.batched import BatchBuffer
from services.memory_writer.adapters.keys import KeyRing, keyed, keys_lock
from services.memory_writer.adapters.event_json import (
    PERSONAL_EVENTS,
    PERSONAL_FIELDS,
    SUBJECT_EVENTS,
    UNPUBLISHED_FIELDS,
    written_payload,
)
from services.memory_writer.adapters.mapping import event_to_proto
from services.memory_writer.adapters.rows import INSERT as _INSERT
from services.memory_writer.adapters.rows import (
    BY_IDEMPOTENCY_KEY,
    CURRENT,
    MERGED_KEY,
    by_idempotency_key,
    digest_lock,
    insert_args,
    key_lock,
)
from services.memory_writer.adapters.rows import record_of as _record
from services.memory_writer.domain import (
    DomainEvent,
    MemoryRecord,
    MemoryWritten,
)
from services.memory_writer.domain.similarity import lsh_key
from services.memory_writer.service_layer.unit_of_work import Lookups

__all__ = ["PostgresUnitOfWork"]

_HOLD_RETRY_S = 0.05
_ON_CONFLICT = " ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING"


def _aad(record: MemoryRecord) -> bytes:
    return f"mnemesh/memory/{record.tenant_id}/{record.user_id}/{record.memory_id}".encode()


def _fields_aad(envelope: Envelope, user_id: str) -> bytes:
    """What a stored event's sealed fields are bound to: that very event of that user."""
    return f"mnemesh/event/{envelope.tenant_id}/{user_id}/{envelope.event_id}".encode()


class PostgresUnitOfWork:
    """A new unit per command. With `conn`, it joins that connection's transaction (stream handlers,
    whose processed-event row must commit with the effect); otherwise it takes a pooled connection."""

    def __init__(self, db: Database, store: EventStore, outbox: Outbox, keys: KeyRing, *,
                 conn: asyncpg.Connection | None = None, causation: Envelope | None = None,
                 hold_wait: float = 5.0) -> None:
        """`hold_wait`: how long hold_keys tries while a forget holds the keys, before Busy."""
        self.db, self.store, self.outbox, self.keys = db, store, outbox, keys
        self.hold_wait = hold_wait
        self._user_keys: dict[str, bytes] = {}  # this unit's user data keys; never kept beyond it
        self._sealed: dict[str, bytes] = {}
        self._search_key: bytes | None = None
        self._held: set[str] = set()  # keys locks this unit holds (keys.hold)
        self._batch: BatchBuffer | None = None  # batch mode (prefetch .. flush)
        self._outer, self.causation = conn, causation
        self._conn: asyncpg.Connection | None = None
        self._tenant: str | None = None
        self._cm = self._tx = None

    async def __aenter__(self) -> PostgresUnitOfWork:
        # A unit may be entered again (a batch rerun write by write): nothing held or read in an attempt that
        # rolled back is trusted (its keys locks went with it).
        self._held.clear()
        self._user_keys.clear()
        self._sealed.clear()
        self._search_key = None
        self._tenant = None  # stated again in this transaction (or savepoint)
        if self._outer is not None:
            self._conn = self._outer
        else:
            self._cm = self.db.connection()
            self._conn = await self._cm.__aenter__()
        self._tx = self._conn.transaction()  # a savepoint when joining an outer transaction
        await self._tx.start()
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        self._batch = None
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

    async def hold_keys(self, tenant_id: str, user_ids: list[str]) -> None:
        wanted = [lock for lock in [keys_lock(tenant_id), *(keys_lock(tenant_id, u) for u in user_ids)]
                  if lock not in self._held]
        if not wanted:
            return
        assert self._conn is not None, "use the unit of work in `async with`"
        if self._tenant is None:  # the unit's first statement: it states the tenant too (see _as)
            held = await self.keys.hold(self._conn, wanted, acting_as=tenant_id)
            self._tenant = tenant_id
        else:
            held = await self.keys.hold(await self._as(tenant_id), wanted)
        deadline = time.monotonic() + self.hold_wait
        # Never blocked on the lock itself (see adapters/keys.py); a forget is short: tried again meanwhile.
        while not held:
            if time.monotonic() >= deadline:
                whose = f"tenant {tenant_id!r}" + (f" (user {user_ids[0]!r})" if len(user_ids) == 1 else "")
                raise Busy(f"a forget is destroying keys of {whose} that this write needs", field="tenant.user_id",
                           hint="retry in a moment: the write then starts afresh, under new keys")
            await asyncio.sleep(_HOLD_RETRY_S)
            held = await self.keys.hold(self._conn, wanted)
        self._held.update(wanted)

    async def _one(self, tenant_id: str, query: str, *args: object) -> MemoryRecord | None:
        row = await (await self._as(tenant_id)).fetchrow(query, *args)
        return _record(row) if row else None

    async def prefetch(self, tenant_id: str, lookups: Lookups) -> None:
        conn = await self._as(tenant_id)
        buffer = BatchBuffer(tenant_id)
        # Held already when the handler held its users first (writes._batch): then no statement at all.
        await self.hold_keys(tenant_id, sorted(lookups.sealing))
        await buffer.load(conn, lookups)
        if wanted := sorted(lookups.sealing - set(self._user_keys)):
            self._user_keys.update(await self.keys.user_keys(conn, tenant_id, wanted))
        self._batch = buffer

    async def flush(self) -> None:
        buffer, self._batch = self._batch, None
        if buffer is not None:
            await buffer.flush(await self._as(buffer.tenant_id), self.store, self.outbox)

    async def find_by_idempotency_key(self, tenant_id: str, key: str) -> MemoryRecord | None:
        if self._batch is not None:
            return self._batch.by_idempotency.get(key)
        row = await (await self._as(tenant_id)).fetchrow(BY_IDEMPOTENCY_KEY + " LIMIT 1", tenant_id, [key])
        return by_idempotency_key(row) if row else None

    async def add_merged_key(self, tenant_id: str, idempotency_key: str, memory_id: str, request_hash: str) -> None:
        if self._batch is not None:
            self._batch.add_merged_key(idempotency_key, memory_id, request_hash)
            return
        await (await self._as(tenant_id)).execute(MERGED_KEY, tenant_id, idempotency_key, memory_id, request_hash)

    async def get(self, tenant_id: str, memory_id: str) -> MemoryRecord | None:
        return await self._one(tenant_id, "SELECT * FROM memories WHERE tenant_id = $1"
                               " AND memory_id = $2::uuid", tenant_id, memory_id)

    async def _user_key(self, tenant_id: str, user_id: str, *, create: bool) -> bytes:
        if user_id not in self._user_keys:
            await self.hold_keys(tenant_id, [user_id])
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
        if self._batch is not None:
            self._batch.add(record, content, sealed)
            return True
        status = await conn.execute(_INSERT + _ON_CONFLICT, *insert_args(record, content, sealed))
        if rowcount(status) != 1:
            return False
        return True

    async def find_identical(self, tenant_id: str, user_id: str, layer: int, digest: str) -> MemoryRecord | None:
        if self._batch is not None:  # locked and read by prefetch
            return self._batch.identical.get((user_id, layer, digest))
        await (await self._as(tenant_id)).execute("SELECT pg_advisory_xact_lock(hashtext($1))",
                                                  digest_lock(tenant_id, user_id, layer, digest))
        return await self._one(tenant_id, "SELECT * FROM memories WHERE tenant_id = $1 AND user_id = $2 AND layer = $3"
                               f" AND content_digest = $4 AND {CURRENT} ORDER BY created_at LIMIT 1 FOR UPDATE",
                               tenant_id, user_id, layer, digest)

    async def merge_into(self, kept: MemoryRecord) -> None:
        if self._batch is not None:
            self._batch.merge_into(kept)
            return
        await (await self._as(kept.tenant_id)).execute(
            "UPDATE memories SET engagement = $3, merged_count = $4, tags = $5, derived_from = $6"
            " WHERE tenant_id = $1 AND memory_id = $2::uuid", kept.tenant_id, kept.memory_id, kept.engagement,
            kept.merged_count, list(kept.tags), list(kept.derived_from))

    async def near_candidates(self, tenant_id: str, user_id: str, layer: int,
                              buckets: list[str]) -> list[tuple[str, list[int]]]:
        if self._batch is not None:
            return self._batch.near_candidates(user_id, layer, buckets)
        keys = [lsh_key(user_id, layer, b) for b in buckets]
        rows = await (await self._as(tenant_id)).fetch(
            "SELECT memory_id::text AS id, minhash FROM memories WHERE tenant_id = $1 AND user_id = $2 AND layer = $3"
            f" AND {CURRENT} AND lsh && $4::bigint[] LIMIT 50", tenant_id, user_id, layer, keys)
        return [(row["id"], list(row["minhash"])) for row in rows]

    async def recent_writes(self, tenant_id: str, user_id: str, since: datetime) -> int:
        if self._batch is not None:
            return self._batch.recent.get(user_id, 0)
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
            " WHERE tenant_id = $1 AND memory_id = ANY($2::uuid[])",
            tenant_id, memory_ids, at, half_life.total_seconds())
        return rowcount(status)

    async def uncovered_turns(self, tenant_id: str, user_id: str, session_id: str) -> list[MemoryRecord]:
        rows = await (await self._as(tenant_id)).fetch(
            "SELECT * FROM memories m WHERE tenant_id = $1 AND user_id = $2 AND session_id = $3 AND layer = 1"
            f" AND {CURRENT} AND NOT EXISTS (SELECT 1 FROM memories s WHERE s.tenant_id = $1 AND s.user_id = $2"
            " AND s.session_id = $3 AND 'summary' = ANY(s.tags) AND m.memory_id::text = ANY(s.derived_from))"
            " ORDER BY created_at, memory_id", tenant_id, user_id, session_id)
        return [_record(row) for row in rows]

    async def keyed_hash(self, tenant_id: str, value: str) -> str:
        if self._search_key is None:  # read once per unit (the search key outlives tenant key rotations)
            await self.hold_keys(tenant_id, [])
            self._search_key = await self.keys.search_key(await self._as(tenant_id), tenant_id)
        return keyed(self._search_key, value)

    async def reveal(self, record: MemoryRecord) -> str:
        key = await self._user_key(record.tenant_id, record.user_id, create=False)
        return open_sealed(key, record.sealed, _aad(record)).decode()

    async def shred_user_key(self, tenant_id: str, user_id: str) -> bool:
        self._user_keys.pop(user_id, None)
        return await self.keys.shred(await self._as(tenant_id), tenant_id, user_id)

    async def shred_tenant_keys(self, tenant_id: str) -> int:
        self._user_keys.clear()
        self._search_key = None
        return await self.keys.shred_tenant(await self._as(tenant_id), tenant_id)

    async def rotate_tenant_key(self, tenant_id: str) -> tuple[int, int]:
        return await self.keys.rotate_tenant(await self._as(tenant_id), tenant_id)

    @contextlib.asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        assert self._conn is not None, "use the unit of work in `async with`"
        try:
            async with self._conn.transaction():
                yield
        except BaseException:
            # Rolled back: keys locks taken inside it went with it; hold (and read) keys again when needed.
            self._held.clear()
            self._user_keys.clear()
            self._search_key = None
            raise

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

    async def contacts_policy(self, tenant_id: str) -> bool | None:
        return await (await self._as(tenant_id)).fetchval(
            "SELECT contacts_sensitive FROM tenant_policies WHERE tenant_id = $1", tenant_id)

    async def put_contacts_policy(self, tenant_id: str, sensitive: bool | None, by: str) -> None:
        conn = await self._as(tenant_id)
        if sensitive is None:
            await conn.execute("DELETE FROM tenant_policies WHERE tenant_id = $1", tenant_id)
            return
        await conn.execute(
            "INSERT INTO tenant_policies (tenant_id, contacts_sensitive, updated_by) VALUES ($1, $2, $3)"
            " ON CONFLICT (tenant_id) DO UPDATE SET contacts_sensitive = excluded.contacts_sensitive,"
            " updated_by = excluded.updated_by, updated_at = now()", tenant_id, sensitive, by)

    async def current_of(self, tenant_id: str, user_id: str, key: str) -> MemoryRecord | None:
        if self._batch is not None:  # locked and read by prefetch
            return self._batch.current.get((user_id, key))
        conn = await self._as(tenant_id)
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", key_lock(tenant_id, user_id, key))
        return await self._one(tenant_id, "SELECT * FROM memories WHERE tenant_id = $1 AND user_id = $2 AND key = $3"
                                          f" AND key <> '' AND {CURRENT}", tenant_id, user_id, key)

    async def supersede(self, tenant_id: str, memory_id: str, by: str, at: datetime) -> None:
        if self._batch is not None:
            self._batch.supersede(memory_id, by, at)
            return
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
            "DELETE FROM memories WHERE tenant_id = $1 AND memory_id = ANY($2::uuid[])"
            " RETURNING memory_id::text",
            tenant_id, memory_ids)
        return [row[0] for row in rows]

    async def delete_tenant(self, tenant_id: str) -> dict[str, list[str]]:
        conn = await self._as(tenant_id)
        rows = await conn.fetch("DELETE FROM memories WHERE tenant_id = $1 RETURNING user_id, memory_id::text",
                                tenant_id)  # their LSH buckets and merged keys go with them (ON DELETE CASCADE)
        await conn.execute("DELETE FROM entity_schemas WHERE tenant_id = $1", tenant_id)
        await conn.execute("DELETE FROM tenant_policies WHERE tenant_id = $1", tenant_id)
        removed: dict[str, list[str]] = {}
        for row in rows:
            removed.setdefault(row["user_id"], []).append(row["memory_id"])
        return removed

    async def ids_of_user(self, tenant_id: str, user_id: str) -> list[str]:
        rows = await (await self._as(tenant_id)).fetch(
            "SELECT memory_id::text FROM memories WHERE tenant_id = $1 AND user_id = $2", tenant_id, user_id)
        return [row[0] for row in rows]

    async def record(self, stream_id: str, expected_version: int, event: DomainEvent) -> int:
        if isinstance(event, MemoryWritten) and event.record.sensitive_kind:  # announced sealed, never in clear
            event = MemoryWritten(replace(event.record, sealed=self._sealed.get(event.record.memory_id,
                                                                                 event.record.sealed)))
        js = written_payload(event.record) if isinstance(event, MemoryWritten) else None
        if js is not None:  # the hot path: printed directly, as protobuf would
            tenant_id = event.record.tenant_id
            envelope = Envelope.wrap_json(json.dumps(js), event_type="memory.written", tenant_id=tenant_id,
                                          causation=self.causation)
        else:
            event_type, payload = event_to_proto(event)
            tenant_id = payload.memory.tenant.tenant_id if event_type == "memory.written" else payload.tenant.tenant_id
            envelope = Envelope.wrap(payload, event_type=event_type, tenant_id=tenant_id, causation=self.causation)
        conn = await self._as(tenant_id)
        if isinstance(event, MemoryWritten):
            stored = await self._kept(envelope, event.record, js)
        elif envelope.event_type in PERSONAL_EVENTS:
            stored, envelope = await self._kept_fields(envelope, payload.tenant.user_id)
        else:
            stored = envelope
        if self._batch is not None:
            return await self._batch.record(conn, stream_id, expected_version, envelope, stored)
        version = await self.store.append(conn, stream_id, expected_version, [stored])
        await self.outbox.add(conn, envelope)
        return version

    async def _kept(self, envelope: Envelope, record: MemoryRecord, js: dict | None = None) -> Envelope:
        """The event store's copy of a memory.written: its content only sealed under the user's data key,
        so that once the user is forgotten (the key destroyed) the event log reveals nothing of it. The
        published copy (outbox, stream) keeps the content the read side indexes, for as long as the
        outbox keeps published rows (Forget removes the user's)."""
        # proto3 JSON: edited as such (cheaper than printing it again); `js`, when given, is the payload's object
        kept = {**js, "memory": dict(js["memory"])} if js is not None else json.loads(envelope.payload)
        if not record.sensitive_kind:  # a sensitive record's plaintext is sealed already
            key = await self._user_key(record.tenant_id, record.user_id, create=True)
            kept["memory"]["sealedContent"] = base64.b64encode(seal(key, record.content.encode(), _aad(record))).decode()
        kept["memory"].pop("content", None)
        personal = {name: kept["memory"].pop(name) for name in PERSONAL_FIELDS["memory.written"]
                    if kept["memory"].get(name)}
        if personal:
            await self._seal_fields(kept, personal, envelope, record.tenant_id, record.user_id)
        return dataclasses.replace(envelope, payload=json.dumps(kept, ensure_ascii=False))

    async def _kept_fields(self, envelope: Envelope, user_id: str) -> tuple[Envelope, Envelope]:
        """The event store's copy of an event with personal fields (PERSONAL_FIELDS), those only sealed, and
        its published copy, without the fields the read side has no use for (UNPUBLISHED_FIELDS)."""
        kept = json.loads(envelope.payload)
        personal = {name: kept.pop(name) for name in PERSONAL_FIELDS[envelope.event_type] if kept.get(name)}
        if not personal:
            return envelope, envelope
        published = {k: v for k, v in {**kept, **personal}.items() if k not in UNPUBLISHED_FIELDS}
        published = dataclasses.replace(envelope, payload=json.dumps(published, ensure_ascii=False))
        await self._seal_fields(kept, personal, envelope, envelope.tenant_id, user_id)
        return dataclasses.replace(envelope, payload=json.dumps(kept, ensure_ascii=False)), published

    async def _seal_fields(self, kept: dict, personal: dict, envelope: Envelope, tenant_id: str,
                           user_id: str) -> None:
        key = await self._user_key(tenant_id, user_id, create=True)
        blob = seal(key, json.dumps(personal, ensure_ascii=False).encode(), _fields_aad(envelope, user_id))
        kept["sealedFields"] = base64.b64encode(blob).decode()

    async def erase_sealed(self, tenant_id: str, memory_ids: list[str] | None) -> int:
        status = await (await self._as(tenant_id)).execute(
            "UPDATE events SET payload = ((payload::jsonb #- '{memory,sealedContent}' #- '{memory,sensitiveHashes}')"
            " - 'sealedFields')::text WHERE tenant_id = $1 AND ($2::text[] IS NULL OR stream_id = ANY($2::text[]))"
            " AND (payload LIKE '%\"sealed%' OR payload LIKE '%\"sensitiveHashes\"%')",
            tenant_id, None if memory_ids is None else [f"memory-{memory_id}" for memory_id in memory_ids])
        return rowcount(status)

    async def withhold_publication(self, tenant_id: str) -> None:
        await self.outbox.withhold(await self._as(tenant_id))

    async def purge_outbox(self, tenant_id: str, user_id: str, memory_ids: list[str], *,
                           whole_tenant: bool = False) -> int:
        """Delete the outbox rows (published or not) of events that carry personal data of `user_id` (a
        memory's content, tags, attributes), or of `memory_ids` when they are the event's subject (its
        memory.written and memory.merged: a correction or confirmation also tells the read side about
        another memory, and carries nothing personal as published); `whole_tenant`: of every user."""
        status = await (await self._as(tenant_id)).execute(
            "WITH candidates AS (SELECT id, fields->>'event_type' AS t, (fields->>'payload')::jsonb AS p FROM outbox"
            " WHERE tenant_id = $1 AND fields->>'event_type' = ANY($4::text[]))"
            " DELETE FROM outbox o USING candidates c WHERE o.id = c.id AND ($6"
            " OR ($2 <> '' AND coalesce(c.p #>> '{memory,tenant,userId}', c.p #>> '{tenant,userId}') = $2)"
            " OR (c.t = ANY($5::text[]) AND coalesce(c.p #>> '{memory,memoryId}', c.p->>'memoryId') = ANY($3::text[])))",
            tenant_id, user_id, memory_ids, sorted(PERSONAL_EVENTS), sorted(SUBJECT_EVENTS), whole_tenant)
        return rowcount(status)

"""Batch mode of the PostgreSQL unit of work: a batch's lookups in a few statements, its writes in a
constant number of statements at the end.

`load` reads at once what the batch's writes will look up (entity-key locks and current values,
idempotency keys, identical contents, near-duplicate candidates by LSH key, burst counts, user data keys); the writes then
run against this buffer, which answers their lookups (seeing the batch's own writes) and holds their
rows, updates, events and outbox entries back; `flush` writes them: superseded values, memory rows
(executemany), merges, one event-store append for every stream, one outbox insert.
A memory row is inserted without ON CONFLICT: a concurrent write under the same idempotency key
fails the flush, and the caller runs the batch again write by write.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime

import asyncpg

from libs.events import Envelope
from libs.eventstore import ANY_VERSION, EventStore
from libs.outbox import Outbox
from services.memory_writer.adapters.rows import (
    BY_IDEMPOTENCY_KEY,
    CURRENT,
    INSERT,
    MERGED_KEY,
    by_idempotency_key,
    digest_lock,
    insert_args,
    key_lock,
    record_of,
)
from services.memory_writer.domain import MemoryRecord, Status
from services.memory_writer.domain.similarity import bands
from services.memory_writer.service_layer.unit_of_work import Lookups

__all__ = ["BatchBuffer", "CANDIDATES", "CURRENT_VALUES", "IDENTICAL"]

NEAR_LIMIT = 50  # candidates per write, as near_candidates reads them

# The batch's lookups by user, one index lookup per user (not a scan of the tenant: see rows.CURRENT).
CURRENT_VALUES = (  # $2, $3: users and entity keys; LIMIT 1 (one current value a key) keeps it a lookup per key
    "SELECT m.* FROM unnest($2::text[], $3::text[]) AS q(u, k) CROSS JOIN LATERAL"
    " (SELECT * FROM memories WHERE tenant_id = $1 AND user_id = q.u AND key = q.k AND key <> ''"
    f" AND {CURRENT} LIMIT 1) m")
IDENTICAL = (  # $2, $3, $4: users, layers, digests; as find_identical: the oldest such memory, locked
    "SELECT m.* FROM unnest($2::text[], $3::smallint[], $4::text[]) AS q(u, l, d) CROSS JOIN LATERAL"
    " (SELECT * FROM memories WHERE tenant_id = $1 AND user_id = q.u AND layer = q.l"
    f" AND content_digest = q.d AND {CURRENT} ORDER BY created_at LIMIT 1 FOR UPDATE) m")
CANDIDATES = (  # $2, $3, $4: users, layers, LSH keys; $5: the limit; per user and layer, sharing a key
    "WITH q AS (SELECT u, l, array_agg(k) AS ks FROM unnest($2::text[], $3::smallint[], $4::bigint[])"
    " AS t(u, l, k) GROUP BY u, l) SELECT c.* FROM q CROSS JOIN LATERAL (SELECT memory_id::text AS id,"
    f" minhash, lsh FROM memories WHERE tenant_id = $1 AND user_id = q.u AND layer = q.l AND {CURRENT}"
    " AND lsh && q.ks LIMIT $5) c")


@dataclass
class _Stream:
    expected: int  # the version the stream was at before this batch
    envelopes: list[Envelope] = field(default_factory=list)


@dataclass
class BatchBuffer:
    tenant_id: str
    by_idempotency: dict[str, MemoryRecord] = field(default_factory=dict)
    current: dict[tuple[str, str], MemoryRecord] = field(default_factory=dict)
    identical: dict[tuple[str, int, str], MemoryRecord] = field(default_factory=dict)
    buckets: dict[tuple[str, int, str], dict[str, tuple[int, ...]]] = field(default_factory=dict)
    recent: dict[str, int] = field(default_factory=dict)
    inserts: dict[str, tuple[MemoryRecord, str, bytes | None]] = field(default_factory=dict)
    superseded: dict[str, tuple[str, datetime]] = field(default_factory=dict)
    merged: dict[str, MemoryRecord] = field(default_factory=dict)
    merged_keys: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (memory id, request hash)
    streams: dict[str, _Stream] = field(default_factory=dict)
    outbox: list[Envelope] = field(default_factory=list)

    async def load(self, conn: asyncpg.Connection, lookups: Lookups) -> None:
        tenant_id = self.tenant_id
        # current_of's and find_identical's locks, all in one order for every writer (no deadlock between
        # two batches; a batch isolated write by write takes them one at a time, and a deadlock it meets is
        # aborted by PostgreSQL and retried): a key's writes are serialised, and so are identical contents
        # across replicas.
        locks = [key_lock(tenant_id, u, k) for u, k in lookups.entity_keys] + \
            [digest_lock(tenant_id, u, layer, d) for u, layer, d in lookups.identical]
        if locks:
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext(k)) FROM (SELECT k FROM unnest($1::text[]) AS k ORDER BY k) s",
                sorted(locks))
        if lookups.entity_keys:
            users, keys = zip(*lookups.entity_keys, strict=True)
            for row in await conn.fetch(CURRENT_VALUES, tenant_id, list(users), list(keys)):
                self.current[(row["user_id"], row["key"])] = record_of(row)
        if lookups.idempotency_keys:
            for row in await conn.fetch(BY_IDEMPOTENCY_KEY, tenant_id, sorted(lookups.idempotency_keys)):
                self.by_idempotency[row["written_key"]] = by_idempotency_key(row)
        if lookups.identical:
            users, layers, digests = zip(*lookups.identical, strict=True)
            for row in await conn.fetch(IDENTICAL, tenant_id, list(users), list(layers), list(digests)):
                self.identical[(row["user_id"], row["layer"], row["content_digest"])] = record_of(row)
        if lookups.buckets:  # per user and layer, its memories sharing a bucket with the batch's (lsh_key)
            wanted = lookups.buckets
            users, layers, keys = zip(*((u, layer, key) for key, (u, layer, _) in wanted.items()), strict=True)
            for row in await conn.fetch(CANDIDATES, tenant_id, list(users), list(layers), list(keys),
                                        NEAR_LIMIT * 16):
                signature = tuple(row["minhash"])
                for key in wanted.keys() & row["lsh"]:
                    self.buckets.setdefault(wanted[key], {})[row["id"]] = signature
        if lookups.users:
            self.recent = dict.fromkeys(lookups.users, 0) | dict(await conn.fetch(
                "SELECT user_id, count(*) FROM memories WHERE tenant_id = $1 AND user_id = ANY($2::text[])"
                " AND created_at >= $3 GROUP BY user_id", tenant_id, sorted(lookups.users), lookups.since))

    def near_candidates(self, user_id: str, layer: int, buckets: list[str]) -> list[tuple[str, tuple[int, ...]]]:
        found: dict[str, tuple[int, ...]] = {}
        for bucket in buckets:
            for memory_id, signature in self.buckets.get((user_id, layer, bucket), {}).items():
                if len(found) >= NEAR_LIMIT:
                    break
                found.setdefault(memory_id, signature)
        return list(found.items())

    def add(self, record: MemoryRecord, content: str, sealed: bytes | None) -> None:
        self.inserts[record.memory_id] = (record, content, sealed)
        if record.idempotency_key:
            self.by_idempotency[record.idempotency_key] = record
        if record.key and record.status is Status.CURRENT:
            self.current[(record.user_id, record.key)] = record
        if record.status is Status.CURRENT and record.content_digest and not record.key:
            self.identical.setdefault((record.user_id, int(record.layer), record.content_digest), record)
        if record.minhash and record.status is not Status.QUARANTINED:
            for bucket in bands(list(record.minhash)):
                self.buckets.setdefault((record.user_id, int(record.layer), bucket), {})[record.memory_id] = \
                    record.minhash

    def supersede(self, memory_id: str, by: str, at: datetime) -> None:
        if memory_id in self.inserts:  # written earlier in this batch: its row goes in superseded (then updated)
            record, content, sealed = self.inserts[memory_id]
            self.inserts[memory_id] = (replace(record, status=Status.SUPERSEDED), content, sealed)
        self.superseded[memory_id] = (by, at)
        for key, record in list(self.current.items()):
            if record.memory_id == memory_id:
                del self.current[key]
        for key, record in list(self.identical.items()):
            if record.memory_id == memory_id:
                del self.identical[key]

    def merge_into(self, kept: MemoryRecord) -> None:
        for key, record in list(self.identical.items()):
            if record.memory_id == kept.memory_id:
                self.identical[key] = kept
        self.merged[kept.memory_id] = kept  # updated after the inserts: it may be a row of this batch

    def add_merged_key(self, idempotency_key: str, memory_id: str, request_hash: str) -> None:
        kept = next((r for r in self.identical.values() if r.memory_id == memory_id), None)
        if kept is not None:
            self.by_idempotency[idempotency_key] = replace(kept, request_hash=request_hash)
        self.merged_keys[idempotency_key] = (memory_id, request_hash)

    async def record(self, conn: asyncpg.Connection, stream_id: str, expected_version: int,
                     envelope: Envelope, stored: Envelope | None = None) -> int:
        """Hold `envelope` back for `stream_id` (`stored`: the event store's copy, if another); return the
        version it will have."""
        stream = self.streams.get(stream_id)
        if stream is None:
            if expected_version == ANY_VERSION:  # an existing memory (a merge): its stream is held from now on
                await EventStore.lock_stream(conn, stream_id)
                expected_version = await conn.fetchval(
                    "SELECT coalesce(max(version), 0) FROM events WHERE stream_id = $1", stream_id)
            stream = self.streams[stream_id] = _Stream(expected_version)
        elif expected_version not in (ANY_VERSION, stream.expected + len(stream.envelopes)):
            raise ValueError(f"stream {stream_id} is at version {stream.expected + len(stream.envelopes)} in this"
                             f" batch, not {expected_version}")
        stream.envelopes.append(stored or envelope)
        self.outbox.append(envelope)
        return stream.expected + len(stream.envelopes)

    async def flush(self, conn: asyncpg.Connection, store: EventStore, outbox: Outbox) -> None:
        tenant = self.tenant_id
        supersede = ("UPDATE memories SET status = 3, superseded_by = $3::uuid, changed_at = $4"
                     " WHERE tenant_id = $1 AND memory_id = $2::uuid")
        stored = [(tenant, m, by, at) for m, (by, at) in self.superseded.items() if m not in self.inserts]
        if stored:  # first: a key's new current value may only be inserted once the old one is not
            await conn.executemany(supersede, stored)
        if self.inserts:
            await conn.executemany(INSERT, [insert_args(*row) for row in self.inserts.values()])
        if fresh := [(tenant, m, by, at) for m, (by, at) in self.superseded.items() if m in self.inserts]:
            await conn.executemany(supersede, fresh)  # rows of this batch, inserted superseded
        if self.merged:
            await conn.executemany(
                "UPDATE memories SET engagement = $3, merged_count = $4, tags = $5, derived_from = $6"
                " WHERE tenant_id = $1 AND memory_id = $2::uuid",
                [(k.tenant_id, k.memory_id, k.engagement, k.merged_count, list(k.tags), list(k.derived_from))
                 for k in self.merged.values()])
        if self.merged_keys:  # after the rows: a write may merge into a memory this batch wrote
            await conn.executemany(MERGED_KEY, [(tenant, key, memory_id, request_hash)
                                                for key, (memory_id, request_hash) in self.merged_keys.items()])
        if self.streams:
            await store.append_many(conn, [(stream_id, s.expected, s.envelopes) for stream_id, s in self.streams.items()])
            await outbox.add_many(conn, self.outbox)

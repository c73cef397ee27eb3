"""Memory rows <-> records: the one INSERT of a memory and the mapping of a row back to its record."""

from __future__ import annotations

import asyncpg

from dataclasses import replace

from services.memory_writer.domain import Confidence, Layer, MemoryRecord, Source, Status
from services.memory_writer.domain.similarity import lsh_keys

__all__ = ["BY_IDEMPOTENCY_KEY", "CURRENT", "INSERT", "MERGED_KEY", "by_idempotency_key", "digest_lock", "insert_args",
           "key_lock", "lsh_of", "record_of"]

# `status = 1` (current memories) in the lookups by user, spelt so that no index partial on status = 1 can
# serve them. Until autovacuum first analyses the table (up to a minute after a new deployment starts
# writing), the planner takes any such index (memories_idle: tenant, last access) to hold a handful of
# rows and scanned it, with every memory of the tenant, once per user of a batch: 100 ms a 200-write
# batch at 3,000 memories instead of 2 ms by memories_recent or memories_owner (by user).
CURRENT = "status + 0 = 1"

INSERT = (
    "INSERT INTO memories (memory_id, tenant_id, user_id, session_id, layer, source, content, key, confidence,"
    " engagement, tags, derived_from, step_id, attributes, created_at, expires_at, idempotency_key, request_hash,"
    " status, written_by, reason, sensitive_kind, sealed, content_hmac, sensitive_hashes, quarantine_reasons,"
    " content_digest, minhash, near_duplicate_of, lsh)"
    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21,"
    " $22, $23, $24, $25, $26, $27, $28, $29::uuid, $30)"
)


def record_of(row: asyncpg.Record) -> MemoryRecord:
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


def insert_args(record: MemoryRecord, content: str, sealed: bytes | None) -> tuple:
    """The arguments of INSERT for `record`, whose stored content is `content` (the redacted text of a
    sensitive record, whose plaintext is `sealed`)."""
    return (record.memory_id, record.tenant_id, record.user_id, record.session_id, int(record.layer),
            int(record.source), content, record.key, int(record.confidence), record.engagement,
            list(record.tags), list(record.derived_from), record.step_id, record.attributes, record.created_at,
            record.expires_at, record.idempotency_key or None, record.request_hash or None, int(record.status),
            record.written_by, record.reason, record.sensitive_kind, sealed, record.content_hmac,
            list(record.sensitive_hashes), list(record.quarantine_reasons), record.content_digest,
            list(record.minhash) or None, record.near_duplicate_of or None, lsh_of(record))


def lsh_of(record: MemoryRecord) -> list[int] | None:
    """The LSH keys a memory is found by as a near duplicate (none while quarantined)."""
    if not record.minhash or record.status is Status.QUARANTINED:
        return None
    return lsh_keys(record.user_id, int(record.layer), list(record.minhash))


# Memories by idempotency key ($2: keys): the memory written under a key, or the memory a write under it
# was merged into (merged_hash: that write's request hash).
BY_IDEMPOTENCY_KEY = (
    "SELECT m.*, NULL::text AS merged_hash, m.idempotency_key AS written_key FROM memories m"
    " WHERE m.tenant_id = $1 AND m.idempotency_key = ANY($2::text[])"
    " UNION ALL SELECT m.*, w.request_hash, w.idempotency_key FROM merged_writes w JOIN memories m USING (memory_id)"
    " WHERE w.tenant_id = $1 AND w.idempotency_key = ANY($2::text[])"
)
MERGED_KEY = ("INSERT INTO merged_writes (tenant_id, idempotency_key, memory_id, request_hash)"
              " VALUES ($1, $2, $3::uuid, $4)")


def by_idempotency_key(row: asyncpg.Record) -> MemoryRecord:
    record = record_of(row)
    return replace(record, request_hash=row["merged_hash"]) if row["merged_hash"] is not None else record


# Advisory locks (pg_advisory_xact_lock(hashtext(...))), held to the end of the writing transaction.
def key_lock(tenant_id: str, user_id: str, key: str) -> str:
    """A user's entity key: its writes are serialised, whatever their idempotency keys."""
    return f"memory-key:{tenant_id}:{user_id}:{key}"


def digest_lock(tenant_id: str, user_id: str, layer: int, digest: str) -> str:
    """A user's content in one layer: of two replicas writing it at once, the second waits, then finds the
    first's memory and merges into it. (Not a unique index on current memories: an archived memory coming
    back to current would then fail whenever an identical one had been written meanwhile.)"""
    return f"memory-digest:{tenant_id}:{user_id}:{layer}:{digest}"

"""In-memory fakes behind the service ports, for unit tests through the handlers.

Each fake keeps the contract its real adapter keeps (see the Protocol it
implements), and nothing more: no I/O, no clocks, no sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from libs.errors import Conflict
from libs.eventstore import ANY_VERSION
from services.memory_writer.domain import DomainEvent, Layer, MemoryRecord, Source, Status, WriteMemory
from services.orchestrator.domain import Session, SessionEvent, Versioned
from services.retriever.adapters.memory import InMemoryDocuments
from services.retriever.adapters.vectors import payload_of
from services.retriever.domain import SparseVector
from services.tool_gateway.domain import ToolSpec

__all__ = [
    "NOW", "FakeDocumentStore", "FakeRegistry", "FakeSessionRepository", "FakeUnitOfWork", "FakeVectorIndex",
    "MemoryDatabase", "a_write",
]


# --- memory-writer ------------------------------------------------------------------------------------------

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def a_write(**changes) -> WriteMemory:
    """A valid long-term write of user u1 of tenant acme, with `changes`."""
    base = WriteMemory(tenant_id="acme", user_id="u1", session_id="s1", layer=Layer.LONG_TERM,
                       source=Source.USER_STATEMENT, content="prefers tea over coffee")
    return replace(base, **changes)


@dataclass
class MemoryDatabase:
    """What the memory-writer's PostgreSQL holds: rows, event streams, and the outbox (events after commit)."""

    rows: dict[str, MemoryRecord] = field(default_factory=dict)
    streams: dict[str, list[DomainEvent]] = field(default_factory=dict)
    published: list[tuple[str, DomainEvent]] = field(default_factory=list)
    schemas: dict[tuple[str, str], dict] = field(default_factory=dict)
    contacts: dict[str, bool] = field(default_factory=dict)  # tenants' own contacts rules
    user_keys: dict[tuple[str, str], str] = field(default_factory=dict)  # (tenant, user) -> a key id
    merged_keys: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)  # -> (memory id, hash)


class FakeUnitOfWork:
    """One transaction over a MemoryDatabase: changes are staged and land only on a clean exit.

    `fail_record` makes `record` raise, to exercise the rollback path.
    """

    def __init__(self, db: MemoryDatabase, *, fail_record: Exception | None = None,
                 fail_add_for: str | None = None) -> None:
        self.db = db
        self.fail_record = fail_record
        self.fail_add_for = fail_add_for  # content whose add raises, as a store refusing a value would
        self.committed = False
        self.rolled_back = False
        self.events: list[tuple[str, DomainEvent]] = []  # recorded in this unit, committed or not
        self._rows: dict[str, MemoryRecord] = {}
        self._streams: dict[str, list[DomainEvent]] = {}

    async def __aenter__(self) -> FakeUnitOfWork:
        assert not (self.committed or self.rolled_back), "a unit of work is used for one message only"
        self._rows = dict(self.db.rows)
        self._streams = {k: list(v) for k, v in self.db.streams.items()}
        self._merged_keys = dict(self.db.merged_keys)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if exc and exc[0] is not None:
            self.rolled_back = True
            return
        self.db.rows, self.db.streams, self.db.merged_keys = self._rows, self._streams, self._merged_keys
        self.db.published.extend(self.events)
        self.committed = True

    async def find_by_idempotency_key(self, tenant_id: str, key: str) -> MemoryRecord | None:
        written = next((r for r in self._rows.values() if r.tenant_id == tenant_id and r.idempotency_key == key), None)
        if written is None and (tenant_id, key) in self._merged_keys:
            memory_id, request_hash = self._merged_keys[(tenant_id, key)]
            return replace(self._rows[memory_id], request_hash=request_hash) if memory_id in self._rows else None
        return written

    async def add_merged_key(self, tenant_id: str, idempotency_key: str, memory_id: str, request_hash: str) -> None:
        assert (tenant_id, idempotency_key) not in self._merged_keys, "the key is the table's primary key"
        self._merged_keys[(tenant_id, idempotency_key)] = (memory_id, request_hash)

    async def get(self, tenant_id: str, memory_id: str) -> MemoryRecord | None:
        record = self._rows.get(memory_id)
        return record if record is not None and record.tenant_id == tenant_id else None

    async def add(self, record: MemoryRecord) -> bool:
        assert record.memory_id not in self._rows, "memory ids are unique"
        if self.fail_add_for is not None and record.content == self.fail_add_for:
            raise ValueError(f"the store refuses {record.content!r}")
        if record.key and record.status is Status.CURRENT:
            assert not any(r.status is Status.CURRENT and (r.tenant_id, r.user_id, r.key) ==
                           (record.tenant_id, record.user_id, record.key) for r in self._rows.values()), \
                "one current value per entity key (the partial unique index)"
        if record.idempotency_key and await self.find_by_idempotency_key(record.tenant_id, record.idempotency_key):
            return False
        if record.sensitive_kind:  # as the real adapter: only the redacted text in clear, the rest "sealed"
            key = self.db.user_keys.setdefault((record.tenant_id, record.user_id), f"key-{len(self.db.user_keys)}")
            record = replace(record, content=record.redacted, sealed=f"{key}|{record.content}".encode())
        self._rows[record.memory_id] = record
        return True

    async def recent_writes(self, tenant_id: str, user_id: str, since: datetime) -> int:
        return sum(1 for r in self._rows.values()
                   if (r.tenant_id, r.user_id) == (tenant_id, user_id) and r.created_at >= since)

    async def quarantined(self, tenant_id: str, user_id: str, limit: int) -> list[MemoryRecord]:
        held = [r for r in self._rows.values() if r.tenant_id == tenant_id and r.status is Status.QUARANTINED
                and (not user_id or r.user_id == user_id)]
        return sorted(held, key=lambda r: r.created_at)[:limit]

    async def find_identical(self, tenant_id: str, user_id: str, layer: int, digest: str) -> MemoryRecord | None:
        return next((r for r in sorted(self._rows.values(), key=lambda r: r.created_at)
                     if (r.tenant_id, r.user_id, int(r.layer), r.content_digest) == (tenant_id, user_id, layer, digest)
                     and r.status is Status.CURRENT), None)

    async def merge_into(self, kept: MemoryRecord) -> None:
        self._rows[kept.memory_id] = kept

    async def near_candidates(self, tenant_id: str, user_id: str, layer: int,
                              buckets: list[str]) -> list[tuple[str, list[int]]]:
        from services.memory_writer.domain.similarity import bands

        wanted = set(buckets)
        return [(r.memory_id, list(r.minhash)) for r in self._rows.values()
                if (r.tenant_id, r.user_id, int(r.layer)) == (tenant_id, user_id, layer) and r.minhash
                and r.status is Status.CURRENT and wanted & set(bands(list(r.minhash)))]

    async def uncovered_turns(self, tenant_id: str, user_id: str, session_id: str) -> list[MemoryRecord]:
        covered = {d for r in self._rows.values() if "summary" in r.tags for d in r.derived_from}
        return sorted((r for r in self._rows.values() if (r.tenant_id, r.user_id, r.session_id) ==
                       (tenant_id, user_id, session_id) and int(r.layer) == 1 and r.status is Status.CURRENT
                       and r.memory_id not in covered), key=lambda r: r.created_at)

    async def keyed_hash(self, tenant_id: str, value: str) -> str:
        return f"hmac({tenant_id}:{value})"

    async def reveal(self, record: MemoryRecord) -> str:
        from libs.crypto import CryptoError

        key, _, content = record.sealed.decode().partition("|")
        if self.db.user_keys.get((record.tenant_id, record.user_id)) != key:
            raise CryptoError("the user's key is gone")
        return content

    async def purge_outbox(self, tenant_id: str, user_id: str, memory_ids: list[str], *,
                           whole_tenant: bool = False) -> int:
        self.purged = (tenant_id, "*" if whole_tenant else user_id, tuple(memory_ids))
        return 0

    async def hold_keys(self, tenant_id: str, user_ids: list[str]) -> None:
        self.held = getattr(self, "held", []) + [(tenant_id, tuple(user_ids))]

    async def withhold_publication(self, tenant_id: str) -> None:
        self.withheld_after = len(self.events)  # how many events the unit had recorded by then

    async def erase_sealed(self, tenant_id: str, memory_ids: list[str] | None) -> int:
        self.erased = (tenant_id, None if memory_ids is None else tuple(memory_ids))
        return 0

    async def shred_user_key(self, tenant_id: str, user_id: str) -> bool:
        return self.db.user_keys.pop((tenant_id, user_id), None) is not None

    async def shred_tenant_keys(self, tenant_id: str) -> int:
        users = [k for k in self.db.user_keys if k[0] == tenant_id]
        for k in users:
            del self.db.user_keys[k]
        return len(users)

    async def delete_tenant(self, tenant_id: str) -> dict[str, list[str]]:
        removed: dict[str, list[str]] = {}
        for memory_id, record in list(self._rows.items()):
            if record.tenant_id == tenant_id:
                removed.setdefault(record.user_id, []).append(memory_id)
                del self._rows[memory_id]
        for key in [k for k in self.db.schemas if k[0] == tenant_id]:
            del self.db.schemas[key]
        self.db.contacts.pop(tenant_id, None)
        return removed

    async def rotate_tenant_key(self, tenant_id: str) -> tuple[int, int]:
        return 2, sum(1 for t, _ in self.db.user_keys if t == tenant_id)

    async def delete(self, tenant_id: str, memory_ids: list[str]) -> list[str]:
        removed = [m for m in memory_ids if m in self._rows and self._rows[m].tenant_id == tenant_id]
        for memory_id in removed:
            del self._rows[memory_id]
        return removed

    async def ids_of_user(self, tenant_id: str, user_id: str) -> list[str]:
        return [r.memory_id for r in self._rows.values() if r.tenant_id == tenant_id and r.user_id == user_id]

    async def prefetch(self, tenant_id: str, lookups) -> None:
        """Nothing to load: the fake answers every lookup from memory and writes at once."""
        self.prefetched = lookups

    async def flush(self) -> None:
        self.flushes = getattr(self, "flushes", 0) + 1

    @contextlib.asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        rows, streams, events = dict(self._rows), {k: list(v) for k, v in self._streams.items()}, list(self.events)
        merged_keys = dict(self._merged_keys)
        try:
            yield
        except BaseException:
            self._rows, self._streams, self.events, self._merged_keys = rows, streams, events, merged_keys
            raise

    async def entity_schemas(self, tenant_id: str, keys: set[str]) -> dict[str, dict]:
        return {k: self.db.schemas[(tenant_id, k)] for k in keys if (tenant_id, k) in self.db.schemas}

    async def put_entity_schema(self, tenant_id: str, key: str, schema: dict) -> None:
        self.db.schemas[(tenant_id, key)] = schema

    async def contacts_policy(self, tenant_id: str) -> bool | None:
        return self.db.contacts.get(tenant_id)

    async def put_contacts_policy(self, tenant_id: str, sensitive: bool | None, by: str) -> None:
        if sensitive is None:
            self.db.contacts.pop(tenant_id, None)
        else:
            self.db.contacts[tenant_id] = sensitive

    async def current_of(self, tenant_id: str, user_id: str, key: str) -> MemoryRecord | None:
        return next((r for r in self._rows.values() if (r.tenant_id, r.user_id, r.key) == (tenant_id, user_id, key)
                     and r.status is Status.CURRENT), None)

    async def supersede(self, tenant_id: str, memory_id: str, by: str, at: datetime) -> None:
        self._rows[memory_id] = replace(self._rows[memory_id], status=Status.SUPERSEDED, superseded_by=by,
                                        changed_at=at)

    async def update(self, record: MemoryRecord) -> None:
        self._rows[record.memory_id] = record

    async def history(self, tenant_id: str, user_id: str, key: str) -> list[MemoryRecord]:
        return sorted((r for r in self._rows.values() if (r.tenant_id, r.user_id, r.key) == (tenant_id, user_id, key)),
                      key=lambda r: r.created_at)

    async def record(self, stream_id: str, expected_version: int, event: DomainEvent) -> int:
        if self.fail_record is not None:
            raise self.fail_record
        stream = self._streams.setdefault(stream_id, [])
        if expected_version != ANY_VERSION and len(stream) != expected_version:
            raise Conflict(f"stream {stream_id} is at version {len(stream)}, not {expected_version}",
                           field="expected_version")
        stream.append(event)
        self.events.append((stream_id, event))
        return len(stream)


# --- retriever ----------------------------------------------------------------------------------------------


class FakeDocumentStore(InMemoryDocuments):
    """The document projection in process (the same rules: tombstones, `then` under the memory's lock)."""


class FakeVectorIndex:
    """Brute force over every point: cosine for dense, BM25 IDF (as Qdrant's idf modifier) times the stored
    weights for sparse; the same filters as the real engines. Records what it was given."""

    def __init__(self) -> None:
        self.points: dict[str, tuple[dict, list[float], SparseVector]] = {}
        self.queries: list = []
        self.closed = False

    def upsert(self, documents) -> None:
        for d, dense, sparse in documents:
            self.points[d.memory_id] = (payload_of(d), dense, sparse)

    def set_payloads(self, tenant_id: str, documents) -> None:
        for d in documents:
            point = self.points.get(d.memory_id)
            if point is not None and point[0]["tenant_id"] == tenant_id:
                self.points[d.memory_id] = ({**point[0], **payload_of(d)}, point[1], point[2])

    def retrieve(self, tenant_id: str, memory_ids: list[str]) -> dict[str, dict]:
        return {m: p for m in memory_ids if (point := self.points.get(m)) and (p := point[0])["tenant_id"] == tenant_id}

    def _passes(self, p: dict, q, now) -> bool:
        return (p["tenant_id"] == q.tenant_id and (not q.user_id or p["user_id"] == q.user_id)
                and (not q.session_id or p["session_id"] == q.session_id)
                and (not q.layers or p["layer"] in q.layers) and set(q.tags) <= set(p["tags"])
                and (q.since is None or p["created_at"] >= q.since.timestamp())
                and (q.until is None or p["created_at"] < q.until.timestamp())
                and (not q.min_confidence or p["confidence"] <= q.min_confidence)
                and (q.include_archived or not p["archived"])
                and (p["expires_at"] is None or p["expires_at"] > now.timestamp()))

    def query(self, iq):
        self.queries.append(iq)
        live = {m: v for m, v in self.points.items() if self._passes(v[0], iq.query, iq.now)}
        sparse_hits: list[tuple[str, float]] = []
        if iq.sparse:
            n = len(self.points)
            df = {i: sum(1 for _, _, s in self.points.values() if i in s.indices) for i in iq.sparse.indices}
            idf = {i: math.log(1 + (n - df[i] + 0.5) / (df[i] + 0.5)) for i in iq.sparse.indices}
            for m, (_, _, s) in live.items():
                weights = dict(zip(s.indices, s.values, strict=True))
                score = sum(idf[i] * weights[i] for i in iq.sparse.indices if i in weights)
                if score > 0:
                    sparse_hits.append((m, score))
            sparse_hits = sorted(sparse_hits, key=lambda h: -h[1])[: iq.limit]
        dense_hits: list[tuple[str, float]] = []
        if iq.dense is not None:
            pool = {m for m, _ in sparse_hits} if iq.two_stage else set(live)
            dense_hits = sorted(((m, sum(a * b for a, b in zip(iq.dense, live[m][1], strict=True))) for m in pool),
                                key=lambda h: -h[1])[: iq.limit]
        return dense_hits, sparse_hits

    def delete(self, tenant_id: str, memory_ids: list[str]) -> None:
        for memory_id in memory_ids:
            if memory_id in self.points and self.points[memory_id][0]["tenant_id"] == tenant_id:
                del self.points[memory_id]

    def count(self, tenant_id: str | None = None) -> int:
        return sum(1 for p, _, _ in self.points.values() if tenant_id is None or p["tenant_id"] == tenant_id)

    def optimize(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


# --- tool-gateway -------------------------------------------------------------------------------------------


class FakeRegistry:
    def __init__(self) -> None:
        self.tools: dict[tuple[str, str], ToolSpec] = {}
        self.announced: list[ToolSpec] = []  # the tool.registered events
        self.rollout_of: dict = {}  # tool name -> Rollout

    async def register(self, spec: ToolSpec) -> bool:
        if (spec.name, spec.version) in self.tools:
            return False
        self.tools[spec.name, spec.version] = spec
        self.announced.append(spec)
        return True

    async def list(self) -> list[ToolSpec]:
        order = {(s.name, s.version): i for i, s in enumerate(self.announced)}
        return sorted(self.tools.values(), key=lambda s: (s.name, -order[s.name, s.version]))

    async def versions(self, name: str) -> list[ToolSpec]:
        return [s for (n, _), s in self.tools.items() if n == name]

    async def lookup(self, name: str):
        return await self.versions(name), self.rollout_of.get(name)

    async def remove(self, name: str, version: str = "") -> list[str]:
        gone = sorted(v for (n, v) in self.tools if n == name and version in ("", v))
        for v in gone:
            del self.tools[name, v]
        return gone

    async def rollouts(self):
        return dict(self.rollout_of)

    async def save_rollout(self, rollout, expect_canary: str | None = None) -> bool:
        held = self.rollout_of.get(rollout.name)
        if expect_canary is not None and held is not None and held.canary != expect_canary:
            return False
        self.rollout_of[rollout.name] = rollout
        return True


# --- orchestrator -------------------------------------------------------------------------------------------


class FakeSessionRepository:
    """An event store of sessions with the real store's append rules:
    Conflict(field="expected_version") when the stream moved, Conflict(field="event_id") on a repeated id."""

    def __init__(self) -> None:
        self.streams: dict[tuple[str, str], list[Versioned]] = {}
        self.event_ids: set[str] = set()
        self.appends = 0
        self._changed = asyncio.Condition()
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    async def history(self, tenant_id: str, session_id: str) -> list[Versioned]:
        return list(self.streams.get((tenant_id, session_id), []))

    async def load(self, tenant_id: str, session_id: str) -> Session:
        return Session.replay(tenant_id, session_id, await self.history(tenant_id, session_id))

    async def update(self, tenant_id: str, session_id: str, decide) -> Session:
        async with self._locks.setdefault((tenant_id, session_id), asyncio.Lock()):
            session = await self.load(tenant_id, session_id)
            await asyncio.sleep(0)  # let racing senders interleave up to the lock
            events = decide(session)
            if events:
                events = [e if e.event_id else replace(e, event_id=str(uuid.uuid4())) for e in events]
                await self.append(tenant_id, session_id, session.version, events)
            return await self.load(tenant_id, session_id)

    async def append(self, tenant_id: str, session_id: str, expected_version: int,
                     events: list[SessionEvent]) -> int:
        stream = self.streams.setdefault((tenant_id, session_id), [])
        if expected_version != ANY_VERSION and len(stream) != expected_version:
            raise Conflict(f"stream is at version {len(stream)}, not {expected_version}", field="expected_version")
        ids = [e.event_id for e in events if e.event_id]
        if self.event_ids.intersection(ids) or len(set(ids)) != len(ids):
            raise Conflict("an event with this event_id is already stored", field="event_id", retryable=False)
        self.event_ids.update(ids)
        base = len(stream)
        stream.extend([Versioned(base + i, e) for i, e in enumerate(events, start=1)])
        self.appends += 1
        async with self._changed:
            self._changed.notify_all()
        return len(stream)

    async def follow(self, tenant_id: str, session_id: str, after_version: int) -> AsyncIterator[Versioned]:
        seen = after_version
        while True:
            async with self._changed:
                await self._changed.wait_for(lambda: len(self.streams.get((tenant_id, session_id), [])) > seen)  # noqa: B023 - used at once
                batch = self.streams[tenant_id, session_id][seen:]
            for item in batch:
                seen = item.version
                yield item

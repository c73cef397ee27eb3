"""The PostgreSQL unit of work: memory rows, the event store and the outbox in one transaction."""

from __future__ import annotations

import json

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from libs.db import Database
from libs.events import Envelope
from libs.eventstore import EventStore
from libs.outbox import Outbox
from services.memory_writer.adapters.mapping import event_to_proto
from services.memory_writer.domain import Confidence, DomainEvent, Layer, MemoryRecord, Source

__all__ = ["PostgresUnitOfWork"]

_INSERT = (
    "INSERT INTO memories (memory_id, tenant_id, user_id, session_id, layer, source, content, key, confidence,"
    " engagement, tags, derived_from, step_id, attributes, created_at, expires_at, idempotency_key)"
    " VALUES (%(memory_id)s, %(tenant_id)s, %(user_id)s, %(session_id)s, %(layer)s, %(source)s, %(content)s,"
    " %(key)s, %(confidence)s, %(engagement)s, %(tags)s, %(derived_from)s, %(step_id)s, %(attributes)s,"
    " %(created_at)s, %(expires_at)s, %(idempotency_key)s)"
    " ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING"
)


def _record(row: dict) -> MemoryRecord:
    return MemoryRecord(
        memory_id=str(row["memory_id"]), tenant_id=row["tenant_id"], user_id=row["user_id"],
        session_id=row["session_id"], layer=Layer(row["layer"]), source=Source(row["source"]),
        content=row["content"], key=row["key"], confidence=Confidence(row["confidence"]), tags=tuple(row["tags"]),
        derived_from=tuple(row["derived_from"]), step_id=row["step_id"], created_at=row["created_at"],
        expires_at=row["expires_at"], idempotency_key=row["idempotency_key"] or "", attributes=row["attributes"],
        engagement=row["engagement"],
    )


class PostgresUnitOfWork:
    """A new unit per command. With `conn`, it joins that connection's transaction (stream handlers,
    whose processed-event row must commit with the effect); otherwise it takes a pooled connection."""

    def __init__(self, db: Database, store: EventStore, outbox: Outbox, *, conn: AsyncConnection | None = None,
                 causation: Envelope | None = None) -> None:
        self.db, self.store, self.outbox = db, store, outbox
        self._outer, self.causation = conn, causation
        self._conn: AsyncConnection | None = None
        self._cm = self._tx = None

    async def __aenter__(self) -> PostgresUnitOfWork:
        if self._outer is not None:
            self._conn = self._outer
        else:
            self._cm = self.db.connection()
            self._conn = await self._cm.__aenter__()
        self._tx = self._conn.transaction()  # a savepoint when joining an outer transaction
        await self._tx.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self._tx.__aexit__(*exc)
        finally:
            if self._cm is not None:
                await self._cm.__aexit__(*exc)

    @property
    def conn(self) -> AsyncConnection:
        assert self._conn is not None, "use the unit of work in `async with`"
        return self._conn

    async def _one(self, query: str, params: list) -> MemoryRecord | None:
        cur = self.conn.cursor(row_factory=dict_row)
        await cur.execute(query, params)
        row = await cur.fetchone()
        return _record(row) if row else None

    async def find_by_idempotency_key(self, tenant_id: str, key: str) -> MemoryRecord | None:
        return await self._one("SELECT * FROM memories WHERE tenant_id = %s AND idempotency_key = %s",
                               [tenant_id, key])

    async def get(self, tenant_id: str, memory_id: str) -> MemoryRecord | None:
        return await self._one("SELECT * FROM memories WHERE tenant_id = %s AND memory_id::text = %s",
                               [tenant_id, memory_id])

    async def add(self, record: MemoryRecord) -> bool:
        params = {**record.__dict__, "layer": int(record.layer), "source": int(record.source),
                  "confidence": int(record.confidence), "tags": list(record.tags),
                  "derived_from": list(record.derived_from), "attributes": json.dumps(record.attributes),
                  "idempotency_key": record.idempotency_key or None}
        return (await self.conn.execute(_INSERT, params)).rowcount == 1

    async def delete(self, tenant_id: str, memory_ids: list[str]) -> list[str]:
        cur = await self.conn.execute(
            "DELETE FROM memories WHERE tenant_id = %s AND memory_id::text = ANY(%s) RETURNING memory_id::text",
            [tenant_id, memory_ids])
        return [row[0] for row in await cur.fetchall()]

    async def ids_of_user(self, tenant_id: str, user_id: str) -> list[str]:
        cur = await self.conn.execute("SELECT memory_id::text FROM memories WHERE tenant_id = %s AND user_id = %s",
                                      [tenant_id, user_id])
        return [row[0] for row in await cur.fetchall()]

    async def record(self, stream_id: str, expected_version: int, event: DomainEvent) -> int:
        event_type, payload = event_to_proto(event)
        tenant_id = payload.memory.tenant.tenant_id if event_type == "memory.written" else payload.tenant.tenant_id
        envelope = Envelope.wrap(payload, event_type=event_type, tenant_id=tenant_id, causation=self.causation)
        version = await self.store.append(self.conn, stream_id, expected_version, [envelope])
        await self.outbox.add(self.conn, envelope)
        return version

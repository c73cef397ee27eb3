"""The retriever's document projection in PostgreSQL.

A forget always sticks: forgetting writes the tombstone before deleting, in one transaction,
and indexing a memory checks for its tombstone; both hold the memory's advisory lock until
commit, so a memory.written handled concurrently with its memory.forgotten (in either order,
on any replica) can never bring the memory back.
"""

from __future__ import annotations

import asyncpg

from libs.db import Database, rowcount
from services.retriever.domain import Document, SearchQuery

__all__ = ["PostgresDocuments"]

_LOCK = "SELECT pg_advisory_xact_lock(hashtext('memory:' || m)) FROM unnest($1::text[]) AS m ORDER BY m"
_UPSERT = (
    "INSERT INTO documents (memory_id, tenant_id, user_id, session_id, layer, source, confidence, content,"
    " terms, tags, created_at, expires_at)"
    " SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12"
    " WHERE NOT EXISTS (SELECT 1 FROM tombstones WHERE memory_id = $1::uuid)"
    " ON CONFLICT (memory_id) DO UPDATE SET content = EXCLUDED.content, terms = EXCLUDED.terms,"
    " tags = EXCLUDED.tags, confidence = EXCLUDED.confidence, expires_at = EXCLUDED.expires_at,"
    " indexed_at = now()"
)
_COLUMNS = ("memory_id::text AS memory_id, tenant_id, user_id, session_id, layer, source, confidence, content,"
            " terms, tags, created_at, expires_at")


class PostgresDocuments:
    """With `conn`, writes join that (tenant-scoped) transaction, so the processed-event row commits
    with them; without, each call is a unit of work of its own, as the tenant it names."""

    def __init__(self, db: Database, conn: asyncpg.Connection | None = None) -> None:
        self.db, self.conn = db, conn

    async def _in_transaction(self, tenant_id: str, work) -> object:
        if self.conn is not None:
            async with self.conn.transaction():  # a savepoint inside the handler's transaction
                return await work(self.conn)
        async with self.db.transaction(tenant_id) as conn:
            return await work(conn)

    async def upsert(self, d: Document) -> bool:
        """Index `d` unless its memory was forgotten; True when it was indexed."""
        async def work(conn: asyncpg.Connection) -> bool:
            await conn.execute(_LOCK, [d.memory_id])
            return rowcount(await conn.execute(
                _UPSERT, d.memory_id, d.tenant_id, d.user_id, d.session_id, d.layer, d.source, d.confidence,
                d.content, list(d.terms), list(d.tags), d.created_at, d.expires_at)) == 1

        return await self._in_transaction(d.tenant_id, work)

    async def delete(self, tenant_id: str, memory_ids: list[str]) -> int:
        """Leave tombstones, then delete: a late or concurrent memory.written cannot bring them back."""
        async def work(conn: asyncpg.Connection) -> int:
            await conn.execute(_LOCK, memory_ids)
            await conn.execute("INSERT INTO tombstones (memory_id, tenant_id) SELECT unnest($1::uuid[]), $2"
                               " ON CONFLICT DO NOTHING", memory_ids, tenant_id)
            return rowcount(await conn.execute(
                "DELETE FROM documents WHERE tenant_id = $1 AND memory_id = ANY($2::uuid[])", tenant_id, memory_ids))

        return await self._in_transaction(tenant_id, work)

    async def candidates(self, q: SearchQuery, limit: int) -> list[Document]:
        args: list[object] = [q.tenant_id, list(q.terms)]
        where = ["tenant_id = $1", "terms && $2::text[]", "(expires_at IS NULL OR expires_at > now())"]

        def bind(condition: str, value: object) -> None:
            args.append(value)
            where.append(condition.replace("?", f"${len(args)}"))

        if q.user_id:
            bind("user_id = ?", q.user_id)
        if q.layers:
            bind("layer = ANY(?::smallint[])", list(q.layers))
        if q.tags:
            bind("tags @> ?::text[]", list(q.tags))
        if q.since:
            bind("created_at >= ?", q.since)
        if q.until:
            bind("created_at < ?", q.until)
        if q.min_confidence:
            bind("confidence <= ?", q.min_confidence)
        args.append(limit)
        query = (f"SELECT {_COLUMNS} FROM documents WHERE {' AND '.join(where)}"
                 f" ORDER BY created_at DESC LIMIT ${len(args)}")
        async with self.db.transaction(q.tenant_id) as conn:
            rows = await conn.fetch(query, *args)
        return [Document(**{**dict(r), "terms": tuple(r["terms"]), "tags": tuple(r["tags"])}) for r in rows]

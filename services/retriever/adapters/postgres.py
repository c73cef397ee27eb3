"""The retriever's document projection in PostgreSQL."""

from __future__ import annotations

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from libs.db import Database
from services.retriever.domain import Document, SearchQuery

__all__ = ["PostgresDocuments"]


class PostgresDocuments:
    """With `conn`, writes join that transaction (so the processed-event row commits with them)."""

    def __init__(self, db: Database, conn: AsyncConnection | None = None) -> None:
        self.db, self.conn = db, conn

    async def _execute(self, query: str, params: dict | list) -> int:
        if self.conn is not None:
            return (await self.conn.execute(query, params)).rowcount
        async with self.db.connection() as conn:
            return (await conn.execute(query, params)).rowcount

    async def upsert(self, d: Document) -> None:
        await self._execute(
            "INSERT INTO documents (memory_id, tenant_id, user_id, session_id, layer, source, confidence, content,"
            " terms, tags, created_at, expires_at) SELECT %(memory_id)s, %(tenant_id)s, %(user_id)s,"
            " %(session_id)s, %(layer)s, %(source)s, %(confidence)s, %(content)s, %(terms)s, %(tags)s,"
            " %(created_at)s, %(expires_at)s"
            " WHERE NOT EXISTS (SELECT 1 FROM tombstones WHERE memory_id = %(memory_id)s::uuid)"
            " ON CONFLICT (memory_id) DO UPDATE SET content = EXCLUDED.content, terms = EXCLUDED.terms,"
            " tags = EXCLUDED.tags, confidence = EXCLUDED.confidence, expires_at = EXCLUDED.expires_at,"
            " indexed_at = now()",
            {**d.__dict__, "terms": list(d.terms), "tags": list(d.tags)},
        )

    async def delete(self, tenant_id: str, memory_ids: list[str]) -> int:
        """Delete and leave tombstones, so a late memory.written cannot bring them back."""
        await self._execute(
            "INSERT INTO tombstones (memory_id, tenant_id) SELECT unnest(%s::uuid[]), %s ON CONFLICT DO NOTHING",
            [memory_ids, tenant_id])
        return await self._execute("DELETE FROM documents WHERE tenant_id = %s AND memory_id::text = ANY(%s)",
                                   [tenant_id, memory_ids])

    async def candidates(self, q: SearchQuery, limit: int) -> list[Document]:
        where = ["tenant_id = %(tenant_id)s", "terms && %(terms)s", "(expires_at IS NULL OR expires_at > now())"]
        if q.user_id:
            where.append("user_id = %(user_id)s")
        if q.layers:
            where.append("layer = ANY(%(layers)s)")
        if q.tags:
            where.append("tags @> %(tags)s")
        if q.since:
            where.append("created_at >= %(since)s")
        if q.until:
            where.append("created_at < %(until)s")
        if q.min_confidence:
            where.append("confidence <= %(min_confidence)s")
        params = {**q.__dict__, "terms": list(q.terms), "layers": list(q.layers), "tags": list(q.tags),
                  "limit": limit}
        async with self.db.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                "SELECT memory_id::text AS memory_id, tenant_id, user_id, session_id, layer, source, confidence,"
                " content, terms, tags, created_at, expires_at FROM documents WHERE " + " AND ".join(where)
                + " ORDER BY created_at DESC LIMIT %(limit)s", params)
            rows = await cur.fetchall()
        return [Document(**{**r, "terms": tuple(r["terms"]), "tags": tuple(r["tags"])}) for r in rows]

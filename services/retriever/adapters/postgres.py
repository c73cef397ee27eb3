"""The retriever's document projection in PostgreSQL.

A forget always sticks: forgetting writes the tombstone before deleting, in one transaction,
and indexing a memory checks for its tombstone; both hold the memory's advisory lock until
commit, so a memory.written handled concurrently with its memory.forgotten (in either order,
on any replica) can never bring the memory back. The vector upsert runs under that same lock
(`then`), so the same holds for the vector index.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime

import asyncpg

from libs.db import Database, rowcount
from services.retriever.domain import Document

__all__ = ["COLUMNS", "PostgresDocuments", "document_of_row"]

_LOCK = "SELECT pg_advisory_xact_lock(hashtext('memory:' || m)) FROM unnest($1::text[]) AS m ORDER BY m"
# The same lock, only where free: the projector never waits for a handler (nor a handler for a deadlock).
# In candidate order, up to $2 of them: the executor stops trying once it has $2 (no lock beyond them).
_TRY_LOCK = ("SELECT m FROM unnest($1::text[]) AS m WHERE pg_try_advisory_xact_lock(hashtext('memory:' || m))"
             " LIMIT $2")
# Candidates a projector looks at per document it takes: the oldest queued ones are the batches other
# projectors (of this process or another replica) hold right now, and it skips them to the next ones.
_LOOKAHEAD = 4
# $19 version: a memory.written older than the recorded one is refused; $20 projected: whether the vectors
# are written in this same transaction (false: the projector will).
_UPSERT = (
    "INSERT INTO documents (memory_id, tenant_id, user_id, session_id, layer, source, confidence, content,"
    " terms, tags, created_at, expires_at, key, derived_from, engagement, archived, step_id, attributes,"
    " version, projected)"
    " SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20"
    " WHERE NOT EXISTS (SELECT 1 FROM tombstones WHERE memory_id = $1::uuid)"
    " ON CONFLICT (memory_id) DO UPDATE SET content = EXCLUDED.content, terms = EXCLUDED.terms,"
    " tags = EXCLUDED.tags, confidence = EXCLUDED.confidence, source = EXCLUDED.source,"
    " expires_at = EXCLUDED.expires_at, key = EXCLUDED.key, derived_from = EXCLUDED.derived_from,"
    " engagement = EXCLUDED.engagement, archived = EXCLUDED.archived, attributes = EXCLUDED.attributes,"
    " version = EXCLUDED.version, projected = EXCLUDED.projected, indexed_at = now()"
    " WHERE documents.version <= EXCLUDED.version"
)
COLUMNS = ("memory_id::text AS memory_id, tenant_id, user_id, session_id, layer, source, confidence, content,"
            " terms, tags, created_at, expires_at, key, derived_from, engagement, archived, step_id,"
            " attributes")


def document_of_row(r: asyncpg.Record) -> Document:
    return Document(**{**{k: v for k, v in r.items() if k != "projected"}, "terms": tuple(r["terms"]), "tags": tuple(r["tags"]),
                       "derived_from": tuple(r["derived_from"]), "attributes": dict(r["attributes"])})


class PostgresDocuments:
    """With `conn`, writes join that (tenant-scoped) transaction, so the processed-event row commits
    with them; without, each call is a unit of work of its own, as the tenant it names."""

    def __init__(self, db: Database, conn: asyncpg.Connection | None = None) -> None:
        self.db, self.conn = db, conn

    @staticmethod
    def channel(db: Database) -> str:
        """The NOTIFY channel that wakes the projectors of this schema once a recorded document commits."""
        return f"{db.schema}.projection"

    async def _in_transaction(self, tenant_id: str, work) -> object:
        if self.conn is not None:
            async with self.conn.transaction():  # a savepoint inside the handler's transaction
                return await work(self.conn)
        async with self.db.transaction(tenant_id) as conn:
            return await work(conn)

    async def upsert(self, d: Document, then: Callable[[], Awaitable[None]] | None = None,
                     version: int = 0) -> bool:
        """Index `d` unless its memory was forgotten; True when it was indexed. `then` (the vector upsert)
        runs only when it was, under the memory's lock and inside the transaction: if it fails, nothing
        is kept and the event is retried."""
        async def work(conn: asyncpg.Connection) -> bool:
            await conn.execute(_LOCK, [d.memory_id])
            indexed = await self._write(conn, d, version, projected=True)
            if indexed and then is not None:
                await then()
            return indexed

        return await self._in_transaction(d.tenant_id, work)

    @staticmethod
    def _arguments(d: Document, version: int, projected: bool) -> tuple:
        return (d.memory_id, d.tenant_id, d.user_id, d.session_id, d.layer, d.source, d.confidence,
                d.content, list(d.terms), list(d.tags), d.created_at, d.expires_at, d.key, list(d.derived_from),
                d.engagement, d.archived, d.step_id, d.attributes,  # jsonb: the pool codec encodes it
                version, projected)

    @classmethod
    async def _write(cls, conn: asyncpg.Connection, d: Document, version: int, *, projected: bool) -> bool:
        return rowcount(await conn.execute(_UPSERT, *cls._arguments(d, version, projected))) == 1

    async def record(self, d: Document, version: int = 0) -> bool:
        """Record `d` for the projector (its vectors come later, in a batch) unless its memory was forgotten
        or a newer version is recorded; True when recorded. Committing wakes the projectors (NOTIFY)."""
        async def work(conn: asyncpg.Connection) -> bool:
            await conn.execute(_LOCK, [d.memory_id])
            recorded = await self._write(conn, d, version, projected=False)
            if recorded:
                await conn.execute("SELECT pg_notify($1, '')", self.channel(self.db))
            return recorded

        return await self._in_transaction(d.tenant_id, work)

    async def record_many(self, items: list[tuple[Document, int]]) -> None:
        """As record, for many documents of one tenant (document, version): their locks, one pipelined
        statement for all, one NOTIFY, one transaction (or savepoint)."""
        tenant_id = items[0][0].tenant_id

        async def work(conn: asyncpg.Connection) -> None:
            await conn.execute(_LOCK, list(dict.fromkeys(d.memory_id for d, _ in items)))
            await conn.executemany(_UPSERT, [self._arguments(d, version, False) for d, version in items])
            await conn.execute("SELECT pg_notify($1, '')", self.channel(self.db))

        await self._in_transaction(tenant_id, work)

    @contextlib.asynccontextmanager
    async def pending(self, limit: int) -> AsyncIterator[list[Document]]:
        """Up to `limit` recorded documents whose vectors are not written yet, each under its memory's lock
        (one another projector or a handler holds is left for later, and the next free ones are taken: two
        projectors work on disjoint batches at once). The body writes their vectors; when
        it returns they are marked projected, in the same transaction; when it raises, nothing is."""
        async with self.db.system_transaction() as conn:  # the projector's queue spans every tenant
            candidates = [r[0] for r in await conn.fetch(
                "SELECT memory_id::text FROM documents WHERE NOT projected ORDER BY indexed_at LIMIT $1",
                limit * _LOOKAHEAD)]
            locked = [r[0] for r in await conn.fetch(_TRY_LOCK, candidates, limit)] if candidates else []
            rows = await conn.fetch(f"SELECT {COLUMNS} FROM documents WHERE memory_id = ANY($1::uuid[])"
                                    " AND NOT projected", locked) if locked else []
            documents = [document_of_row(r) for r in rows]
            yield documents
            if documents:
                await conn.execute("UPDATE documents SET projected = true WHERE memory_id = ANY($1::uuid[])",
                                   [d.memory_id for d in documents])

    async def amend(self, tenant_id: str, memory_ids: list[str], change: Callable[[Document], Document],
                    then: Callable[[list[Document]], Awaitable[None]] | None = None) -> int:
        """Apply `change` to the tenant's documents among `memory_ids` under their locks. `then` gets the
        changed documents whose vectors are written (it rewrites their index payload, under the same locks;
        if it fails nothing is kept); without `then`, or for a document still queued, the projector writes
        the new payload. A forgotten or unknown memory is left alone. How many changed."""
        async def work(conn: asyncpg.Connection) -> int:
            await conn.execute(_LOCK, memory_ids)
            rows = await conn.fetch(f"SELECT {COLUMNS}, projected FROM documents WHERE tenant_id = $1"
                                    " AND memory_id = ANY($2::uuid[])", tenant_id, memory_ids)
            changed, indexed = 0, []
            for r in rows:
                d = document_of_row(r)
                new = change(d)
                if new == d:
                    continue
                await conn.execute(
                    "UPDATE documents SET confidence = $2, expires_at = $3, engagement = $4, archived = $5,"
                    " tags = $6, derived_from = $7, projected = projected AND $8, indexed_at = now()"
                    " WHERE memory_id = $1",
                    d.memory_id, new.confidence, new.expires_at, new.engagement, new.archived, list(new.tags),
                    list(new.derived_from), then is not None)
                changed += 1
                if r["projected"]:
                    indexed.append(new)
            if then is not None and indexed:
                await then(indexed)
            elif changed:
                await conn.execute("SELECT pg_notify($1, '')", self.channel(self.db))
            return changed

        return await self._in_transaction(tenant_id, work)

    async def delete(self, tenant_id: str, memory_ids: list[str],
                     then: Callable[[], Awaitable[None]] | None = None, *, tombstone: bool = True) -> int:
        """Leave tombstones, then delete, then `then` (the vector purge), all under the memories' locks:
        a late or concurrent memory.written cannot bring them back. Without `tombstone` (a quarantine),
        a later memory.written (after a release) indexes the memory again."""
        async def work(conn: asyncpg.Connection) -> int:
            await conn.execute(_LOCK, memory_ids)
            if tombstone:
                await conn.execute("INSERT INTO tombstones (memory_id, tenant_id) SELECT unnest($1::uuid[]), $2"
                                   " ON CONFLICT DO NOTHING", memory_ids, tenant_id)
            removed = rowcount(await conn.execute(
                "DELETE FROM documents WHERE tenant_id = $1 AND memory_id = ANY($2::uuid[])", tenant_id, memory_ids))
            if then is not None:
                await then()
            return removed

        return await self._in_transaction(tenant_id, work)

    async def fetch(self, tenant_id: str, memory_ids: list[str]) -> dict[str, Document]:
        """The tenant's documents among `memory_ids` (row-level security confines it to the tenant too)."""
        if not memory_ids:
            return {}
        async with self.db.transaction(tenant_id) as conn:
            rows = await conn.fetch(f"SELECT {COLUMNS} FROM documents WHERE tenant_id = $1"
                                    " AND memory_id = ANY($2::uuid[])", tenant_id, memory_ids)
        return {r["memory_id"]: document_of_row(r) for r in rows}

    async def count_all(self) -> int:
        """Every document of every tenant (a rebuild's total)."""
        async with self.db.system_transaction() as conn:
            return await conn.fetchval("SELECT count(*) FROM documents")

    @contextlib.asynccontextmanager
    async def locked_batch(self, after: str, limit: int) -> AsyncIterator[tuple[list[Document], str | None]]:
        """The next `limit` documents of every tenant after memory id `after`, each under its memory's lock
        until the body returns: a rebuild copies what the projection holds, and no handler, projector or
        forget changes those memories meanwhile (each of them writes the index under the same lock). Yields
        the documents and the id the next batch starts after (None: none left)."""
        async with self.db.system_transaction() as conn:
            ids = [r[0] for r in await conn.fetch("SELECT memory_id::text FROM documents WHERE memory_id > $1::uuid"
                                                  " ORDER BY memory_id LIMIT $2", after, limit)]
            # and where the next batch starts (None: no more), as rows may have gone meanwhile
            yield await self._locked(conn, ids), (ids[-1] if ids else None)

    @contextlib.asynccontextmanager
    async def locked_documents(self, memory_ids: list[str]) -> AsyncIterator[list[Document]]:
        """These documents (of any tenant, those still there), under their memories' locks until the body
        returns."""
        async with self.db.system_transaction() as conn:
            yield await self._locked(conn, memory_ids)

    @staticmethod
    async def _locked(conn: asyncpg.Connection, ids: list[str]) -> list[Document]:
        if not ids:
            return []
        await conn.execute(_LOCK, ids)
        rows = await conn.fetch(f"SELECT {COLUMNS} FROM documents WHERE memory_id = ANY($1::uuid[])"
                                " ORDER BY memory_id", ids)
        return [document_of_row(r) for r in rows]

    async def clock(self) -> datetime:
        async with self.db.system_transaction() as conn:
            return await conn.fetchval("SELECT clock_timestamp()")

    async def changed_since(self, since: datetime) -> tuple[list[str], list[tuple[str, str]]]:
        """Memories recorded or amended since `since` (ids), and memories forgotten since (tenant, id)."""
        async with self.db.system_transaction() as conn:
            changed = [r[0] for r in await conn.fetch(
                "SELECT memory_id::text FROM documents WHERE indexed_at >= $1 ORDER BY memory_id", since)]
            forgotten = [(r[0], r[1]) for r in await conn.fetch(
                "SELECT tenant_id, memory_id::text FROM tombstones WHERE forgotten_at >= $1", since)]
        return changed, forgotten

    async def all_documents(self, tenant_id: str | None, batch: int = 500):
        """Every indexed document (one tenant, or all of them: cross-tenant machinery such as a rebuild)."""
        after = "00000000-0000-0000-0000-000000000000"
        while True:
            if tenant_id is None:
                async with self.db.system_transaction() as conn:
                    rows = await conn.fetch(f"SELECT {COLUMNS} FROM documents WHERE memory_id > $1::uuid"
                                            " ORDER BY memory_id LIMIT $2", after, batch)
            else:
                async with self.db.transaction(tenant_id) as conn:
                    rows = await conn.fetch(f"SELECT {COLUMNS} FROM documents WHERE tenant_id = $1 AND"
                                            " memory_id > $2::uuid ORDER BY memory_id LIMIT $3", tenant_id, after, batch)
            if not rows:
                return
            yield [document_of_row(r) for r in rows]
            after = rows[-1]["memory_id"]

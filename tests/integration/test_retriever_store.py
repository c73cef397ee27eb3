"""The retriever's adapters on real engines: the PostgreSQL projection and the Qdrant vector index."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from libs.db import Database, apply_migrations, load_migrations
from services.retriever.adapters.postgres import PostgresDocuments
from services.retriever.adapters.vectors import DENSE_SIZE, EdgeVectorIndex, ServerVectorIndex
from services.retriever.domain import Document, SearchQuery

pytestmark = pytest.mark.integration


@pytest.fixture
async def documents(database_url: str, schema: str, db: Database) -> PostgresDocuments:
    await apply_migrations(database_url, schema, load_migrations("services.retriever"))
    return PostgresDocuments(db)


def document(tenant: str, content: str, memory_id: str | None = None) -> Document:
    from libs.text import tokenize

    return Document(memory_id=memory_id or str(uuid.uuid4()), tenant_id=tenant, user_id="u1", session_id="",
                    layer=5, source=2, confidence=1, content=content, terms=tuple(tokenize(content)), tags=(),
                    created_at=datetime.now(UTC), expires_at=None)


async def test_a_memory_forgotten_before_its_written_event_arrives_is_never_indexed(
    documents: PostgresDocuments,
) -> None:
    late = document("acme", "the old address was 12 Elm Street")
    await documents.delete("acme", [late.memory_id])  # memory.forgotten handled first
    await documents.upsert(late)  # then a retried memory.written
    query = SearchQuery(tenant_id="acme", user_id="", text="Elm Street").validated()
    assert await documents.candidates(query, 10) == []


async def test_candidates_never_cross_tenants(documents: PostgresDocuments) -> None:
    await documents.upsert(document("acme", "quarterly revenue report"))
    await documents.upsert(document("globex", "quarterly revenue forecast"))
    query = SearchQuery(tenant_id="acme", user_id="", text="quarterly revenue").validated()
    assert [d.tenant_id for d in await documents.candidates(query, 10)] == ["acme"]


def _exercise(index) -> None:
    """The same body for the embedded engine and the server client: tenant isolation on every operation."""
    rng = random.Random(7)

    def vector() -> list[float]:
        return [rng.uniform(-1, 1) for _ in range(DENSE_SIZE)]

    mine = {str(uuid.uuid4()): vector() for _ in range(5)}
    theirs = {str(uuid.uuid4()): vector() for _ in range(5)}
    for memory_id, dense in mine.items():
        index.upsert("acme", memory_id, dense)
    for memory_id, dense in theirs.items():
        index.upsert("globex", memory_id, dense)
    assert (index.count("acme"), index.count("globex"), index.count()) == (5, 5, 10)
    target = next(iter(theirs))
    hits = index.search("acme", theirs[target], limit=10)
    assert {memory_id for memory_id, _ in hits} == set(mine)  # the nearest point is globex's: never shown
    index.delete("acme", [target, *list(mine)[:2]])  # naming another tenant's id deletes nothing of theirs
    assert (index.count("acme"), index.count("globex")) == (3, 5)


def test_the_embedded_qdrant_index_keeps_tenants_apart_and_survives_a_reopen(tmp_path: Path) -> None:
    index = EdgeVectorIndex(tmp_path / "memories", hnsw_m=8, hnsw_ef_construct=50)
    _exercise(index)
    index.close()
    reopened = EdgeVectorIndex(tmp_path / "memories")
    assert reopened.count() == 8
    reopened.close()


def test_the_qdrant_server_client_keeps_tenants_apart() -> None:
    index = ServerVectorIndex(":memory:", hnsw_m=8, hnsw_ef_construct=50)
    _exercise(index)
    index.close()


class FlakyIndex:
    """The real embedded index, unreachable while `down` is set (as a Qdrant server outage would be)."""

    def __init__(self, index: EdgeVectorIndex) -> None:
        self.index, self.down = index, False

    def delete(self, tenant_id: str, memory_ids: list[str]) -> None:
        if self.down:
            from qdrant_client.http.exceptions import ResponseHandlingException

            raise ResponseHandlingException(ConnectionRefusedError("Qdrant is down"))
        self.index.delete(tenant_id, memory_ids)


async def test_concurrent_written_and_forgotten_events_in_either_order_never_bring_a_memory_back(
    database_url: str, schema: str, db: Database, tmp_path: Path
) -> None:
    import asyncio

    from libs.events import Envelope
    from libs.idempotency import idempotent
    from libs.protogen.mnemesh.v1 import common_pb2, events_pb2
    from libs.transient import is_transient
    from services.retriever.entrypoints.streams import on_memory_event

    await apply_migrations(database_url, schema, load_migrations("services.retriever"))
    edge = EdgeVectorIndex(tmp_path / "memories", hnsw_m=8, hnsw_ef_construct=50)
    index = FlakyIndex(edge)
    handle = idempotent(db, "retriever", on_memory_event(lambda conn: PostgresDocuments(db, conn), index))
    rng = random.Random(11)
    ids = [str(uuid.uuid4()) for _ in range(40)]
    for memory_id in ids:  # the vectors the embedding path will have written
        edge.upsert("acme", memory_id, [rng.uniform(-1, 1) for _ in range(DENSE_SIZE)])

    def written(memory_id: str) -> Envelope:
        memory = common_pb2.Memory(memory_id=memory_id, tenant=common_pb2.TenantContext(tenant_id="acme",
                                                                                        user_id="u1"),
                                   layer=5, source=2, confidence=1, content=f"memory {memory_id[:8]} about Elm")
        memory.created_at.GetCurrentTime()
        return Envelope.wrap(events_pb2.MemoryWritten(memory=memory), event_type="memory.written", tenant_id="acme")

    def forgotten(memory_id: str) -> Envelope:
        message = events_pb2.MemoryForgotten(tenant=common_pb2.TenantContext(tenant_id="acme", user_id="u1"),
                                             memory_ids=[memory_id], reason="forget requested")
        return Envelope.wrap(message, event_type="memory.forgotten", tenant_id="acme")

    async def deliver(envelope: Envelope) -> None:
        """As the bus does: a transient failure leaves the event pending, and it comes again."""
        while True:
            try:
                return await handle(envelope)
            except Exception as exc:  # noqa: BLE001 - only transient failures may be retried here
                assert is_transient(exc), exc
                await asyncio.sleep(0.05)

    async def outage() -> None:
        index.down = True
        await asyncio.sleep(0.3)
        index.down = False

    pairs = []
    for n, memory_id in enumerate(ids):
        w, f = written(memory_id), forgotten(memory_id)
        pairs.append(deliver(w) if n % 2 else deliver(f))
        pairs.append(deliver(f) if n % 2 else deliver(w))
    rng.shuffle(pairs)
    await asyncio.gather(outage(), *pairs)

    async with db.system_transaction() as conn:
        left = await conn.fetchval("SELECT count(*) FROM documents WHERE memory_id = ANY($1::uuid[])", ids)
        tombstones = await conn.fetchval("SELECT count(*) FROM tombstones WHERE memory_id = ANY($1::uuid[])", ids)
    vectors = edge.count("acme")
    edge.close()
    assert (left, tombstones, vectors) == (0, len(ids), 0)

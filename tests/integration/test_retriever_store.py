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

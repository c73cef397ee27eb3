"""The retriever's adapters on real engines: the PostgreSQL projection and both Qdrant engines (one contract)."""

from __future__ import annotations

import asyncio
import random
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from libs.db import Database, apply_migrations, load_migrations
from services.retriever.adapters.embedders import HashEmbedder
from services.retriever.adapters.postgres import PostgresDocuments
from services.retriever.adapters.vectors import EdgeVectorIndex, IndexQuery, ServerVectorIndex
from services.retriever.domain import Bm25, Document, SearchQuery
from services.retriever.service_layer.batching import BatchingEmbedder
from services.retriever.service_layer.handlers import Retrieval

pytestmark = pytest.mark.integration

DIM = 64
NOW = datetime.now(UTC)


@pytest.fixture
async def documents(database_url: str, schema: str, db: Database) -> PostgresDocuments:
    await apply_migrations(database_url, schema, load_migrations("services.retriever"))
    return PostgresDocuments(db)


def document(tenant: str, content: str, memory_id: str | None = None, **kw) -> Document:
    fields = dict(memory_id=memory_id or str(uuid.uuid4()), tenant_id=tenant, user_id="u1", session_id="",
                  layer=5, source=2, confidence=1, content=content, terms=(), tags=(), created_at=NOW,
                  expires_at=None)
    return Document(**{**fields, **kw})


async def test_a_memory_forgotten_before_its_written_event_arrives_is_never_indexed(
    documents: PostgresDocuments,
) -> None:
    late = document("acme", "the old address was 12 Elm Street")
    upserted = []

    async def vectors() -> None:
        upserted.append(late.memory_id)

    await documents.delete("acme", [late.memory_id])  # memory.forgotten handled first
    assert await documents.upsert(late, then=vectors) is False  # then a retried memory.written
    assert await documents.fetch("acme", [late.memory_id]) == {} and upserted == []


async def test_documents_are_read_back_whole_and_never_across_tenants(documents: PostgresDocuments) -> None:
    mine = document("acme", "quarterly revenue report", key="report.q3", derived_from=("step-9",),
                    attributes={"amount": 12.5, "customer": "X"}, tags=("finance",))
    theirs = document("globex", "quarterly revenue forecast")
    await documents.upsert(mine)
    await documents.upsert(theirs)
    found = await documents.fetch("acme", [mine.memory_id, theirs.memory_id])
    assert list(found) == [mine.memory_id]
    assert found[mine.memory_id] == mine and found[mine.memory_id].attributes == mine.attributes


# --- one contract, both engines ------------------------------------------------------------------------------


async def test_two_projectors_take_disjoint_full_batches_at_once(documents: PostgresDocuments) -> None:
    """The oldest queued documents are the batch another projector holds: the next projector skips them and
    takes the next ones (it used to find every candidate locked, take nothing and sleep until the next
    commit, leaving one projector to do all the work while the model waited for it)."""
    recorded = [document("acme", f"memory number {n}") for n in range(20)]
    await documents.record_many([(d, 0) for d in recorded])
    async with documents.pending(8) as first, documents.pending(8) as second:
        async with documents.pending(8) as third:
            assert (len(first), len(second), len(third)) == (8, 8, 4)
            taken = [d.memory_id for d in (*first, *second, *third)]
            assert sorted(taken) == sorted(d.memory_id for d in recorded)  # each exactly once
    async with documents.pending(8) as rest:
        assert rest == []  # all three batches were marked projected


@pytest.fixture(params=["edge", "server"])
def index(request, tmp_path: Path):
    if request.param == "edge":
        engine = EdgeVectorIndex(tmp_path / "memories", dim=DIM, hnsw_m=8, hnsw_ef_construct=50)
    else:
        engine = ServerVectorIndex(":memory:", dim=DIM, hnsw_m=8, hnsw_ef_construct=50)
    yield engine
    engine.close()


def _encode(docs: list[Document]):
    embedder, bm25 = HashEmbedder(DIM), Bm25()
    return [(d, v, bm25.document(d.content)) for d, v in zip(docs, embedder.embed([d.content for d in docs]),
                                                              strict=True)]


def _ask(index, text: str, mode: str = "hybrid", **kw) -> tuple[list[str], list[str]]:
    q = SearchQuery(tenant_id=kw.pop("tenant_id", "acme"), user_id=kw.pop("user_id", ""), text=text,
                    mode=mode, **kw).validated()
    dense = HashEmbedder(DIM).embed([text])[0] if mode != "sparse" else None
    sparse = Bm25().query(text) if mode != "dense" else None
    d, s = index.query(IndexQuery(q, dense, sparse, NOW, 50))
    return [m for m, _ in d], [m for m, _ in s]


def test_both_engines_keep_tenants_apart_on_every_operation(index) -> None:
    mine = [document("acme", f"invoice number {n} for the harbour office") for n in range(5)]
    theirs = [document("globex", "invoice for the harbour office") for _ in range(5)]
    index.upsert(_encode(mine + theirs))
    assert (index.count("acme"), index.count("globex"), index.count()) == (5, 5, 10)
    dense, sparse = _ask(index, "invoice for the harbour office")
    assert set(dense) == set(sparse) == {d.memory_id for d in mine}  # their exact match is never shown
    index.delete("acme", [theirs[0].memory_id, mine[0].memory_id, mine[1].memory_id])  # naming theirs: no-op
    assert (index.count("acme"), index.count("globex")) == (3, 5)


def test_both_engines_apply_every_filter(index) -> None:
    base = dict(tags=("travel",))
    docs = {
        "match": document("acme", "passport renewal", **base),
        "user": document("acme", "passport renewal", user_id="u2", **base),
        "session": document("acme", "passport renewal", session_id="other", **base),
        "layer": document("acme", "passport renewal", layer=1, **base),
        "tag": document("acme", "passport renewal"),
        "old": document("acme", "passport renewal", created_at=NOW - timedelta(days=40), **base),
        "weak": document("acme", "passport renewal", confidence=3, **base),
        "archived": document("acme", "passport renewal", archived=True, **base),
        "expired": document("acme", "passport renewal", expires_at=NOW - timedelta(seconds=1), **base),
    }
    docs = {k: Document(**{**d.__dict__, "session_id": d.session_id or "s1"}) for k, d in docs.items()}
    index.upsert(_encode(list(docs.values())))
    name = {d.memory_id: k for k, d in docs.items()}
    filters = dict(user_id="u1", session_id="s1", layers=(5,), tags=("travel",), since=NOW - timedelta(days=30),
                   until=NOW + timedelta(seconds=1), min_confidence=2)
    for mode in ("dense", "sparse"):
        dense, sparse = _ask(index, "passport renewal", mode, **filters)
        assert {name[m] for m in dense + sparse} == {"match"}, mode
    dense, _ = _ask(index, "passport renewal", "dense", include_archived=True, **filters)
    assert {name[m] for m in dense} == {"match", "archived"}


def test_both_engines_rank_by_bm25_and_rerank_sparse_candidates_in_two_stage_mode(index) -> None:
    docs = [document("acme", "passport renewal passport"), document("acme", "renewal of the lease and the car"),
            document("acme", "tea with grandmother")]
    index.upsert(_encode(docs))
    _, sparse = _ask(index, "passport renewal", "sparse")
    assert sparse == [docs[0].memory_id, docs[1].memory_id]  # idf: the rarer term weighs more; no overlap: absent
    q = SearchQuery(tenant_id="acme", user_id="", text="passport renewal").validated()
    dense, _ = index.query(IndexQuery(q, HashEmbedder(DIM).embed(["tea"])[0], Bm25().query("passport renewal"),
                                      NOW, 10, two_stage=True))
    assert {m for m, _ in dense} == {docs[0].memory_id, docs[1].memory_id}


def test_the_embedded_engine_survives_a_reopen(tmp_path: Path) -> None:
    index = EdgeVectorIndex(tmp_path / "memories", dim=DIM)
    index.upsert(_encode([document("acme", "kept across restarts")]))
    index.close()
    reopened = EdgeVectorIndex(tmp_path / "memories", dim=DIM)
    assert reopened.count("acme") == 1 and _ask(reopened, "restarts", "sparse")[1]
    reopened.close()


# --- the real upsert path against concurrent forgetting -------------------------------------------------------


class FlakyIndex:
    """The real embedded index, unreachable while `down` is set (as a Qdrant server outage would be)."""

    def __init__(self, index: EdgeVectorIndex) -> None:
        self.index, self.down = index, False

    def _check(self) -> None:
        if self.down:
            from qdrant_client.http.exceptions import ResponseHandlingException

            raise ResponseHandlingException(ConnectionRefusedError("Qdrant is down"))

    def upsert(self, documents) -> None:
        self._check()
        self.index.upsert(documents)

    def delete(self, tenant_id: str, memory_ids: list[str]) -> None:
        self._check()
        self.index.delete(tenant_id, memory_ids)


async def test_concurrent_written_and_forgotten_events_in_either_order_never_leave_a_memory_in_either_store(
    database_url: str, schema: str, db: Database, tmp_path: Path
) -> None:
    from libs.db.notify import Notifier
    from libs.events import Envelope
    from libs.idempotency import idempotent
    from libs.protogen.mnemesh.v1 import common_pb2, events_pb2
    from libs.transient import is_transient
    from services.retriever.entrypoints.streams import on_memory_event
    from services.retriever.service_layer.projector import Projector

    await apply_migrations(database_url, schema, load_migrations("services.retriever"))
    edge = EdgeVectorIndex(tmp_path / "memories", dim=DIM, hnsw_m=8, hnsw_ef_construct=50)
    index = FlakyIndex(edge)
    retrieval = Retrieval(index, BatchingEmbedder(HashEmbedder(DIM)), Bm25())
    handle = idempotent(db, "retriever", on_memory_event(lambda conn: PostgresDocuments(db, conn), retrieval))
    rng = random.Random(11)
    ids = [str(uuid.uuid4()) for _ in range(40)]
    kept = [str(uuid.uuid4()) for _ in range(5)]  # written only: must be in both stores at the end

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

    pairs = [deliver(written(m)) for m in kept]
    for n, memory_id in enumerate(ids):
        w, f = written(memory_id), forgotten(memory_id)
        pairs.append(deliver(w) if n % 2 else deliver(f))
        pairs.append(deliver(f) if n % 2 else deliver(w))
    rng.shuffle(pairs)
    # The projector writes vectors in small batches while the events are handled and the index fails.
    notifier = Notifier(db.connect, PostgresDocuments.channel(db))
    projector = Projector(PostgresDocuments(db), retrieval, notifier.mark, notifier.wait, batch=4)
    running = asyncio.create_task(projector.run())
    try:
        await asyncio.gather(outage(), *pairs)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await notifier.close()
    await projector.drain()  # whatever the running projector had not reached yet

    async with db.system_transaction() as conn:
        left = await conn.fetchval("SELECT count(*) FROM documents WHERE memory_id = ANY($1::uuid[])", ids)
        tombstones = await conn.fetchval("SELECT count(*) FROM tombstones WHERE memory_id = ANY($1::uuid[])", ids)
        documents_kept = await conn.fetchval("SELECT count(*) FROM documents WHERE memory_id = ANY($1::uuid[])", kept)
        unprojected = await conn.fetchval("SELECT count(*) FROM documents WHERE NOT projected")
    vectors = edge.count("acme")
    edge.close()
    assert (left, tombstones, documents_kept, unprojected, vectors) == (0, len(ids), len(kept), 0, len(kept))


async def test_amending_a_memory_rewrites_its_payload_in_place_without_embedding_it_again(
    documents: PostgresDocuments, index,
) -> None:
    from services.retriever.service_layer.handlers import (
        archive_documents,
        confirm_document,
        index_document,
        merge_into_document,
    )

    calls: list[int] = []

    class Counting(HashEmbedder):
        def embed(self, texts: list[str]) -> list[list[float]]:
            calls.append(len(texts))
            return super().embed(texts)

    retrieval = Retrieval(index, BatchingEmbedder(Counting(DIM)), Bm25())
    d = document("acme", "passport renewal at the embassy", confidence=2)
    await index_document(d, documents, retrieval)
    assert calls == [1]

    def payload() -> dict:
        return index.retrieve("acme", [d.memory_id])[d.memory_id]

    assert await archive_documents("acme", [d.memory_id], documents, index) == 1
    assert payload()["archived"] == 1  # at once, not after a projection cycle
    assert await confirm_document("acme", d.memory_id, 1, NOW + timedelta(days=30), documents, index=index) == 1
    assert payload()["archived"] == 0 and payload()["confidence"] == 1
    assert payload()["expires_at"] == pytest.approx((NOW + timedelta(days=30)).timestamp())
    assert await merge_into_document("acme", d.memory_id, 3.0, ["travel"], ["turn-1"], documents, index) == 1
    assert payload()["engagement"] == 3.0 and payload()["tags"] == ["travel"] and payload()["derived_from"] == ["turn-1"]
    assert await archive_documents("globex", [d.memory_id], documents, index) == 0  # another tenant's: untouched
    assert payload()["archived"] == 0 and payload()["content"] == d.content
    assert calls == [1]  # nothing was embedded again
    async with documents.pending(10) as queued:
        assert queued == []  # nor queued for the projector

"""Search on the real path: the multilingual model, BM25, the embedded Qdrant engine, PostgreSQL, the stream handler."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from libs.db import Database, apply_migrations, load_migrations
from libs.events import Envelope
from libs.protogen.mnemesh.v1 import common_pb2, events_pb2, memory_pb2
from services.retriever.adapters.embedders import UseEmbedder
from services.retriever.adapters.mapping import query_from_proto
from services.retriever.adapters.memory import InMemoryDocuments
from services.retriever.adapters.postgres import PostgresDocuments
from services.retriever.adapters.vectors import EdgeVectorIndex
from services.retriever.domain import Bm25, Document, SearchQuery
from services.retriever.evaluation import DATASET, evaluate, load_dataset
from services.retriever.service_layer.batching import BatchingEmbedder
from services.retriever.service_layer.handlers import Retrieval, index_document, project_pending, search

pytestmark = pytest.mark.integration

NOW = datetime.now(UTC)


@pytest.fixture(scope="session")
def model() -> UseEmbedder:
    return UseEmbedder()  # loaded once for the session (about a second)


@pytest.fixture
def retrieval(model: UseEmbedder, tmp_path: Path):
    index = EdgeVectorIndex(tmp_path / "memories", dim=model.dim, hnsw_m=8, hnsw_ef_construct=50)
    yield Retrieval(index, BatchingEmbedder(model), Bm25())
    index.close()


@pytest.fixture
async def documents(database_url: str, schema: str, db: Database) -> PostgresDocuments:
    await apply_migrations(database_url, schema, load_migrations("services.retriever"))
    return PostgresDocuments(db)


def document(tenant: str, content: str, **kw) -> Document:
    fields = dict(memory_id=str(uuid.uuid4()), tenant_id=tenant, user_id="u1", session_id="s1", layer=5, source=2,
                  confidence=1, content=content, terms=(), tags=(), created_at=NOW, expires_at=None)
    return Document(**{**fields, **kw})


async def test_hybrid_beats_each_single_mode_on_the_shipped_dataset(retrieval: Retrieval) -> None:
    report = await evaluate(load_dataset(DATASET), InMemoryDocuments(), retrieval, progress=False,
                            modes=("dense", "sparse", "hybrid"))
    overall = {mode: r["overall"] for mode, r in report["results"].items()}
    for metric in ("mrr", "ndcg@10", "recall@5"):
        assert overall["hybrid"][metric] > overall["dense"][metric], (metric, overall)
        assert overall["hybrid"][metric] > overall["sparse"][metric], (metric, overall)


CHINESE = ["我的护照下个月就要过期了，得去出入境办理换证", "周末和朋友去西湖边骑自行车", "公司年会定在十二月二十号",
           "我对青霉素过敏，看病时要提醒医生", "女儿的钢琴老师姓刘"]


async def test_chinese_queries_find_chinese_memories_by_keyword_and_by_meaning(
    documents: PostgresDocuments, retrieval: Retrieval
) -> None:
    docs = [document("acme", text) for text in CHINESE]
    for d in docs:
        await index_document(d, documents, retrieval)

    async def top(text: str, mode: str) -> str:
        hits = await search(SearchQuery("acme", "u1", text, mode=mode), documents, retrieval)
        return hits[0].document.content

    assert await top("护照", "sparse") == CHINESE[0]  # by keyword
    assert await top("青霉素", "sparse") == CHINESE[3]
    assert await top("出国用的证件快失效了", "dense") == CHINESE[0]  # by meaning: no shared word
    assert await top("哪些药物不能用", "dense") == CHINESE[3]
    assert await top("孩子学乐器的老师是谁", "full") == CHINESE[4]


async def test_tenant_a_never_sees_tenant_b_whatever_the_request_says(
    documents: PostgresDocuments, retrieval: Retrieval
) -> None:
    rng = random.Random(5)
    texts = ["the invoice for the harbour office", "my phone plan renewal", "dinner with the Lindqvists",
             "我的电话号码换了", "project launch in December"]
    for tenant in ("acme", "globex"):
        for text in texts:
            await index_document(document(tenant, text, user_id=rng.choice(["u1", "u2"]), layer=rng.choice([1, 5]),
                                          tags=tuple(rng.sample(["a", "b"], rng.randint(0, 2)))), documents, retrieval)
    for _ in range(60):
        request = memory_pb2.SearchRequest(
            tenant=common_pb2.TenantContext(tenant_id=rng.choice(["acme", "globex", "*", ""]),
                                            user_id=rng.choice(["", "u1", "u2"])),
            query=rng.choice(texts + ["invoice", "电话", "office phone"]), limit=rng.randint(1, 20),
            mode=rng.choice(["dense", "sparse", "hybrid", "full"]), fusion=rng.choice(["rrf", "score"]),
            include_archived=rng.random() < 0.5, two_stage=rng.random() < 0.3,
            layers=rng.sample([1, 5], rng.randint(0, 1)), tags=rng.sample(["a", "b"], rng.randint(0, 1)))
        hits = await search(query_from_proto(request, tenant_id="acme"), documents, retrieval)
        assert {h.document.tenant_id for h in hits} <= {"acme"}, request


async def test_every_memory_event_kind_shows_in_search_after_one_projection_cycle(
    db: Database, documents: PostgresDocuments, retrieval: Retrieval
) -> None:
    from libs.events.schema import EVENT_TYPES
    from libs.idempotency import idempotent
    from services.retriever.entrypoints.streams import on_memory_event

    handle = idempotent(db, "retriever", on_memory_event(lambda conn: PostgresDocuments(db, conn), retrieval))
    tenant = common_pb2.TenantContext(tenant_id="acme", user_id="u1")
    ids = [str(uuid.uuid4()) for _ in range(7)]
    expired, archived, old, quarantined, candidate, merged, new = ids

    def written(memory_id: str, content: str, version: int = 1, **kw) -> Envelope:
        memory = common_pb2.Memory(memory_id=memory_id, tenant=tenant, layer=5, source=2, content=content,
                                   **{"confidence": 1, **kw})
        memory.created_at.FromDatetime(NOW)
        return Envelope.wrap(events_pb2.MemoryWritten(memory=memory, version=version), event_type="memory.written",
                             tenant_id="acme")

    def event(kind: str, **fields) -> Envelope:
        return Envelope.wrap(EVENT_TYPES[kind].message(tenant=tenant, **fields), event_type=kind, tenant_id="acme")

    async def found(*envelopes: Envelope, include_archived: bool = False) -> set[str]:
        for envelope in envelopes:
            await handle(envelope)
            await handle(envelope)  # a redelivery: idempotent per event id
        await project_pending(documents, retrieval)  # one projection cycle
        hits = await search(SearchQuery("acme", "u1", "passport", mode="hybrid", include_archived=include_archived),
                            documents, retrieval)
        return {h.document.memory_id for h in hits}

    texts = ["passport expired note", "passport archived note", "passport old number", "passport held note",
             "passport candidate note", "passport merged note"]
    assert await found(*(written(m, t) for m, t in zip(ids, texts, strict=False))) == set(ids[:6])
    assert await found(event("memory.expired", memory_ids=[expired])) == set(ids[1:6])
    assert await found(written(expired, "passport expired note again", version=2)) == set(ids[1:6])  # final
    assert await found(event("memory.archived", memory_ids=[archived])) == {old, quarantined, candidate, merged}
    assert archived in await found(include_archived=True)
    assert await found(written(new, "passport new number"),
                       event("memory.corrected", key="passport", old_memory_id=old, new_memory_id=new)) == {
        quarantined, candidate, merged, new}
    assert await found(event("memory.quarantined", memory_id=quarantined)) == {candidate, merged, new}
    assert quarantined not in await found(include_archived=True)
    assert await found(event("memory.released", memory_id=quarantined),
                       written(quarantined, "passport held note", version=2)) == {quarantined, candidate, merged, new}
    assert await found(written(candidate, "passport candidate note", version=2, confidence=2,
                               status=common_pb2.MEMORY_STATUS_CANDIDATE)) == {quarantined, merged, new}
    assert await found(event("memory.confirmed", memory_id=candidate, key="passport", confidence=1,
                             supersedes=new)) == {quarantined, candidate, merged}
    payload = retrieval.index.retrieve("acme", [candidate])[candidate]
    assert payload["confidence"] == 1 and payload["archived"] == 0
    assert await found(event("memory.merged", memory_id=merged, engagement=4.0, tags=["travel"],
                             merged_count=2)) == {quarantined, candidate, merged}
    assert retrieval.index.retrieve("acme", [merged])[merged]["engagement"] == 4.0
    assert (await documents.fetch("acme", [merged]))[merged].tags == ("travel",)
    assert await found(event("memory.session_compressed", summary_memory_id=merged,
                             covered_memory_ids=[quarantined])) == {quarantined, candidate, merged}
    assert await found(event("memory.forgotten", memory_ids=[quarantined, candidate, merged])) == set()
    assert retrieval.index.count("acme") == 3  # archived and the two superseded values, kept for History


async def test_forgotten_and_expired_memories_leave_search_within_one_projection_cycle(
    db: Database, documents: PostgresDocuments, retrieval: Retrieval
) -> None:
    from libs.idempotency import idempotent
    from services.retriever.entrypoints.streams import on_memory_event

    handle = idempotent(db, "retriever", on_memory_event(lambda conn: PostgresDocuments(db, conn), retrieval))
    tenant = common_pb2.TenantContext(tenant_id="acme", user_id="u1")

    def written(content: str, expires: datetime | None = None) -> tuple[str, Envelope]:
        memory = common_pb2.Memory(memory_id=str(uuid.uuid4()), tenant=tenant, layer=5, source=2, confidence=1,
                                   content=content)
        memory.created_at.FromDatetime(NOW)
        if expires:
            memory.expires_at.FromDatetime(expires)
        return memory.memory_id, Envelope.wrap(events_pb2.MemoryWritten(memory=memory), event_type="memory.written",
                                               tenant_id="acme")

    forgotten_id, w1 = written("my passport number is in the drawer")
    expiring_id, w2 = written("my passport photo appointment", expires=NOW + timedelta(hours=1))
    for envelope in (w1, w2):
        await handle(envelope)

    async def found(now: datetime | None = None) -> set[str]:
        hits = await search(SearchQuery("acme", "u1", "passport", mode="hybrid"), documents, retrieval, now=now)
        return {h.document.memory_id for h in hits}

    assert await found() == set()  # recorded, not projected yet
    assert await project_pending(documents, retrieval) == 2  # one projection cycle
    assert await found() == {forgotten_id, expiring_id}
    await handle(Envelope.wrap(events_pb2.MemoryForgotten(tenant=tenant, memory_ids=[forgotten_id]),
                               event_type="memory.forgotten", tenant_id="acme"))
    assert await found() == {expiring_id}
    assert await found(now=NOW + timedelta(hours=2)) == set()  # expired: filtered in the index and again after
    assert retrieval.index.count("acme") == 1


async def test_a_batch_of_memory_events_is_applied_in_order_and_one_bad_event_fails_alone(
    db: Database, documents: PostgresDocuments, retrieval: Retrieval
) -> None:
    from services.retriever.entrypoints.streams import on_memory_batch

    handle = on_memory_batch(lambda conn: PostgresDocuments(db, conn), retrieval)
    tenant = common_pb2.TenantContext(tenant_id="acme", user_id="u1")

    def written(memory_id: str, content: str) -> Envelope:
        memory = common_pb2.Memory(memory_id=memory_id, tenant=tenant, layer=5, source=2, confidence=1,
                                   content=content)
        memory.created_at.FromDatetime(NOW)
        return Envelope.wrap(events_pb2.MemoryWritten(memory=memory, version=1), event_type="memory.written",
                             tenant_id="acme")

    a, b, c = (str(uuid.uuid4()) for _ in range(3))
    batch = [written(a, "passport office visit"), written(b, "passport photo booth"),
             Envelope.wrap(events_pb2.MemoryForgotten(tenant=tenant, memory_ids=[a]), event_type="memory.forgotten",
                           tenant_id="acme"),
             written("not-a-uuid", "passport broken event"), written(c, "passport renewal form"),
             written(a, "passport office visit again")]  # after its forget: stays forgotten
    async with db.transaction("acme") as conn:
        outcomes = await handle("acme", batch, conn)
    assert [o is None for o in outcomes] == [True, True, True, False, True, True]
    while await project_pending(documents, retrieval):
        pass
    hits = await search(SearchQuery("acme", "u1", "passport", mode="sparse"), documents, retrieval)
    assert {h.document.memory_id for h in hits} == {b, c}

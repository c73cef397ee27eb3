"""`mnemesh index rebuild`: a fresh generation of the vector index, swapped in under concurrent searches and
writes, on both engines (the embedded one, and qdrant-client's local mode standing in for a server)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest

from libs.auth import TokenVerifier, issue_token
from libs.config import load_settings
from libs.db import Database, apply_migrations, load_migrations
from libs.protogen.mnemesh.v1 import memory_pb2, memory_pb2_grpc
from libs.rpc import GrpcServer, channel
from mnemesh.infra import free_port
from services.retriever.adapters.embedders import HashEmbedder
from services.retriever.adapters.generations import EdgeGenerations, RebuildRunning, ServerGenerations, SwitchableIndex
from services.retriever.adapters.postgres import PostgresDocuments
from services.retriever.adapters.structured import PostgresQueries
from services.retriever.domain import Bm25, Document, SearchQuery
from services.retriever.entrypoints import grpc_api
from services.retriever.service_layer.batching import BatchingEmbedder
from services.retriever.service_layer.handlers import Retrieval, forget_documents, index_document, search
from services.retriever.service_layer.rebuild import rebuild_index

pytestmark = pytest.mark.integration

DIM = 64
NOW = datetime.now(UTC)
MEMORIES = 400


def document(content: str) -> Document:
    return Document(memory_id=str(uuid.uuid4()), tenant_id="acme", user_id="u1", session_id="", layer=5, source=2,
                    confidence=1, content=content, terms=(), tags=(), created_at=NOW, expires_at=None)


@pytest.fixture
async def documents(database_url: str, schema: str, db: Database) -> PostgresDocuments:
    await apply_migrations(database_url, schema, load_migrations("services.retriever"))
    return PostgresDocuments(db)


@pytest.fixture(params=["edge", "server"])
def generations(request, tmp_path: Path):
    if request.param == "edge":
        return EdgeGenerations(tmp_path / "qdrant", dim=DIM, hnsw_m=8, hnsw_ef_construct=50)
    return ServerGenerations(":memory:", dim=DIM, hnsw_m=8, hnsw_ef_construct=50)


def _gone(generations, name: str) -> bool:
    if isinstance(generations, EdgeGenerations):
        return not (generations.base / name).exists()
    return not generations.client.collection_exists(name)


async def test_rebuild_under_concurrent_searches_and_writes_has_no_failed_search(
    documents: PostgresDocuments, generations,
) -> None:
    switch = SwitchableIndex(generations)
    r = Retrieval(switch, BatchingEmbedder(HashEmbedder(DIM)), Bm25())
    docs = [document(f"harbour office invoice number {i}") for i in range(MEMORIES)]
    for start in range(0, MEMORIES, 50):
        await asyncio.gather(*(index_document(d, documents, r) for d in docs[start:start + 50]))
    before = switch.name
    failures: list[BaseException] = []
    answered = [0]
    stop = asyncio.Event()

    async def searcher() -> None:
        while not stop.is_set():
            try:
                hits = await search(SearchQuery("acme", "", "harbour office invoice", mode="hybrid", limit=10),
                                    documents, r)
                if len(hits) != 10:
                    failures.append(AssertionError(f"{len(hits)} hits"))
                answered[0] += 1
            except Exception as exc:  # noqa: BLE001 - every failure is what this test counts
                failures.append(exc)
            await asyncio.sleep(0)

    added = [document(f"lighthouse keeper note {i}") for i in range(20)]
    forgotten = docs[:20]  # in id order, some copied before their forget, some after

    async def write(i: int) -> None:
        await index_document(added[i], documents, r)
        await forget_documents("acme", [forgotten[i].memory_id], documents, switch)

    # Another replica (a server behind several retrievers) writes the old generation only, during the copy: a
    # memory whose id the copy has passed, and a forget of one it has copied. The catch-up must apply both.
    other = Retrieval(switch.current, BatchingEmbedder(HashEmbedder(DIM)), Bm25())
    elsewhere = document("harbour office invoice recorded by another replica")
    elsewhere = Document(**{**elsewhere.__dict__, "memory_id": "00000000-0000-4000-8000-000000000001"})
    victim = min(docs[20:], key=lambda d: d.memory_id)
    searchers = [asyncio.create_task(searcher()) for _ in range(3)]
    try:
        rebuild = rebuild_index(documents, r, batch=50)
        first = await anext(rebuild)  # the fresh generation exists, nothing copied yet
        assert (first.phase, first.done, first.total) == ("copying", 0, MEMORIES)
        with pytest.raises(RebuildRunning):
            await anext(rebuild_index(documents, r))  # one rebuild at a time
        for i in range(10):
            await write(i)
        assert (await anext(rebuild)).done == 50
        await index_document(elsewhere, documents, other)
        await forget_documents("acme", [victim.memory_id], documents, other.index)
        for i in range(10, 20):
            await write(i)
        rest = [p async for p in rebuild]
    finally:
        stop.set()
        await asyncio.gather(*searchers)
    assert failures == [] and answered[0] > 0
    assert rest[-1].phase == "swapped" and switch.name == rest[-1].index != before
    assert switch.count("acme") == MEMORIES  # 400 - 20 forgotten + 20 added - victim + elsewhere
    assert switch.retrieve("acme", [d.memory_id for d in forgotten] + [victim.memory_id]) == {}
    assert list(switch.retrieve("acme", [elsewhere.memory_id])) == [elsewhere.memory_id]
    assert set(switch.retrieve("acme", [d.memory_id for d in added])) == {d.memory_id for d in added}
    assert _gone(generations, before)
    hits = await search(SearchQuery("acme", "", "lighthouse keeper note", mode="sparse", limit=20), documents, r)
    assert {h.document.memory_id for h in hits} == {d.memory_id for d in added}
    switch.close()
    again = SwitchableIndex(generations)  # the next start opens the rebuilt generation
    try:
        assert again.name == rest[-1].index and again.count("acme") == MEMORIES
    finally:
        again.close()


async def test_a_failed_rebuild_leaves_the_current_index_serving(documents: PostgresDocuments, generations) -> None:
    switch = SwitchableIndex(generations)
    r = Retrieval(switch, BatchingEmbedder(HashEmbedder(DIM)), Bm25())
    for d in [document(f"harbour office invoice number {i}") for i in range(30)]:
        await index_document(d, documents, r)
    before = switch.name
    rebuild = rebuild_index(documents, r, batch=10)
    fresh = (await anext(rebuild)).index
    await rebuild.aclose()  # the caller went away mid-copy
    assert switch.name == before and switch.fresh is None and _gone(generations, fresh)
    assert len(await search(SearchQuery("acme", "", "harbour invoice", mode="hybrid"), documents, r)) == 10
    switch.close()


async def test_rebuild_over_grpc_streams_progress_and_needs_the_admin_scope(
    documents: PostgresDocuments, db: Database, tmp_path: Path, capsys, monkeypatch,
) -> None:
    import argparse

    from mnemesh.client_cli import _run
    from mnemesh.index_cli import index_rebuild

    settings = load_settings(jwt_secret="retriever-rebuild-test-secret-0123456789")
    switch = SwitchableIndex(EdgeGenerations(tmp_path / "qdrant", dim=DIM, hnsw_m=8, hnsw_ef_construct=50))
    r = Retrieval(switch, BatchingEmbedder(HashEmbedder(DIM)), Bm25())
    for d in [document(f"harbour office invoice number {i}") for i in range(120)]:
        await index_document(d, documents, r)
    port = free_port()
    server = GrpcServer("127.0.0.1", port, [grpc_api.registration(
        documents, PostgresQueries(db), r, rebuild=lambda batch: rebuild_index(documents, r, batch))],
        TokenVerifier(settings))
    await server.start()
    try:
        reader = issue_token(settings, subject="agent", tenant_id="acme", scopes=["memory:read"])
        async with channel(f"127.0.0.1:{port}", reader) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                [p async for p in memory_pb2_grpc.RetrieverStub(ch).RebuildIndex(memory_pb2.RebuildIndexRequest())]
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        admin = issue_token(settings, subject="ops", tenant_id="acme", scopes=["memory:admin"])
        async with channel(f"127.0.0.1:{port}", admin) as ch:
            progress = [p async for p in memory_pb2_grpc.RetrieverStub(ch).RebuildIndex(
                memory_pb2.RebuildIndexRequest(batch=50))]
        # `mnemesh index rebuild`: the same call, a progress bar on stderr, one JSON line on stdout
        monkeypatch.setenv("MNEMESH_TOKEN", admin)
        cli_settings = settings.model_copy(update={"retriever_grpc_port": port})
        code = await asyncio.to_thread(index_rebuild, cli_settings, argparse.Namespace(batch=100), _run)
        assert code == 0
        printed = capsys.readouterr()
        assert '"phase": "swapped"' in printed.out and '"memories": 120' in printed.out
        assert "rebuild" in printed.err and "120/120" in printed.err
    finally:
        await server.stop(0)
        switch.close()
    assert [(p.phase, p.done) for p in progress] == [("copying", 0), ("copying", 50), ("copying", 100),
                                                     ("copying", 120), ("swapped", 120)]
    assert progress[-1].total == 120 and progress[-1].index

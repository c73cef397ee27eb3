"""Structured queries over the real PostgreSQL projection, the memory router, and both through gRPC."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from google.protobuf import struct_pb2

from libs.auth import TokenVerifier, issue_token
from libs.config import Settings, load_settings
from libs.db import Database, apply_migrations, load_migrations
from libs.errors import ValidationFailed
from libs.protogen.mnemesh.v1 import common_pb2, memory_pb2, memory_pb2_grpc
from libs.rpc import GrpcServer, channel, error_detail
from mnemesh.infra import free_port
from services.retriever.adapters.embedders import HashEmbedder
from services.retriever.adapters.postgres import PostgresDocuments
from services.retriever.adapters.structured import PostgresQueries
from services.retriever.adapters.vectors import EdgeVectorIndex
from services.retriever.domain import Bm25, Document, SearchQuery
from services.retriever.domain.structured import Condition, StructuredQuery
from services.retriever.entrypoints import grpc_api
from services.retriever.service_layer.batching import BatchingEmbedder
from services.retriever.service_layer.handlers import Retrieval, index_document
from services.retriever.service_layer.structured import Vocabularies, query_memories, routed_search

pytestmark = pytest.mark.integration

NOW = datetime.now(UTC)
ORDERS = [  # (customer, amount, what the memory says), in English and in Chinese, with Chinese attribute names
    ({"customer": "Acme", "amount": 1200}, "Acme ordered 40 chairs; they complained the delivery was late"),
    ({"customer": "Acme", "amount": 300}, "Acme asked for a discount on desks"),
    ({"customer": "Acme", "amount": "900"}, "Acme quote sent by e-mail"),  # a string amount: no numeric match
    ({"customer": "Globex", "amount": 5000}, "Globex signed the annual contract"),
    ({"客户": "华为", "金额": 8000}, "华为采购了一批服务器，抱怨交付延迟"),
    ({"客户": "华为", "金额": 200}, "华为询问了售后维修的流程"),
    ({"客户": "小米", "金额": 9000}, "小米订购了会议室设备"),
]


def document(tenant: str, content: str, **kw) -> Document:
    fields = dict(memory_id=str(uuid.uuid4()), tenant_id=tenant, user_id="u1", session_id="s1", layer=5, source=2,
                  confidence=1, content=content, terms=(), tags=(), created_at=NOW, expires_at=None)
    return Document(**{**fields, **kw})


@pytest.fixture
async def stores(database_url: str, schema: str, db: Database, tmp_path: Path):
    await apply_migrations(database_url, schema, load_migrations("services.retriever"))
    index = EdgeVectorIndex(tmp_path / "memories", dim=64, hnsw_m=8, hnsw_ef_construct=50)
    retrieval = Retrieval(index, BatchingEmbedder(HashEmbedder(64)), Bm25())
    documents, queries = PostgresDocuments(db), PostgresQueries(db)
    for tenant in ("acme", "globex"):  # the same data in two tenants: neither may see the other's
        for i, (attributes, content) in enumerate(ORDERS):
            await index_document(document(tenant, content, attributes=attributes,
                                          created_at=NOW - timedelta(minutes=i)), documents, retrieval)
        await index_document(document(tenant, "5000", key="user.budget"), documents, retrieval)
    yield documents, queries, retrieval
    index.close()


def where(*conditions: tuple) -> tuple[Condition, ...]:
    return tuple(Condition(*c) for c in conditions)


async def test_every_memory_of_a_customer_above_an_amount_is_found_exactly_and_only_in_the_tenant(stores) -> None:
    _, queries, _ = stores
    found, truncated = await query_memories(StructuredQuery("acme", where(
        ("attributes.customer", "eq", "Acme"), ("attributes.amount", "gt", 250))), queries)
    assert [d.attributes["amount"] for d in found] == [1200, 300] and not truncated  # newest first; "900" is text
    assert {d.tenant_id for d in found} == {"acme"}
    found, _ = await query_memories(StructuredQuery("acme", where(
        ("attributes.客户", "eq", "华为"), ("attributes.金额", "gte", 1000))), queries)
    assert [d.content for d in found] == [ORDERS[4][1]]
    found, _ = await query_memories(StructuredQuery("acme", where(("attributes.amount", "eq", "900"))), queries)
    assert [d.content for d in found] == [ORDERS[2][1]]  # the string matches as a string only


async def test_entity_values_compare_as_numbers_and_text_conditions_combine(stores) -> None:
    _, queries, _ = stores
    found, _ = await query_memories(StructuredQuery("acme", where(("value", "gte", 4000), ("key", "prefix", "user."))),
                                    queries)
    assert [d.key for d in found] == ["user.budget"]
    found, truncated = await query_memories(StructuredQuery("acme", where(
        ("attributes.customer", "in", ["Acme", "Globex"]), ("content", "contains", "ACME")), limit=2), queries)
    assert len(found) == 2 and truncated and all("Acme" in d.content for d in found)
    found, _ = await query_memories(StructuredQuery("acme", where(("attributes.金额", "exists", None)),
                                                    order_by="attributes.金额", ascending=True), queries)
    assert [d.attributes["金额"] for d in found] == [200, 8000, 9000]


async def test_a_condition_of_the_wrong_type_is_refused_naming_the_field(stores) -> None:
    _, queries, _ = stores
    for conditions, field in [(where(("layer", "eq", "five")), "where[0].value"),
                              (where(("attributes.amount", "gt", True)), "where[0].value"),
                              (where(("colour", "eq", "red")), "where[0].field"),
                              (where(("key", "gt", "a"), ("tags", "eq", "x")), "where[1].op"),
                              (where(("created_at", "gt", "yesterday")), "where[0].value"),
                              ((), "where")]:
        with pytest.raises(ValidationFailed) as caught:
            await query_memories(StructuredQuery("acme", conditions), queries)
        assert caught.value.field == field and caught.value.hint


@pytest.mark.parametrize("text, path, contents", [
    ("every memory of customer Acme with amount over 1000", "structured", [ORDERS[0][1]]),
    ("客户华为金额大于1000的记录", "structured", [ORDERS[4][1]]),
    ("what is my user budget", "structured", ["5000"]),
    ("what did they say about the annual contract?", "semantic", None),
    ("上次采购服务器的是哪家公司", "semantic", None),
    ("customer Acme complained about a late delivery", "both", [ORDERS[0][1]]),
    ("客户华为抱怨交付延迟", "both", [ORDERS[4][1]]),
])
async def test_the_router_sends_a_request_to_the_structured_path_the_semantic_path_or_both(
    stores, text: str, path: str, contents: list[str] | None,
) -> None:
    documents, queries, retrieval = stores
    routed = await routed_search(SearchQuery("acme", "u1", text, route="auto", limit=5), documents, queries, retrieval,
                                 Vocabularies())
    assert routed.route == path, (text, routed.conditions)
    assert {h.document.tenant_id for h in routed.hits} <= {"acme"}
    if path == "semantic":
        assert routed.hits and not routed.conditions and not any(h.exact for h in routed.hits)
    elif path == "structured":
        assert [h.document.content for h in routed.hits] == contents and all(h.exact for h in routed.hits)
    else:  # exact matches first, ranked by what the rest of the request says
        assert routed.hits[0].document.content == contents[0] and routed.hits[0].exact


# --- through gRPC: the tenant is the token's -------------------------------------------------------------------


@pytest.fixture
def settings() -> Settings:
    return load_settings(jwt_secret="retriever-query-test-secret-0123456789")


@pytest.fixture
async def address(stores, settings: Settings) -> AsyncIterator[str]:
    documents, queries, retrieval = stores
    port = free_port()
    server = GrpcServer("127.0.0.1", port, [grpc_api.registration(documents, queries, retrieval)],
                        TokenVerifier(settings))
    await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop(0)


async def test_query_over_grpc_answers_for_the_tokens_tenant_and_refuses_another(address: str,
                                                                                  settings: Settings) -> None:
    token = issue_token(settings, subject="agent", tenant_id="acme", scopes=["memory:read"])
    request = memory_pb2.QueryRequest(where=[
        memory_pb2.QueryCondition(field="attributes.customer", op="eq", value=struct_pb2.Value(string_value="Acme")),
        memory_pb2.QueryCondition(field="attributes.amount", op="gt", value=struct_pb2.Value(number_value=1000))])
    async with channel(address, token) as ch:
        stub = memory_pb2_grpc.RetrieverStub(ch)
        reply = await stub.Query(request)
        assert [m.content for m in reply.memories] == [ORDERS[0][1]]
        assert reply.memories[0].tenant.tenant_id == "acme"
        request.tenant.CopyFrom(common_pb2.TenantContext(tenant_id="globex"))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Query(request)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        bad = memory_pb2.QueryRequest(where=[memory_pb2.QueryCondition(field="layer", op="between")])
        with pytest.raises(grpc.aio.AioRpcError) as invalid:
            await stub.Query(bad)
        assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_detail(invalid.value).field == "where[0].op"
        routed = await stub.Search(memory_pb2.SearchRequest(query="customer Acme with amount over 1000",
                                                            route="auto"))
        assert routed.route == "structured" and [h.memory.content for h in routed.hits] == [ORDERS[0][1]]
        assert {(c.field, c.op) for c in routed.conditions} == {("attributes.customer", "eq"),
                                                                 ("attributes.amount", "gt")}

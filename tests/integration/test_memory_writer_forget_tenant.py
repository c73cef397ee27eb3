"""Forgetting a whole tenant (ForgetTenant) against a real memory-writer process: nothing of the tenant is
left in a pg_dump or a Redis stream, another tenant is untouched, and the tenant can start afresh under new
keys. The writer process and the helpers are test_memory_writer_secrets.py's."""

from __future__ import annotations

import json

import anyio
import grpc
import pytest
from test_memory_writer_secrets import (  # noqa: F401 - fixtures
    PASSWORD,
    PLAIN,
    events_published,
    pg_dump,
    redis_contents,
    request,
    rows_of,
    stub,
    writer,
)

from libs.auth import issue_token
from libs.config import Settings
from libs.events.bus import EventBus
from libs.events.schema import MEMORY_EVENTS
from libs.protogen.mnemesh.v1 import common_pb2, memory_pb2, memory_pb2_grpc
from libs.rpc import channel, error_detail

pytestmark = pytest.mark.integration


async def test_forgetting_a_tenant_leaves_nothing_of_it_and_the_tenant_can_start_afresh(
    writer: Settings,  # noqa: F811
) -> None:
    def as_tenant(tenant_id: str, scopes: list[str]):
        token = issue_token(writer, subject="operator", tenant_id=tenant_id, scopes=scopes)
        return channel(f"127.0.0.1:{writer.grpc_port('memory-writer')}", token)

    async with stub(writer, ["*"]) as ch:
        api = memory_pb2_grpc.MemoryWriterStub(ch)
        await api.Write(request(PLAIN), timeout=10)
        await api.Write(request(f"my bank password is {PASSWORD}"), timeout=10)
        await api.Write(request("my cousin lives at 9 Plum Court", user="u2"), timeout=10)
        await api.SetTenantPolicy(memory_pb2.SetTenantPolicyRequest(
            contacts=memory_pb2.CONTACTS_POLICY_SENSITIVE), timeout=5)
    async with as_tenant("globex", ["*"]) as ch:
        theirs = await memory_pb2_grpc.MemoryWriterStub(ch).Write(memory_pb2.WriteMemoryRequest(
            tenant=common_pb2.TenantContext(user_id="u1"), content="globex keeps 5 Fig Street",
            layer=common_pb2.MEMORY_LAYER_LONG_TERM, source=common_pb2.SOURCE_KIND_USER_STATEMENT), timeout=10)
    events = await events_published(writer, 4)
    # A consumer of the events (the retriever) dead-lettered its copy of u2's memory, content and all.
    bus = EventBus(writer.redis_url, consumer_name="retriever-1", namespace=writer.namespace)
    try:
        copy = next(e for e in events if "9 Plum Court" in e["payload"])
        await bus.dead_letter(bus.stream_name(MEMORY_EVENTS), copy, {"error_type": "internal"}, group="retriever")
    finally:
        await bus.stop()
    assert "9 Plum Court" in await redis_contents(writer)

    async with stub(writer, ["memory:write", "memory:forget", "memory:read"]) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await memory_pb2_grpc.MemoryWriterStub(ch).ForgetTenant(
                memory_pb2.ForgetTenantRequest(confirm_tenant_id="acme"), timeout=10)
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    async with stub(writer, ["memory:admin"]) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await memory_pb2_grpc.MemoryWriterStub(ch).ForgetTenant(
                memory_pb2.ForgetTenantRequest(confirm_tenant_id="globex"), timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_detail(refused.value).field == "confirm_tenant_id"
        assert len(await rows_of(writer, "SELECT 1 FROM memories")) == 4  # nothing was touched

        done = await memory_pb2_grpc.MemoryWriterStub(ch).ForgetTenant(
            memory_pb2.ForgetTenantRequest(confirm_tenant_id="acme"), timeout=30)
    assert (done.forgotten, done.users) == (3, 2)

    dump, streams = pg_dump(writer), await redis_contents(writer)
    for words in ("17 Quince Lane", "桃花巷", "9 Plum Court", PASSWORD):  # (streams: JSON-escaped text)
        assert words not in dump and json.dumps(words)[1:-1] not in streams, words
    assert "5 Fig Street" in streams  # another tenant's memory is untouched
    assert await rows_of(writer, "SELECT 1 FROM user_keys WHERE tenant_id = 'acme'") == []
    assert len(await rows_of(writer, "SELECT 1 FROM events WHERE tenant_id = 'acme'")) >= 5
    assert await rows_of(writer, "SELECT 1 FROM events WHERE tenant_id = 'acme' AND (payload LIKE '%\"sealed%'"
                                 " OR payload LIKE '%sensitiveHashes%')") == []  # erased, not only unopenable
    assert await rows_of(writer, "SELECT 1 FROM tenant_policies WHERE tenant_id = 'acme'") == []
    assert [tuple(r) for r in await rows_of(writer, "SELECT version, wrapped IS NULL AND destroyed_at IS NOT NULL"
                                                    " FROM tenant_keys WHERE tenant_id = 'acme'")] == [(1, True)]
    with anyio.fail_after(30):  # the read side purges its indexes on these
        while len(forgotten := [json.loads(e["payload"]) for e in await events_published(writer, 1)
                                if e["event_type"] == "memory.forgotten"]) < 2:
            await anyio.sleep(0.05)
    assert sorted(f["tenant"]["userId"] for f in forgotten) == ["u1", "u2"]

    async with stub(writer, ["*"]) as ch:  # a new start, under new keys of a new version
        api = memory_pb2_grpc.MemoryWriterStub(ch)
        again = await api.Write(request(f"my new password is {PASSWORD}"), timeout=10)
        shown = await api.Get(memory_pb2.GetMemoryRequest(memory_id=again.memory_id), timeout=5)
        assert shown.memory.content == f"my new password is {PASSWORD}"
        assert (await api.GetTenantPolicy(memory_pb2.GetTenantPolicyRequest(), timeout=5)).contacts == \
            memory_pb2.CONTACTS_POLICY_UNSPECIFIED
    assert [tuple(r) for r in await rows_of(writer, "SELECT version, wrapped IS NULL FROM tenant_keys"
                                                    " WHERE tenant_id = 'acme' ORDER BY version")] == [(1, True), (2, False)]
    async with as_tenant("globex", ["memory:read"]) as ch:
        kept = await memory_pb2_grpc.MemoryWriterStub(ch).Get(memory_pb2.GetMemoryRequest(memory_id=theirs.memory_id),
                                                              timeout=5)
    assert kept.memory.content == "globex keeps 5 Fig Street"

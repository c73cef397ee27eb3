"""Memory-writer, retriever and orchestrator running in this process against real infrastructure.

One namespace per test module keeps their schemas and streams apart from any other run.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

import anyio
import asyncpg
import grpc
import pytest
import redis.asyncio
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from libs.auth import issue_token
from libs.config import Settings, load_settings
from libs.events import Envelope
from libs.events.bus import EventBus
from libs.protogen.mnemesh.v1 import common_pb2, memory_pb2, memory_pb2_grpc, sessions_pb2, sessions_pb2_grpc
from libs.rpc import channel, error_detail
from libs.runtime import run_service
from libs.telemetry import setup_telemetry, tracer
from mnemesh.infra import free_port
from mnemesh.registry import load_bootstrap
from mnemesh.supervisor import check_health

pytestmark = pytest.mark.integration
SERVICES = ("memory-writer", "retriever", "orchestrator")


@pytest.fixture(scope="module")
def spans() -> InMemorySpanExporter:
    setup_telemetry("tests")
    exporter = InMemorySpanExporter()
    trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@pytest.fixture
async def mesh(redis_url: str, database_url: str, tmp_path, spans) -> AsyncIterator[Settings]:
    namespace = f"t{uuid.uuid4().hex[:8]}"
    ports = {f"{name.replace('-', '_')}_grpc_port": free_port() for name in SERVICES}
    settings = load_settings(redis_url=redis_url, database_url=database_url, data_dir=tmp_path, namespace=namespace,
                             metrics_enabled=False, stream_min_idle_ms=500, outbox_poll_seconds=0.1,
                             jwt_secret="services-test-secret-0123456789abcdef", **ports)
    stop = asyncio.Event()
    tasks = []
    for name in SERVICES:
        wiring = load_bootstrap(name)
        tasks.append(asyncio.create_task(run_service(name, settings, wiring.bootstrap,
                                                     migrations_package=wiring.migrations, stop=stop)))
    with anyio.fail_after(60):
        for name in SERVICES:
            while not await check_health(f"127.0.0.1:{settings.grpc_port(name)}"):
                if any(t.done() for t in tasks):
                    await asyncio.gather(*tasks)  # raise the failure of the service that died
                await anyio.sleep(0.1)
    yield settings
    stop.set()
    await asyncio.gather(*tasks)
    client = redis.asyncio.from_url(redis_url)
    keys = [k async for k in client.scan_iter(match=f"{namespace}.*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()
    conn = await asyncpg.connect(database_url)
    try:
        for name in SERVICES:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{namespace}_{name}" CASCADE'.replace("-", "_"))
    finally:
        await conn.close()


def token(settings: Settings, tenant: str = "acme") -> str:
    return issue_token(settings, subject="agent-1", tenant_id=tenant, scopes=["*"])


def address(settings: Settings, service: str) -> str:
    return f"127.0.0.1:{settings.grpc_port(service)}"


async def search_until_found(settings: Settings, query: str, tenant: str = "acme") -> memory_pb2.SearchResponse:
    async with channel(address(settings, "retriever"), token(settings, tenant)) as ch:
        stub = memory_pb2_grpc.RetrieverStub(ch)
        with anyio.fail_after(20):
            while True:
                reply = await stub.Search(memory_pb2.SearchRequest(query=query, limit=5), timeout=5)
                if reply.hits:
                    return reply
                await anyio.sleep(0.1)


def write_request(content: str, **extra) -> memory_pb2.WriteMemoryRequest:
    return memory_pb2.WriteMemoryRequest(
        tenant=common_pb2.TenantContext(user_id="u1", session_id="s1"), layer=common_pb2.MEMORY_LAYER_LONG_TERM,
        source=common_pb2.SOURCE_KIND_USER_STATEMENT, content=content, **extra)


async def test_one_trace_spans_the_grpc_write_the_event_it_publishes_and_the_consumer(
    mesh: Settings, spans: InMemorySpanExporter
) -> None:
    with tracer("tests").start_as_current_span("agent asks to remember") as root:
        async with channel(address(mesh, "memory-writer"), token(mesh)) as ch:
            written = await memory_pb2_grpc.MemoryWriterStub(ch).Write(
                write_request("I prefer window seats on long flights"), timeout=10)
    trace_id = root.get_span_context().trace_id
    hits = (await search_until_found(mesh, "window seats")).hits
    assert hits[0].memory.memory_id == written.memory_id

    def names() -> set[str]:
        # A batch consumer's span (one per batch) is linked to the trace of each event it handles, as the
        # OpenTelemetry messaging conventions say for batch receives; a single-event consumer's is a child.
        return {s.name for s in spans.get_finished_spans()
                if s.context.trace_id == trace_id or any(link.context.trace_id == trace_id for link in s.links)}

    with anyio.fail_after(10):
        while "consume" not in " ".join(names()):
            await anyio.sleep(0.05)
    namespaced = f"{mesh.namespace}.mnemesh.memory.events"
    assert {"mnemesh.v1.MemoryWriter/Write", f"publish {namespaced}", f"consume {namespaced}"} <= names()


async def test_a_write_command_from_the_stream_goes_through_the_same_pipeline(mesh: Settings) -> None:
    bus = EventBus(mesh.redis_url, consumer_name="producer", namespace=mesh.namespace)
    command = memory_pb2.WriteMemoryRequest(
        tenant=common_pb2.TenantContext(tenant_id="acme", user_id="u2"), layer=common_pb2.MEMORY_LAYER_LONG_TERM,
        source=common_pb2.SOURCE_KIND_USER_STATEMENT, content="我的会员等级是金卡", idempotency_key="k-1")
    bad = memory_pb2.WriteMemoryRequest(tenant=command.tenant, layer=command.layer, source=command.source,
                                        content="  ")
    producer = issue_token(mesh, subject="crm-sync", tenant_id="acme", scopes=["produce:mnemesh.memory.commands"])
    for message in (command, command, bad):  # the second is a retry with the same idempotency key
        await bus.publish(Envelope.wrap(message, event_type="memory.write_requested", tenant_id="acme",
                                        credential=producer))
    hits = (await search_until_found(mesh, "会员等级")).hits
    assert [h.memory.content for h in hits] == ["我的会员等级是金卡"]
    client = await bus.redis()
    with anyio.fail_after(20):
        while not (dead := await client.xrange(bus.stream_name("mnemesh.memory.commands") + ".dead")):
            await anyio.sleep(0.1)
    await bus.stop()
    reason = json.loads(dead[0][1][b"dead.reason"])
    assert (reason["error_type"], reason["field"]) == ("validation", "content")


async def test_tenants_never_see_each_others_memories(mesh: Settings) -> None:
    async with channel(address(mesh, "memory-writer"), token(mesh, "acme")) as ch:
        await memory_pb2_grpc.MemoryWriterStub(ch).Write(write_request("acme secret plan zebra"), timeout=10)
    await search_until_found(mesh, "zebra", tenant="acme")
    async with channel(address(mesh, "retriever"), token(mesh, "globex")) as ch:
        reply = await memory_pb2_grpc.RetrieverStub(ch).Search(memory_pb2.SearchRequest(query="zebra"), timeout=5)
    assert list(reply.hits) == []


async def test_two_devices_converge_and_a_stale_device_gets_a_conflict(mesh: Settings) -> None:
    session = f"s-{uuid.uuid4().hex[:6]}"
    async with channel(address(mesh, "orchestrator"), token(mesh)) as ch:
        stub = sessions_pb2_grpc.OrchestratorStub(ch)

        def send(device: str, text: str, seen: int) -> sessions_pb2.SendRequest:
            return sessions_pb2.SendRequest(tenant=common_pb2.TenantContext(user_id="u1"), session_id=session,
                                            device_id=device, text=text, expected_version=seen)

        async def replica(device_events: list[int]) -> None:
            async for event in stub.Subscribe(sessions_pb2.SubscribeRequest(session_id=session, from_version=0)):
                device_events.append(event.version)

        web, app = [], []
        async with anyio.create_task_group() as tg:
            tg.start_soon(replica, web)
            tg.start_soon(replica, app)
            first = await stub.Send(send("web", "book a table", 0), timeout=5)
            with pytest.raises(grpc.aio.AioRpcError) as stale:
                await stub.Send(send("app", "for four people", 0), timeout=5)
            second = await stub.Send(send("app", "for four people", first.version), timeout=5)
            with anyio.fail_after(20):
                while web[-1:] != [second.version] or app[-1:] != [second.version]:
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
        state = await stub.GetSession(sessions_pb2.GetSessionRequest(session_id=session), timeout=5)
    assert stale.value.code() == grpc.StatusCode.ABORTED
    assert error_detail(stale.value).field == "expected_version" and "Subscribe" in error_detail(stale.value).hint
    # Each send runs its turn (state changes and a reply are events too) before it answers.
    assert 0 < first.version < second.version and (first.state, second.state) == ("IDLE", "IDLE")
    assert web == app == list(range(1, second.version + 1))
    user = [m for m in state.messages if m in ("book a table", "for four people")]
    assert user == ["book a table", "for four people"] and len(state.messages) == 4  # each with its reply


async def test_concurrent_writes_with_one_idempotency_key_store_one_memory(mesh: Settings) -> None:
    async with channel(address(mesh, "memory-writer"), token(mesh)) as ch:
        stub = memory_pb2_grpc.MemoryWriterStub(ch)
        replies = await asyncio.gather(*(stub.Write(write_request("booked seat 12A", idempotency_key="seat-1"),
                                                    timeout=10) for _ in range(8)))
    assert len({r.memory_id for r in replies}) == 1
    assert sum(not r.duplicate for r in replies) == 1


async def test_an_idempotency_key_reused_for_different_content_is_already_exists_not_a_duplicate(
    mesh: Settings,
) -> None:
    async with channel(address(mesh, "memory-writer"), token(mesh)) as ch:
        stub = memory_pb2_grpc.MemoryWriterStub(ch)
        first = await stub.Write(write_request("booked seat 12A", idempotency_key="seat-2"), timeout=10)
        retry = await stub.Write(write_request("booked seat 12A", idempotency_key="seat-2"), timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as reused:
            await stub.Write(write_request("booked seat 14C", idempotency_key="seat-2"), timeout=10)
    assert retry.duplicate and retry.memory_id == first.memory_id
    assert reused.value.code() == grpc.StatusCode.ALREADY_EXISTS
    detail = error_detail(reused.value)
    assert (detail.error_type, detail.field) == ("idempotency_key_reused", "idempotency_key")

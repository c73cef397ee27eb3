"""Producers prove who they are: commands on the memory stream through the memory-writer's real consumer.

The memory-writer runs in this process against real Redis and PostgreSQL, in a
namespace of its own. Every refused command is dead-lettered at once with its
reason, and nothing of it is stored: a gRPC retry with the same idempotency key
would report `duplicate` if it had been.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator

import anyio
import asyncpg
import jwt
import pytest
import redis.asyncio

from libs.auth import issue_token
from libs.config import Settings, load_settings
from libs.events import Envelope
from libs.events.bus import EventBus
from libs.events.schema import MEMORY_COMMANDS, MEMORY_EVENTS, dead_letter_stream
from libs.protogen.mnemesh.v1 import common_pb2, events_pb2, memory_pb2, memory_pb2_grpc
from libs.rpc import channel
from libs.runtime import run_service
from mnemesh.infra import free_port
from mnemesh.registry import load_bootstrap
from mnemesh.supervisor import check_health

pytestmark = pytest.mark.integration
SECRET = "producers-integration-secret-0123456789"
PRODUCE = "produce:mnemesh.memory.commands"


@contextlib.asynccontextmanager
async def memory_writer(redis_url: str, database_url: str, data_dir, *, auth: bool) -> AsyncIterator[Settings]:
    """The memory-writer service in this process, in a namespace of its own, removed afterwards."""
    namespace = f"p{uuid.uuid4().hex[:8]}"
    settings = load_settings(redis_url=redis_url, database_url=database_url, data_dir=data_dir, namespace=namespace,
                             metrics_enabled=False, outbox_poll_seconds=0.1, jwt_secret=SECRET, auth_enabled=auth,
                             memory_writer_grpc_port=free_port())
    wiring = load_bootstrap("memory-writer")
    stop = asyncio.Event()
    task = asyncio.create_task(run_service("memory-writer", settings, wiring.bootstrap,
                                           migrations_package=wiring.migrations, stop=stop))
    try:
        with anyio.fail_after(60):
            while not await check_health(f"127.0.0.1:{settings.grpc_port('memory-writer')}"):
                if task.done():
                    await task  # raise why it died
                await anyio.sleep(0.1)
        yield settings
    finally:
        stop.set()
        await task
        client = redis.asyncio.from_url(redis_url)
        keys = [k async for k in client.scan_iter(match=f"{namespace}.*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()
        conn = await asyncpg.connect(database_url)  # as the owner: the services' role may not drop schemas
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{namespace}_memory_writer" CASCADE')
        finally:
            await conn.close()


@pytest.fixture
async def writer(redis_url: str, database_url: str, tmp_path) -> AsyncIterator[Settings]:
    async with memory_writer(redis_url, database_url, tmp_path, auth=True) as settings:
        yield settings


@pytest.fixture
async def dev_writer(redis_url: str, database_url: str, tmp_path) -> AsyncIterator[Settings]:
    async with memory_writer(redis_url, database_url, tmp_path, auth=False) as settings:
        yield settings


def producer_token(settings: Settings, tenant: str = "acme", scopes: tuple[str, ...] = (PRODUCE,)) -> str:
    return issue_token(settings, subject="crm-sync", tenant_id=tenant, scopes=list(scopes), ttl_seconds=600)


def expired_token(settings: Settings) -> str:
    now = int(time.time())
    return jwt.encode({"sub": "crm-sync", "tenant": "acme", "scope": PRODUCE, "iat": now - 7200, "exp": now - 3600,
                       "iss": settings.jwt_issuer, "aud": settings.jwt_audience}, SECRET, algorithm="HS256")


def request(key: str, tenant: str) -> memory_pb2.WriteMemoryRequest:
    return memory_pb2.WriteMemoryRequest(
        tenant=common_pb2.TenantContext(tenant_id=tenant, user_id="u1"), layer=common_pb2.MEMORY_LAYER_LONG_TERM,
        source=common_pb2.SOURCE_KIND_USER_STATEMENT, content=f"prefers aisle seats ({key})", idempotency_key=key)


def command(key: str, *, tenant: str = "acme", credential: str = "") -> Envelope:
    return Envelope.wrap(request(key, tenant), event_type="memory.write_requested", tenant_id=tenant, credential=credential)


async def was_stored(settings: Settings, key: str, tenant: str = "acme") -> bool:
    """Whether a command with idempotency key `key` was stored: a true retry over gRPC then says duplicate."""
    token = issue_token(settings, subject="checker", tenant_id=tenant, scopes=["*"])
    async with channel(f"127.0.0.1:{settings.grpc_port('memory-writer')}", token) as ch:
        reply = await memory_pb2_grpc.MemoryWriterStub(ch).Write(request(key, tenant), timeout=10)
    return reply.duplicate


async def xrange_until(client: redis.asyncio.Redis, stream: str, count: int) -> list:
    with anyio.fail_after(30):
        while len(entries := await client.xrange(stream)) < count:
            await anyio.sleep(0.05)
    return entries


async def test_only_commands_with_a_valid_producer_token_for_their_tenant_are_written(writer: Settings) -> None:
    other_key = load_settings(jwt_secret="another-deployments-secret-0123456789")
    refused = {
        "none": (command("none"), ("unauthenticated", "auth")),
        "bad-signature": (command("bad-signature", credential=producer_token(other_key)),
                          ("unauthenticated", "auth")),
        "expired": (command("expired", credential=expired_token(writer)), ("unauthenticated", "auth")),
        "wrong-scope": (command("wrong-scope", credential=producer_token(writer, scopes=("memory:write",))),
                        ("permission_denied", "auth")),
        "other-tenant": (command("other-tenant", tenant="globex", credential=producer_token(writer, tenant="acme")),
                         ("permission_denied", "tenant_id")),
    }
    bus = EventBus(writer.redis_url, consumer_name="producer", namespace=writer.namespace)
    try:
        for envelope, _ in refused.values():
            await bus.publish(envelope)
        await bus.publish(command("valid", credential=producer_token(writer)))
        client = await bus.redis()
        dead = await xrange_until(client, dead_letter_stream(bus.stream_name(MEMORY_COMMANDS)), len(refused))
        written = await xrange_until(client, bus.stream_name(MEMORY_EVENTS), 1)
    finally:
        await bus.stop()

    by_key = {}
    for _, fields in dead:
        payload = json.loads(fields[b"original.payload"])
        by_key[payload["idempotencyKey"]] = fields
    assert set(by_key) == set(refused)
    for key, (_, (error_type, field)) in refused.items():
        reason = json.loads(by_key[key][b"dead.reason"])
        assert (reason["error_type"], reason["field"], reason["retryable"]) == (error_type, field, False), key
        assert reason["reason"] and reason["hint"], key
        assert by_key[key][b"dead.deliveries"] == b"1", f"{key} was retried instead of dead-lettered at once"
        if b"original.auth" in by_key[key]:
            assert by_key[key][b"original.auth"] == b"[redacted]"  # no usable credential in dead letters
    assert len(written) == 1
    assert json.loads(written[0][1][b"payload"])["memory"]["content"] == "prefers aisle seats (valid)"
    assert await was_stored(writer, "valid")
    for key, (envelope, _) in refused.items():
        assert not await was_stored(writer, key, tenant=envelope.tenant_id), f"the {key} command was stored"


async def test_malformed_commands_are_dead_lettered_at_once_with_the_field_at_fault(writer: Settings) -> None:
    credential = producer_token(writer)
    good = command("ok", credential=credential).to_fields()
    wrong_type = Envelope.wrap(events_pb2.MemoryWritten(), event_type="memory.written", tenant_id="acme",
                               credential=credential).to_fields()
    entries = {
        "event_type": wrong_type,
        "tenant_id": good | {"tenant_id": "evil tenant/..", "event_id": str(uuid.uuid4())},
        "payload": good | {"payload": '{"content": 5}', "event_id": str(uuid.uuid4())},
    }
    bus = EventBus(writer.redis_url, consumer_name="producer", namespace=writer.namespace)
    try:
        client = await bus.redis()
        stream = bus.stream_name(MEMORY_COMMANDS)
        for fields in entries.values():
            await client.xadd(stream, fields)
        dead = await xrange_until(client, dead_letter_stream(stream), len(entries))
        await client.xadd(stream, good)  # the consumer still serves after them
        written = await xrange_until(client, bus.stream_name(MEMORY_EVENTS), 1)
    finally:
        await bus.stop()
    reasons = {json.loads(f[b"dead.reason"])["field"]: f for _, f in dead}
    assert set(reasons) == set(entries)
    for fields in reasons.values():
        assert fields[b"dead.deliveries"] == b"1"
        assert json.loads(fields[b"dead.reason"])["retryable"] is False
    assert json.loads(written[0][1][b"payload"])["memory"]["content"] == "prefers aisle seats (ok)"


async def test_without_auth_a_command_needs_no_credential(dev_writer: Settings) -> None:
    writer = dev_writer
    bus = EventBus(writer.redis_url, consumer_name="producer", namespace=writer.namespace)
    try:
        await bus.publish(command("dev"))
        await xrange_until(await bus.redis(), bus.stream_name(MEMORY_EVENTS), 1)
    finally:
        await bus.stop()
    assert await was_stored(writer, "dev")

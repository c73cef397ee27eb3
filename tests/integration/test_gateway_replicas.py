"""Two real gateway processes (`mnemesh serve tool-gateway`) behind one address: every HTTP request of
one official-SDK client session goes to the next process in turn (a round-robin transport, as a load
balancer without sticky sessions would), and the session never hears "session not found": calls,
progress, a cancellation sent to the other process than the call (2025 era), and tool-list notices
all work."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx2
import mcp_types as types
import pytest
import test_mcp
from test_gateway_mcp_protocol import wait_for_text
from test_gateway_stdio import settings_env
from test_gateway_upstreams import http_upstream, wait_answers  # noqa: F401 - fixtures
from test_mcp import MODES, Gateway, gateway_settings, register
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from mnemesh.infra import free_port
from mnemesh.supervisor import check_health

pytestmark = pytest.mark.integration


class RoundRobin(httpx2.AsyncBaseTransport):
    """Sends each request to the next backend port in turn and counts what each one answered; a 2025
    `notifications/cancelled` goes to the other process than the call it cancels, on purpose."""

    def __init__(self, ports: list[int]) -> None:
        self.ports, self.next, self.inner = ports, 0, httpx2.AsyncHTTPTransport()
        self.served: Counter[tuple[int, str, int]] = Counter()
        self.calls: dict[object, int] = {}  # tools/call request id -> the port that got it
        self.cancels: list[tuple[int, int]] = []  # (port of the call, port of its cancellation)

    def _port(self, request: httpx2.Request) -> int:
        port = self.ports[self.next % len(self.ports)]
        self.next += 1
        try:
            message = json.loads(request.content) if request.method == "POST" else {}
        except ValueError:
            return port
        if message.get("method") == "tools/call":
            self.calls[message.get("id")] = port
        elif message.get("method") == "notifications/cancelled":
            called = self.calls.get(message["params"]["requestId"])
            port = next(p for p in self.ports if p != called)
            self.cancels.append((called, port))
        return port

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        port = self._port(request)
        request.url = request.url.copy_with(port=port)
        response = await self.inner.handle_async_request(request)
        self.served[(port, request.method, response.status_code)] += 1
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


@contextlib.asynccontextmanager
async def gateway_process(settings, name: str, log_dir: Path, **env: str) -> AsyncIterator[subprocess.Popen]:
    log = (log_dir / f"{name}.log").open("w")
    process = subprocess.Popen([sys.executable, "-m", "mnemesh", "serve", "tool-gateway"],
                               env=settings_env(settings, **env), stdout=log, stderr=subprocess.STDOUT)
    try:
        with anyio.fail_after(60):
            while not await check_health(f"127.0.0.1:{settings.tool_gateway_grpc_port}"):
                assert process.poll() is None, (log_dir / f"{name}.log").read_text()[-2000:]
                await anyio.sleep(0.2)
        await wait_answers(f"http://127.0.0.1:{settings.mcp_http_port}/mcp")
        yield process
    finally:
        process.terminate()
        process.wait(20)
        log.close()


@pytest.fixture
async def two_processes(redis_url: str, database_url: str, tmp_path: Path,
                        http_upstream: str) -> AsyncIterator[tuple[Gateway, list[int]]]:  # noqa: F811
    await wait_answers(http_upstream)
    config = tmp_path / "upstreams.json"
    config.write_text(json.dumps({"upstreams": [{"name": "remote", "url": http_upstream, "prefix": "rm"}]}))
    first = gateway_settings(redis_url, database_url, tmp_path, tool_upstreams_file=str(config))
    second = first.model_copy(update={"tool_gateway_grpc_port": free_port(), "mcp_http_port": free_port()})
    try:
        async with (gateway_process(first, "first", tmp_path), gateway_process(second, "second", tmp_path)):
            yield Gateway(first, asyncio.Event(), None), [first.mcp_http_port, second.mcp_http_port]  # type: ignore[arg-type]
    finally:
        await test_mcp.drop_namespace(first)


@pytest.mark.parametrize("mode", MODES)
async def test_one_client_session_is_served_by_two_gateway_processes_in_turn(
    two_processes: tuple[Gateway, list[int]], mode: str, tmp_path: Path
) -> None:
    gw, ports = two_processes
    balancer = RoundRobin(ports)
    changed = asyncio.Event()
    progress: list[float] = []

    async def on_message(message) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    headers = {"Authorization": f"Bearer {gw.token('tools:*')}"}
    async with (httpx2.AsyncClient(headers=headers, transport=balancer, timeout=httpx2.Timeout(10, read=30)) as http,
                Client(streamable_http_client(gw.url, http_client=http), mode=mode, message_handler=on_message)
                as client):
        with anyio.fail_after(30):
            while "rm.echo" not in {t.name for t in (await client.list_tools()).tools}:
                await anyio.sleep(0.1)
        echoes = [await client.call_tool("rm.echo", {"text": f"call {n}"}) for n in range(6)]
        counted = await client.call_tool("rm.count", {"steps": 2}, progress_callback=on_progress)
        marker = tmp_path / f"slow-{mode}"
        call = asyncio.create_task(client.call_tool("rm.slow", {"marker": str(marker)}))
        await wait_for_text(marker, "started")
        call.cancel()
        await wait_for_text(marker, "cancelled")  # whichever process the cancellation reached
        if mode == "legacy":  # the GET stream, on whichever process, hears a registration through the other
            for attempt in range(20):
                await register(gw, f"crm.replicated_{attempt}")
                with anyio.move_on_after(1):
                    await changed.wait()
                    break
            assert changed.is_set()
        else:
            async with client.listen(tools_list_changed=True) as subscription:
                await register(gw, "crm.replicated")
                with anyio.fail_after(10):
                    await anext(aiter(subscription))
    assert [e.structured_content for e in echoes] == [{"echo": f"call {n}"} for n in range(6)]
    assert counted.structured_content == {"steps": 2} and progress == [1, 2]
    statuses = Counter(status for (_, _, status) in balancer.served.elements())
    assert 404 not in statuses and all(s < 400 for s in statuses), balancer.served
    assert {port for (port, method, _) in balancer.served if method == "POST"} == set(ports)
    if mode == "legacy":  # the cancellation crossed from one process to the other (Redis pub/sub)
        assert len(balancer.cancels) == 1 and balancer.cancels[0][0] != balancer.cancels[0][1]

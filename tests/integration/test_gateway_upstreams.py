"""Federation: real upstream MCP servers (this repository's fixture, over stdio and over Streamable HTTP)
behind a real gateway, reached with the official MCP client."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import httpx2
import pytest
import test_mcp
from test_mcp import Gateway, gateway_settings, mcp_client

from mnemesh.infra import free_port
from services.tool_gateway.adapters.upstreams import UpstreamConfig, UpstreamManager

pytestmark = pytest.mark.integration
FIXTURE = str(Path(__file__).with_name("upstream_server.py"))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(ChildProcessError):  # reap it if it is our zombie
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


@pytest.fixture
def http_upstream() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, FIXTURE, "http", str(port)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(10)


async def wait_answers(url: str, verify: ssl.SSLContext | bool = True) -> None:
    async with httpx2.AsyncClient(timeout=2, verify=verify) as http:
        with anyio.fail_after(30):
            while True:
                try:
                    await http.get(url)
                    return
                except httpx2.TransportError:
                    await anyio.sleep(0.1)


@pytest.fixture
async def federating(redis_url: str, database_url: str, tmp_path, http_upstream: str) -> AsyncIterator[Gateway]:
    await wait_answers(http_upstream)
    config = tmp_path / "upstreams.json"
    config.write_text(json.dumps({"upstreams": [
        {"name": "local", "command": [sys.executable, FIXTURE, "stdio"]},
        {"name": "remote", "url": http_upstream, "prefix": "rm"},
    ]}))
    settings = gateway_settings(redis_url, database_url, tmp_path, tool_upstreams_file=str(config))
    async with test_mcp.running(settings) as gw:
        yield gw
    await test_mcp.drop_namespace(settings)


def tool_error(result) -> dict:
    """The structured error a tool error carries as JSON text (and as structuredContent only when its tool declares
    no output schema, as the fixture's tools but `picture` do)."""
    assert result.is_error, result
    return json.loads(result.content[0].text)


async def listed(gw: Gateway, expect: set[str]) -> dict:
    """tools/list once every name in `expect` is there (upstreams connect in the background)."""
    async with mcp_client(gw, gw.token("tools:*")) as client:
        with anyio.fail_after(30):
            while not expect <= (tools := {t.name: t for t in (await client.list_tools()).tools}).keys():
                await anyio.sleep(0.1)
    return tools


async def test_upstream_tools_are_exposed_namespaced_unique_and_short_and_called_through_the_pipeline(
    federating: Gateway
) -> None:
    tools = await listed(federating, {"local.echo", "rm.echo"})
    assert all(len(name) <= 64 for name in tools) and len(tools) == len(set(tools))
    long_names = [n for n in tools if n.startswith("local.a_tool_whose_name")]
    assert len(long_names) == 1 and 56 <= len(long_names[0]) <= 64
    assert tools["local.echo"].input_schema["required"] == ["text"]
    async with mcp_client(federating, federating.token("tools:*")) as client:
        local = await client.call_tool("local.echo", {"text": "hi", "times": 2})
        remote = await client.call_tool("rm.echo", {"text": "yo"})
        invalid = await client.call_tool("rm.echo", {"times": 2})
        failed = await client.call_tool("local.fail", {"reason": "no stock"})
        # the upstream (2026-07-28) refuses a call whose x-mcp-header argument has no Mcp-Param-* header
        routed = await client.call_tool("rm.route", {"region": "华东-1", "parcel": "p-7"})
    assert tools["rm.route"].input_schema["properties"]["region"]["x-mcp-header"] == "Region"
    assert (routed.is_error, routed.structured_content) == (False, {"region": "华东-1", "parcel": "p-7"})
    assert (local.is_error, local.structured_content) == (False, {"echo": "hi hi"})
    assert remote.structured_content == {"echo": "yo"}
    assert tool_error(invalid)["error_type"] == "validation"  # checked by the gateway, before the upstream
    assert tool_error(failed)["error_type"] == "backend_error" and "refused: no stock" in tool_error(failed)["reason"]
    # Both tools declare an output schema, which an error does not match: the error is text only (TS SDK 1.x checks
    # structuredContent against the schema even on an error, and throws).
    assert invalid.structured_content is None and failed.structured_content is None


async def test_a_dead_stdio_upstream_is_restarted_and_no_process_is_left_when_the_gateway_stops(
    federating: Gateway
) -> None:
    await listed(federating, {"local.whoami"})
    async with mcp_client(federating, federating.token("tools:*")) as client:
        first = (await client.call_tool("local.whoami", {})).structured_content["pid"]
        os.kill(first, signal.SIGKILL)
        with anyio.fail_after(30):
            while True:
                result = await client.call_tool("local.whoami", {})
                if not result.is_error and result.structured_content["pid"] != first:
                    break
                if result.is_error:  # reported down (or not yet noticed) while it restarts
                    assert tool_error(result)["error_type"] in ("unavailable", "not_found",
                                                                       "deadline_exceeded", "backend_error",
                                                                       "circuit_open")
                await anyio.sleep(0.2)
    second = result.structured_content["pid"]
    assert alive(second) and not alive(first)
    federating.stop.set()
    with anyio.fail_after(15):
        await federating.task
    assert not alive(second)


async def test_waiting_for_upstreams_ends_once_each_connected_or_failed_its_first_attempt_or_at_the_bound() -> None:
    """What `serve-stdio` waits for before it answers: a dead upstream (refused) does not hold it, nor one that
    never answers (mute) for longer than the bound; both go on being retried."""
    manager = UpstreamManager(backoff_base=60)
    manager.add(UpstreamConfig(name="up", command=[sys.executable, FIXTURE, "stdio"]))
    manager.add(UpstreamConfig(name="refused", url=f"http://127.0.0.1:{free_port()}/mcp"))
    try:
        with anyio.fail_after(30):
            settled = await manager.settled(within=30)
        states = {name: status.state for name, status in manager.status.items()}
        manager.add(UpstreamConfig(name="mute", command=[sys.executable, "-c", "import time; time.sleep(60)"]))
        started = time.monotonic()
        pending = await manager.settled(within=1)
        waited = time.monotonic() - started
    finally:
        await manager.close()
    assert settled == [] and states["up"] == "up" and states["refused"] in ("down", "connecting")
    assert manager.status["refused"].restarts >= 1 and manager.status["refused"].reason
    assert pending == ["mute"] and 1 <= waited < 5


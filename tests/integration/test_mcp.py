"""The tool-gateway's MCP endpoint, served in this process against real PostgreSQL and Redis,
reached with the official MCP client over Streamable HTTP.

Tools are registered over gRPC, as platform teams do, then seen by an agent over MCP. Both MCP
eras are exercised: `auto` (the 2026 per-request protocol, after a `server/discover` probe) and
`legacy` (the `initialize` handshake).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import asyncpg
import httpx2
import pytest
import redis.asyncio
from google.protobuf import struct_pb2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from libs.auth import issue_token
from libs.config import Settings, load_settings
from libs.protogen.mnemesh.v1 import common_pb2, tools_pb2, tools_pb2_grpc
from libs.rpc import PortInUse, channel
from libs.runtime import run_service
from mnemesh.infra import free_port
from mnemesh.registry import load_bootstrap
from mnemesh.supervisor import check_health

pytestmark = pytest.mark.integration
SERVICE = "tool-gateway"
MODES = ["auto", "legacy"]
CUSTOMER_INPUT = {"type": "object", "properties": {"customer_id": {"type": "string"}},
                  "required": ["customer_id"]}
CUSTOMER_OUTPUT = {"type": "object", "properties": {"name": {"type": "string"}}}
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "curl", "version": "0"}}}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def with_token(token: str) -> dict[str, str]:
    return {**HEADERS, "Authorization": f"Bearer {token}"}


@dataclass
class Gateway:
    settings: Settings
    stop: asyncio.Event
    task: asyncio.Task

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.settings.tool_gateway_grpc_port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.settings.mcp_http_port}/mcp"

    def token(self, *scopes: str) -> str:
        return issue_token(self.settings, subject="agent-1", tenant_id="acme", scopes=list(scopes))


def gateway_settings(redis_url: str, database_url: str, data_dir, **overrides) -> Settings:
    return load_settings(redis_url=redis_url, database_url=database_url, data_dir=data_dir,
                         namespace=f"t{uuid.uuid4().hex[:8]}", metrics_enabled=False, outbox_poll_seconds=0.1,
                         jwt_secret="mcp-test-secret-0123456789abcdef012345",
                         tool_gateway_grpc_port=free_port(), mcp_http_port=free_port(), **overrides)


async def mcp_answers(url: str) -> bool:
    async with httpx2.AsyncClient(timeout=2) as http:
        try:
            await http.get(url)
        except httpx2.TransportError:
            return False
    return True


async def drop_namespace(settings: Settings) -> None:
    client = redis.asyncio.from_url(settings.redis_url)
    keys = [k async for k in client.scan_iter(match=f"{settings.namespace}.*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()
    conn = await asyncpg.connect(settings.database_url)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{settings.namespace}_tool_gateway" CASCADE')
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[Gateway]:
    """A gateway served in this process until the block ends (its data is left in place)."""
    wiring = load_bootstrap(SERVICE)
    stop = asyncio.Event()
    task = asyncio.create_task(run_service(SERVICE, settings, wiring.bootstrap,
                                           migrations_package=wiring.migrations, stop=stop))
    gw = Gateway(settings, stop, task)
    with anyio.fail_after(60):
        while not (await check_health(gw.grpc) and await mcp_answers(gw.url)):
            if task.done():
                await task  # raise the failure of the service
            await anyio.sleep(0.1)
    try:
        yield gw
    finally:
        stop.set()
        await task


@pytest.fixture
async def gateway(redis_url: str, database_url: str, tmp_path) -> AsyncIterator[Gateway]:
    settings = gateway_settings(redis_url, database_url, tmp_path)
    async with running(settings) as gw:
        yield gw
    await drop_namespace(settings)


async def register(gw: Gateway, name: str, version: str = "1.0.0", *, description: str = "",
                   input_schema: dict = CUSTOMER_INPUT, output_schema: dict | None = None, **fields) -> None:
    def struct(value: dict) -> struct_pb2.Struct:
        s = struct_pb2.Struct()
        s.update(value)
        return s

    spec = common_pb2.ToolSpec(name=name, version=version, description=description or f"Does {name} things.",
                               input_schema=struct(input_schema), output_schema=struct(output_schema or {}),
                               **fields)
    async with channel(gw.grpc, gw.token("tools:admin")) as ch:
        await tools_pb2_grpc.ToolGatewayStub(ch).RegisterTool(tools_pb2.RegisterToolRequest(tool=spec),
                                                              timeout=10)


@contextlib.asynccontextmanager
async def mcp_client(gw: Gateway, token: str | None, mode: str = "auto") -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(10, read=30)) as http,
                Client(streamable_http_client(gw.url, http_client=http), mode=mode) as client):
        yield client


def leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


async def refused_connection(gw: Gateway, token: str | None) -> MCPError:
    """The error the MCP client raises when the endpoint refuses it (from inside the SDK's task groups)."""
    try:
        async with mcp_client(gw, token):
            pass
    except (MCPError, BaseExceptionGroup) as exc:
        [error] = leaves(exc)
        assert isinstance(error, MCPError), error
        return error
    raise AssertionError("the MCP client connected")


@pytest.mark.parametrize("mode", MODES)
async def test_an_agent_lists_each_registered_tool_once_at_its_current_version_with_its_schemas(
    gateway: Gateway, mode: str
) -> None:
    await register(gateway, "crm.get_customer", "1.0.0", output_schema=CUSTOMER_OUTPUT)
    await register(gateway, "crm.get_customer", "1.1.0", description="Look up a customer by id (v1.1).",
                   output_schema=CUSTOMER_OUTPUT)
    await register(gateway, "mail.send",
                   input_schema={"type": "object", "properties": {"to": {"type": "string"}}})
    async with mcp_client(gateway, gateway.token("tools:read"), mode) as client:
        listed = await client.list_tools()
        version = client.protocol_version
    assert version in (MODERN_PROTOCOL_VERSIONS if mode == "auto" else HANDSHAKE_PROTOCOL_VERSIONS)
    tools = {t.name: t for t in listed.tools}
    assert sorted(tools) == ["crm.get_customer", "mail.send"]
    assert tools["crm.get_customer"].description == "Look up a customer by id (v1.1)."
    assert tools["crm.get_customer"].input_schema == CUSTOMER_INPUT
    assert tools["crm.get_customer"].output_schema == CUSTOMER_OUTPUT
    assert tools["mail.send"].output_schema is None


@pytest.mark.parametrize("mode", MODES)
async def test_a_tool_without_a_backend_this_gateway_knows_answers_a_structured_error(
    gateway: Gateway, mode: str
) -> None:
    await register(gateway, "crm.get_customer")
    async with mcp_client(gateway, gateway.token("tools:read", "tools:call"), mode) as client:
        result = await client.call_tool("crm.get_customer", {"customer_id": "c-7"})
    assert result.is_error
    assert (result.structured_content["error_type"], result.structured_content["field"]) == \
        ("validation", "backend")
    assert result.structured_content["retryable"] is False
    assert json.loads(result.content[0].text) == result.structured_content


@pytest.mark.parametrize("mode", MODES)
async def test_calling_an_unknown_tool_is_not_found_on_the_name(gateway: Gateway, mode: str) -> None:
    await register(gateway, "crm.get_customer")
    async with mcp_client(gateway, gateway.token("tools:*"), mode) as client:
        result = await client.call_tool("crm.get_custmer", {})
    assert result.is_error
    error = result.structured_content
    assert (error["error_type"], error["field"]) == ("not_found", "name")
    assert "crm.get_custmer" in result.structured_content["reason"]
    assert json.loads(result.content[0].text) == result.structured_content


async def test_without_a_token_the_endpoint_answers_401_naming_the_problem(gateway: Gateway) -> None:
    async with httpx2.AsyncClient(timeout=5) as http:
        reply = await http.post(gateway.url, json=INIT, headers=HEADERS)
    assert reply.status_code == 401
    assert reply.headers["www-authenticate"].startswith("Bearer resource_metadata=")  # RFC 9728
    detail = reply.json()["error"]["data"]
    assert (detail["error_type"], detail["field"], detail["reason"]) == \
        ("unauthenticated", "authorization", "no bearer token")
    assert "Authorization: Bearer" in detail["hint"]
    error = await refused_connection(gateway, None)
    assert error.data["error_type"] == "unauthenticated"


async def test_a_token_that_does_not_verify_is_401_saying_why(gateway: Gateway) -> None:
    expired = issue_token(gateway.settings, subject="agent-1", tenant_id="acme", scopes=["tools:read"],
                          ttl_seconds=-60)
    forged = gateway.token("tools:read")[:-4] + "AAAA"
    async with httpx2.AsyncClient(timeout=5) as http:
        replies = [await http.post(gateway.url, json=INIT, headers=with_token(t)) for t in (expired, forged)]
    assert [r.status_code for r in replies] == [401, 401]
    assert [r.json()["error"]["data"]["reason"] for r in replies] == \
        ["the token has expired", "the token signature does not verify"]
    assert replies[0].headers["www-authenticate"].startswith('Bearer error="invalid_token"')


async def test_a_token_without_tools_read_is_refused_with_403_insufficient_scope(gateway: Gateway) -> None:
    token = gateway.token("tools:call", "memory:read")
    async with httpx2.AsyncClient(timeout=5) as http:
        reply = await http.post(gateway.url, json=INIT, headers=with_token(token))
    assert reply.status_code == 403
    assert 'error="insufficient_scope"' in reply.headers["www-authenticate"]
    assert 'scope="tools:read"' in reply.headers["www-authenticate"]
    assert reply.json()["error"]["data"]["error_type"] == "permission_denied"
    error = await refused_connection(gateway, token)
    assert (error.data["error_type"], error.data["field"]) == ("permission_denied", "authorization")
    assert "tools:read" in error.data["reason"]


async def test_a_token_with_tools_read_only_lists_but_its_calls_are_refused(gateway: Gateway) -> None:
    await register(gateway, "crm.get_customer")
    async with mcp_client(gateway, gateway.token("tools:read")) as client:
        assert [t.name for t in (await client.list_tools()).tools] == ["crm.get_customer"]
        result = await client.call_tool("crm.get_customer", {"customer_id": "c-7"})
    assert result.is_error
    assert result.structured_content["error_type"] == "permission_denied"
    assert "tools:call" in result.structured_content["reason"]


async def test_a_get_stream_or_delete_needs_the_session_id_initialize_answered(gateway: Gateway) -> None:
    token = gateway.token("tools:read")
    async with httpx2.AsyncClient(timeout=5) as http:
        init = await http.post(gateway.url, json=INIT, headers=with_token(token))
        session = init.headers["mcp-session-id"]
        stream = await http.get(gateway.url, headers={**with_token(token), "Accept": "text/event-stream"})
        plain_get = await http.get(gateway.url, headers={**with_token(token), "Accept": "application/json"})
        delete = await http.delete(gateway.url, headers=with_token(token))
        ended = await http.delete(gateway.url, headers={**with_token(token), "Mcp-Session-Id": session})
        anonymous = await http.get(gateway.url)
    assert len(session) == 32 and init.status_code == 200
    assert stream.status_code == 400 and "Mcp-Session-Id" in stream.text
    assert (plain_get.status_code, delete.status_code) == (405, 405)
    assert ended.status_code == 204  # nothing is kept for a session, so nothing to drop
    assert anonymous.status_code == 401  # authentication still comes first


async def test_a_request_naming_a_foreign_host_or_origin_is_refused(gateway: Gateway) -> None:
    """DNS rebinding: a page on evil.example whose name resolves to this machine must get nowhere."""
    headers = {**HEADERS, **with_token(gateway.token("tools:read"))}
    async with httpx2.AsyncClient(timeout=5) as http:
        foreign_host = await http.post(gateway.url, json=INIT, headers={**headers, "Host": "rebind.evil.example"})
        foreign_origin = await http.post(gateway.url, json=INIT,
                                         headers={**headers, "Origin": "http://rebind.evil.example"})
    assert foreign_host.status_code == 421
    assert foreign_origin.status_code == 403


async def test_the_gateway_stops_within_3_seconds_with_a_request_in_flight(gateway: Gateway) -> None:
    sending, never = asyncio.Event(), asyncio.Event()

    async def endless_body():
        yield b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", '
        sending.set()  # the first chunk is on the wire: the server is reading this request
        await never.wait()
        yield b"}"

    headers = {**HEADERS, **with_token(gateway.token("tools:read"))}
    async with httpx2.AsyncClient(timeout=30) as http:
        in_flight = asyncio.create_task(http.post(gateway.url, content=endless_body(), headers=headers))
        with anyio.fail_after(10):
            await sending.wait()
        started = time.monotonic()
        gateway.stop.set()
        with anyio.fail_after(3):
            await gateway.task
        elapsed = time.monotonic() - started
        in_flight.cancel()
        with contextlib.suppress(asyncio.CancelledError, httpx2.HTTPError):
            await in_flight
    assert elapsed < 3
    assert not await mcp_answers(gateway.url)


async def test_a_taken_mcp_port_stops_the_service_naming_the_setting(
    redis_url: str, database_url: str, tmp_path
) -> None:
    settings = gateway_settings(redis_url, database_url, tmp_path)
    wiring = load_bootstrap(SERVICE)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", settings.mcp_http_port))
        taken.listen()
        try:
            with pytest.raises(PortInUse) as caught, anyio.fail_after(60):
                await run_service(SERVICE, settings, wiring.bootstrap, migrations_package=wiring.migrations)
        finally:
            await drop_namespace(settings)
    assert "MNEMESH_MCP_HTTP_PORT" in str(caught.value)

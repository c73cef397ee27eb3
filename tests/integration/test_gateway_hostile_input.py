"""The tool-gateway under hostile input, served in this process against real PostgreSQL and Redis:
a catastrophic regex in a schema, JSON-RPC requests with ids MCP does not allow."""

from __future__ import annotations

import asyncio
import time

import anyio
import grpc
import httpx2
import pytest
import test_mcp
from google.protobuf import struct_pb2
from test_mcp import INIT, Gateway, mcp_client, register, with_token

from libs.protogen.mnemesh.v1 import common_pb2, tools_pb2, tools_pb2_grpc
from libs.rpc import channel
from mnemesh.supervisor import check_health

pytestmark = pytest.mark.integration
gateway = test_mcp.gateway  # the fixture: a tool-gateway served in this process
EVIL = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^(a+)+$"}}}
ATTACK = "a" * 27 + "!"  # about 5 s of backtracking in Python's re, on the event loop


def struct(value: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(value)
    return s


async def test_a_catastrophic_pattern_is_validated_fast_and_health_keeps_answering(gateway: Gateway) -> None:
    stop = asyncio.Event()
    health_latency: list[float] = []

    async def watch_health() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            assert await check_health(gateway.grpc, timeout=2)
            health_latency.append(time.perf_counter() - started)
            await anyio.sleep(0.05)

    spec = common_pb2.ToolSpec(name="crm.lookup", version="1.0.0", description="Look up a customer by a code.",
                               input_schema=struct(EVIL), examples=[struct({"code": ATTACK})])
    watcher = asyncio.create_task(watch_health())
    try:
        started = time.perf_counter()
        async with channel(gateway.grpc, gateway.token("tools:admin")) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await tools_pb2_grpc.ToolGatewayStub(ch).RegisterTool(tools_pb2.RegisterToolRequest(tool=spec),
                                                                      timeout=10)
        elapsed = time.perf_counter() - started
    finally:
        stop.set()
        await watcher
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "examples[0]" in caught.value.details()
    assert elapsed < 1.0, f"validation took {elapsed:.1f} s"
    assert health_latency and max(health_latency) < 1.0


async def test_call_arguments_against_a_catastrophic_pattern_are_refused_fast_naming_the_argument(
    gateway: Gateway
) -> None:
    await register(gateway, "crm.lookup", input_schema=EVIL)
    async with mcp_client(gateway, gateway.token("tools:read", "tools:call")) as client:
        started = time.perf_counter()
        result = await client.call_tool("crm.lookup", {"code": ATTACK * 100})
        elapsed = time.perf_counter() - started
    assert elapsed < 1.0
    assert result.is_error and result.structured_content["error_type"] == "validation"
    assert result.structured_content["field"] == "arguments/code"


async def test_a_pattern_with_a_lookahead_is_refused_at_registration_naming_its_path(gateway: Gateway) -> None:
    schema = {"type": "object", "properties": {"pw": {"type": "string", "pattern": "^(?=.*[0-9]).{8,}$"}}}
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await register(gateway, "auth.set_password", input_schema=schema)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input_schema/properties/pw/pattern" in caught.value.details()


@pytest.mark.parametrize("bad_id", [{"a": 1}, [1], True, False, 1.5, None])
async def test_a_request_whose_id_is_not_a_string_or_integer_is_an_invalid_request_error(
    gateway: Gateway, bad_id: object
) -> None:
    request = {"jsonrpc": "2.0", "id": bad_id, "method": "tools/list", "params": {}}
    headers = with_token(gateway.token("tools:read"))
    async with httpx2.AsyncClient(timeout=5) as http:
        reply = await http.post(gateway.url, json=request, headers=headers)
        batch = await http.post(gateway.url, json=[request], headers=headers)
        fine = await http.post(gateway.url, json=INIT, headers=headers)
    assert reply.status_code == 400, reply.text
    error = reply.json()
    assert error["jsonrpc"] == "2.0" and error["id"] is None
    assert error["error"]["code"] == -32600 and "id" in error["error"]["message"]
    assert batch.status_code == 400 and batch.json()["error"]["code"] == -32600
    assert fine.status_code == 200 and '"protocolVersion"' in fine.text  # a good request still gets through


async def test_a_notification_without_an_id_is_still_accepted(gateway: Gateway) -> None:
    notification = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    async with httpx2.AsyncClient(timeout=5) as http:
        reply = await http.post(gateway.url, json=notification, headers=with_token(gateway.token("tools:read")))
    assert reply.status_code == 202

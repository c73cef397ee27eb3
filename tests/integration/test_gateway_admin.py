"""Versions and canaries, call status, tool removal and upstreams added at run time, against a real gateway
(PostgreSQL, Redis), real HTTP backends and a real upstream MCP server."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import asyncpg
import grpc
import pytest
import test_mcp
from http_backend import HttpBackend, http_backend
from test_mcp import Gateway, gateway_settings, mcp_client, register

from libs.auth import issue_token
from libs.events import Envelope
from libs.protogen.mnemesh.v1 import tools_pb2, tools_pb2_grpc
from libs.rpc import channel, error_detail

pytestmark = pytest.mark.integration
ANY = {"type": "object"}
FIXTURE = str(Path(__file__).with_name("upstream_server.py"))


@pytest.fixture
async def backend() -> AsyncIterator[HttpBackend]:
    async with http_backend() as state:
        yield state


@pytest.fixture
async def gateway(redis_url: str, database_url: str, tmp_path) -> AsyncIterator[Gateway]:
    settings = gateway_settings(redis_url, database_url, tmp_path, tool_rate_per_caller=1000.0,
                                tool_breaker_failures=1000, tool_upstream_commands=Path(sys.executable).name)
    async with test_mcp.running(settings) as gw:
        yield gw
    await test_mcp.drop_namespace(settings)


def bearer(gw: Gateway, subject: str, *scopes: str) -> list[tuple[str, str]]:
    token = issue_token(gw.settings, subject=subject, tenant_id="acme", scopes=list(scopes or ["tools:*"]))
    return [("authorization", f"Bearer {token}")]


async def versions_served(gw: Gateway, name: str, callers: range) -> list[str]:
    async with channel(gw.grpc, None) as ch:
        stub = tools_pb2_grpc.ToolGatewayStub(ch)
        return [(await stub.CallTool(tools_pb2.CallToolRequest(name=name), timeout=10,
                                     metadata=bearer(gw, f"agent-{i}", "tools:call"))).version for i in callers]


async def rollout_row(gw: Gateway, name: str) -> asyncpg.Record:
    conn = await asyncpg.connect(gw.settings.database_url,
                                 server_settings={"search_path": f"{gw.settings.namespace}_tool_gateway"})
    try:
        return await conn.fetchrow("SELECT * FROM tool_rollouts WHERE name = $1", name)
    finally:
        await conn.close()


async def test_canary_traffic_splits_within_statistical_bounds_sticks_per_caller_and_promotes(
    gateway: Gateway, backend: HttpBackend
) -> None:
    for version in ("1.0.0", "2.0.0"):
        await register(gateway, "mail.send", version, input_schema=ANY, backend=f"http:{backend.url('/sms')}")
    async with channel(gateway.grpc, gateway.token("tools:*")) as ch:
        stub = tools_pb2_grpc.ToolGatewayStub(ch)
        started = await stub.SetCanary(tools_pb2.SetCanaryRequest(name="mail.send", version="2.0.0", percent=30))
        served = await versions_served(gateway, "mail.send", range(300))
        again = await versions_served(gateway, "mail.send", range(50))
        promoted = await stub.Promote(tools_pb2.PromoteRequest(name="mail.send"))
        after = await versions_served(gateway, "mail.send", range(20))
    share = served.count("2.0.0") / len(served)
    assert (started.rollout.stable, started.rollout.state) == ("1.0.0", "canary")
    assert abs(share - 0.30) < 4 * math.sqrt(0.3 * 0.7 / len(served)), share
    assert again == served[:50]  # sticky per caller
    assert promoted.rollout.stable == "2.0.0" and set(after) == {"2.0.0"}


async def test_a_canary_failing_more_than_stable_is_rolled_back_automatically(
    gateway: Gateway, backend: HttpBackend
) -> None:
    backend.down = True  # /flaky answers 503
    await register(gateway, "jobs.submit", "1.0.0", input_schema=ANY, backend=f"http:{backend.url('/sms')}")
    await register(gateway, "jobs.submit", "1.1.0", input_schema=ANY, backend=f"http:POST {backend.url('/flaky')}")
    async with channel(gateway.grpc, gateway.token("tools:*")) as ch:
        await tools_pb2_grpc.ToolGatewayStub(ch).SetCanary(tools_pb2.SetCanaryRequest(
            name="jobs.submit", version="1.1.0", percent=50, min_calls=5))
    served = await versions_served(gateway, "jobs.submit", range(80))
    row = await rollout_row(gateway, "jobs.submit")
    assert (row["state"], row["canary"], row["stable"]) == ("rolled_back", "", "1.0.0")
    assert "error rate 100%" in row["reason"]
    assert backend.calls["flaky"] == 5 and set(served[-20:]) == {"1.0.0"}


async def test_get_call_reports_a_chain_ids_call_done_with_its_result_or_failed_and_unknown_otherwise(
    gateway: Gateway, backend: HttpBackend
) -> None:
    backend.down = True
    await register(gateway, "mail.send", input_schema=ANY, backend=f"http:{backend.url('/sms')}")
    await register(gateway, "jobs.submit", input_schema=ANY, backend=f"http:POST {backend.url('/flaky')}")
    async with channel(gateway.grpc, gateway.token("tools:*")) as ch:
        stub = tools_pb2_grpc.ToolGatewayStub(ch)
        done = await stub.CallTool(tools_pb2.CallToolRequest(name="mail.send", chain_id="act-1"))
        await stub.CallTool(tools_pb2.CallToolRequest(name="jobs.submit", chain_id="act-2"))
        by_chain = await stub.GetCall(tools_pb2.GetCallRequest(call_id="act-1"))
        by_id = await stub.GetCall(tools_pb2.GetCallRequest(call_id=done.call_id))
        failed = await stub.GetCall(tools_pb2.GetCallRequest(call_id="act-2"))
        unknown = await stub.GetCall(tools_pb2.GetCallRequest(call_id="act-3"))
    async with channel(gateway.grpc, None) as ch:
        other = await tools_pb2_grpc.ToolGatewayStub(ch).GetCall(
            tools_pb2.GetCallRequest(call_id="act-1"), metadata=[("authorization", "Bearer " + issue_token(
                gateway.settings, subject="x", tenant_id="other", scopes=["tools:call"]))])
    assert (by_chain.state, by_chain.call_id, by_chain.result["sent_by"]) == ("done", done.call_id, "sms")
    assert by_id.state == "done"
    assert (failed.state, failed.error.error_type) == ("failed", "unavailable")
    assert unknown.state == "unknown" and other.state == "unknown"  # another tenant's call is not there


async def test_remove_tool_drops_a_version_then_the_tool_from_tools_list(gateway: Gateway, backend: HttpBackend) -> None:
    for version in ("1.0.0", "2.0.0"):
        await register(gateway, "mail.send", version, input_schema=ANY, backend=f"http:{backend.url('/sms')}")
    async with channel(gateway.grpc, gateway.token("tools:*")) as ch:
        stub = tools_pb2_grpc.ToolGatewayStub(ch)
        first = await stub.RemoveTool(tools_pb2.RemoveToolRequest(name="mail.send", version="2.0.0"))
        async with mcp_client(gateway, gateway.token("tools:read")) as client:
            [tool] = (await client.list_tools()).tools
        rest = await stub.RemoveTool(tools_pb2.RemoveToolRequest(name="mail.send"))
        with pytest.raises(grpc.aio.AioRpcError) as gone:
            await stub.RemoveTool(tools_pb2.RemoveToolRequest(name="mail.send"))
        async with mcp_client(gateway, gateway.token("tools:read")) as client:
            assert (await client.list_tools()).tools == []
    removals = await removal_events(gateway)
    assert list(first.versions) == ["2.0.0"] and list(rest.versions) == ["1.0.0"] and tool.name == "mail.send"
    assert error_detail(gone.value).error_type == "not_found"
    # one tool.removed per removal that removed something, published through the outbox
    assert removals == [("mail.send", ["2.0.0"], False), ("mail.send", ["1.0.0"], True)]


async def removal_events(gateway: Gateway) -> list[tuple[str, list[str], bool]]:
    """The tool.removed events of the gateway's outbox, in order, once the relay has published them all."""
    conn = await asyncpg.connect(gateway.settings.database_url,
                                 server_settings={"search_path": f"{gateway.settings.namespace}_tool_gateway"})
    try:
        with anyio.fail_after(15):
            while rows := await conn.fetch("SELECT fields, published_at FROM outbox"
                                           " WHERE fields->>'event_type' = 'tool.removed' ORDER BY id"):
                if all(row["published_at"] is not None for row in rows):
                    break
                await anyio.sleep(0.1)
    finally:
        await conn.close()
    events = [Envelope.from_fields(json.loads(row["fields"]) if isinstance(row["fields"], str) else row["fields"])
              .message() for row in rows]
    return [(e.name, list(e.versions), e.all_versions) for e in events]


async def test_an_upstream_added_through_one_replica_is_served_by_both_and_removed_from_both(
    redis_url: str, database_url: str, tmp_path
) -> None:
    first = gateway_settings(redis_url, database_url, tmp_path / "a", tool_upstream_poll_seconds=0.2,
                             tool_upstream_commands=Path(sys.executable).name)
    second = first.model_copy(update={"tool_gateway_grpc_port": test_mcp.free_port(),
                                      "mcp_http_port": test_mcp.free_port()})
    try:
        async with test_mcp.running(first) as a, test_mcp.running(second) as b:
            async with channel(a.grpc, a.token("tools:*")) as ch:
                stub = tools_pb2_grpc.ToolGatewayStub(ch)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.AddUpstream(tools_pb2.AddUpstreamRequest(upstream=tools_pb2.Upstream(
                        name="shell", command=["sh", "-c", "id"])))
                await stub.AddUpstream(tools_pb2.AddUpstreamRequest(upstream=tools_pb2.Upstream(
                    name="fx", command=[sys.executable, FIXTURE, "stdio"])))
                for gw in (a, b):
                    async with mcp_client(gw, gw.token("tools:*")) as client:
                        with anyio.fail_after(30):
                            while (result := await client.call_tool("fx.echo", {"text": "hi"})).is_error:
                                await anyio.sleep(0.1)
                        assert result.structured_content == {"echo": "hi"}
                [listed] = (await stub.ListUpstreams(tools_pb2.ListUpstreamsRequest())).upstreams
                await stub.RemoveUpstream(tools_pb2.RemoveUpstreamRequest(name="fx"))
            for gw in (a, b):
                async with mcp_client(gw, gw.token("tools:*")) as client:
                    with anyio.fail_after(30):
                        while any(t.name.startswith("fx.") for t in (await client.list_tools()).tools):
                            await anyio.sleep(0.1)
    finally:
        await test_mcp.drop_namespace(first)
    assert error_detail(refused.value).error_type == "permission_denied"
    assert (listed.upstream.name, listed.state, listed.tools) == ("fx", "up", 13)

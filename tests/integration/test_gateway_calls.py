"""The call pipeline end to end: a real gateway (PostgreSQL, Redis), the official MCP client and gRPC on one
side, a real HTTP backend on the other. Audit rows, tool events, shared rate limits and breakers are checked
where they live."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator

import anyio
import asyncpg
import grpc
import pytest
import test_mcp
from google.protobuf import struct_pb2
from http_backend import HttpBackend, http_backend
from test_mcp import Gateway, gateway_settings, mcp_client, register

from libs.auth import issue_token
from libs.protogen.mnemesh.v1 import tools_pb2, tools_pb2_grpc
from libs.rpc import channel, error_detail

pytestmark = pytest.mark.integration
gateway = test_mcp.gateway
ANY = {"type": "object"}
CUSTOMER = {"type": "object", "properties": {"cid": {"type": "string"}, "vip": {"type": "boolean"}},
            "required": ["cid"]}


@pytest.fixture
async def backend() -> AsyncIterator[HttpBackend]:
    async with http_backend() as state:
        yield state


async def audit_rows(gw: Gateway, tenant: str = "acme", count: int = 1) -> list[asyncpg.Record]:
    """The tenant's audit rows once there are `count` (they are written in batches, within milliseconds)."""
    conn = await asyncpg.connect(gw.settings.database_url,
                                 server_settings={"search_path": f"{gw.settings.namespace}_tool_gateway"})
    try:
        with anyio.fail_after(10):
            while len(rows := await conn.fetch("SELECT * FROM tool_calls WHERE tenant_id = $1 ORDER BY called_at",
                                               tenant)) < count:
                await anyio.sleep(0.01)
        return rows
    finally:
        await conn.close()


async def grpc_call(gw: Gateway, name: str, arguments: dict, token: str | None = None,
                    **fields) -> tools_pb2.CallToolResponse:
    args = struct_pb2.Struct()
    args.update(arguments)
    async with channel(gw.grpc, token or gw.token("tools:*", "crm:read")) as ch:
        return await tools_pb2_grpc.ToolGatewayStub(ch).CallTool(
            tools_pb2.CallToolRequest(name=name, arguments=args, **fields), timeout=15)


@pytest.mark.parametrize("mode", test_mcp.MODES)
async def test_an_mcp_call_reaches_the_http_backend_and_returns_cleaned_structured_content(
    gateway: Gateway, backend: HttpBackend, mode: str
) -> None:
    await register(gateway, "crm.customer", input_schema=CUSTOMER, backend=f"http:GET {backend.url('/customers/{cid}')}")
    async with mcp_client(gateway, gateway.token("tools:read", "tools:call"), mode) as client:
        result = await client.call_tool("crm.customer", {"cid": "c 7", "vip": True})
    assert not result.is_error
    assert result.structured_content == {"id": "c 7", "name": "Li Wei", "vip": "true"}  # no _links, no nulls
    assert result.content[0].text == '{"id":"c 7","name":"Li Wei","vip":"true"}'
    [row] = await audit_rows(gateway)
    assert (row["caller"], row["tool"], row["version"], row["outcome"]) == ("agent-1", "crm.customer", "1.0.0", "ok")
    assert len(row["args_sha256"]) == 64 and row["latency_ms"] > 0


async def test_a_backend_refusal_is_mapped_to_a_structured_error_without_its_internals(
    gateway: Gateway, backend: HttpBackend
) -> None:
    await register(gateway, "crm.customer", input_schema=CUSTOMER, backend=f"http:GET {backend.url('/customers/{cid}')}")
    async with mcp_client(gateway, gateway.token("tools:read", "tools:call")) as client:
        result = await client.call_tool("crm.customer", {"cid": "missing"})
    error = result.structured_content
    assert result.is_error and error["error_type"] == "backend_error" and error["retryable"] is False
    assert "HTTP 404" in error["reason"] and "no customer with that id" in error["reason"]
    assert "internal-detail" not in json.dumps(error)


async def test_a_grpc_call_runs_the_same_pipeline_and_refusals_carry_their_status(
    gateway: Gateway, backend: HttpBackend
) -> None:
    await register(gateway, "crm.customer", input_schema=CUSTOMER, backend=f"http:GET {backend.url('/customers/{cid}')}",
                   scopes=["crm:read"])
    ok = await grpc_call(gateway, "crm.customer", {"cid": "c-1"}, context="support")
    assert (ok.outcome, ok.result["name"], ok.version) == ("ok", "Li Wei", "1.0.0")
    with pytest.raises(grpc.aio.AioRpcError) as denied:
        await grpc_call(gateway, "crm.customer", {"cid": "c-1"}, token=gateway.token("tools:call"))
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "crm:read" in error_detail(denied.value).reason
    with pytest.raises(grpc.aio.AioRpcError) as invalid:
        await grpc_call(gateway, "crm.customer", {"cid": 7})
    detail = error_detail(invalid.value)
    assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT and detail.field == "arguments/cid"
    assert [r["outcome"] for r in await audit_rows(gateway, count=3)] == ["ok", "error", "error"]
    assert backend.calls["customer"] == 1


async def test_scopes_hide_tools_from_the_list_and_refuse_their_calls(gateway: Gateway, backend: HttpBackend) -> None:
    await register(gateway, "crm.customer", input_schema=CUSTOMER, backend=f"http:GET {backend.url('/customers/{cid}')}",
                   scopes=["crm:read"])
    await register(gateway, "mail.send", input_schema=ANY, backend=f"http:{backend.url('/sms')}")
    async with mcp_client(gateway, gateway.token("tools:read", "tools:call")) as client:
        listed = [t.name for t in (await client.list_tools()).tools]
        refused = await client.call_tool("crm.customer", {"cid": "c-1"})
    assert listed == ["mail.send"]
    assert refused.is_error and refused.structured_content["error_type"] == "permission_denied"
    assert backend.calls["customer"] == 0


async def test_retryable_backend_failures_are_retried_then_succeed(gateway: Gateway, backend: HttpBackend) -> None:
    backend.fail_first = 2
    await register(gateway, "jobs.submit", input_schema=ANY, backend=f"http:POST {backend.url('/flaky')}", retries=2)
    response = await grpc_call(gateway, "jobs.submit", {"job": "x"})
    assert response.outcome == "ok" and response.result["body"] == {"job": "x"}
    assert backend.calls["flaky"] == 3


async def test_a_timeout_triggers_the_fallback_chain(gateway: Gateway, backend: HttpBackend) -> None:
    await register(gateway, "notify.sms", input_schema=ANY, backend=f"http:POST {backend.url('/sms')}")
    await register(gateway, "notify.email", input_schema=ANY, backend=f"http:POST {backend.url('/hang')}",
                   timeout_seconds=0.3, fallback=["notify.sms"])
    async with mcp_client(gateway, gateway.token("tools:read", "tools:call")) as client:
        result = await client.call_tool("notify.email", {"to": "li@example.com"})
    assert not result.is_error and result.structured_content == {"sent_by": "sms"}
    assert (backend.calls["hang"], backend.calls["fallback"]) == (1, 1)
    [row] = await audit_rows(gateway)
    assert (row["tool"], row["outcome"]) == ("notify.email", "fallback")


async def test_a_big_result_is_capped_and_readable_whole_from_the_results_store(
    gateway: Gateway, backend: HttpBackend
) -> None:
    await register(gateway, "report.rows", input_schema=ANY, backend=f"http:GET {backend.url('/big')}")
    response = await grpc_call(gateway, "report.rows", {})
    assert response.truncated and response.resource_uri == f"mem://step/{response.call_id}"
    assert response.result["total_bytes"] > gateway.settings.tool_result_max_bytes


async def test_tool_events_build_per_tenant_experience_served_by_tool_stats_and_tools_list(
    gateway: Gateway, backend: HttpBackend
) -> None:
    await register(gateway, "crm.customer", input_schema=CUSTOMER, backend=f"http:GET {backend.url('/customers/{cid}')}")
    await grpc_call(gateway, "crm.customer", {"cid": "c-1"}, context="refund")
    await grpc_call(gateway, "crm.customer", {"cid": "missing"})
    async with channel(gateway.grpc, gateway.token("tools:read")) as ch:
        stub = tools_pb2_grpc.ToolGatewayStub(ch)
        with anyio.fail_after(20):
            while not (stats := (await stub.ToolStats(tools_pb2.ToolStatsRequest(name="crm.customer"))).stats) \
                    or stats[0].calls < 2:
                await anyio.sleep(0.05)
        [refund] = (await stub.ToolStats(tools_pb2.ToolStatsRequest(name="crm.customer", context="refund"))).stats
        [listed] = [t for t in (await stub.ListTools(tools_pb2.ListToolsRequest(with_experience=True))).tools
                    if t.name == "crm.customer"]  # beside the gateway's own memory.* tools
    async with channel(gateway.grpc, issue_token(gateway.settings, subject="x", tenant_id="other",
                                                 scopes=["tools:read"])) as ch:
        others = (await tools_pb2_grpc.ToolGatewayStub(ch).ToolStats(tools_pb2.ToolStatsRequest())).stats
    [stat] = stats
    assert (stat.calls, stat.failures, stat.success_rate) == (2, 1, 0.5) and 0 < stat.p50_ms <= stat.p99_ms
    assert stat.common_errors[0].error_type == "backend_error" and "HTTP 404" in stat.common_errors[0].reason
    assert stat.best_arguments["cid"] == ["c-1"] and (refund.calls, refund.failures) == (1, 0)
    assert "[experience: 50 % success over 2 calls" in listed.description
    async with mcp_client(gateway, gateway.token("tools:read", "tools:call")) as client:
        [tool] = (await client.list_tools()).tools
        guide = await client.read_resource("mem://tool/crm.customer/guide")
        prompt = await client.get_prompt("crm.customer", {"task": "find customer c-9"})
    assert "common error: backend_error" in tool.description
    assert "1× backend_error" in guide.contents[0].text and "Task: find customer c-9" in prompt.messages[0].content.text
    assert others == []  # another tenant sees none of it (arguments included)


@pytest.fixture
async def two_gateways(redis_url: str, database_url: str, tmp_path) -> AsyncIterator[tuple[Gateway, Gateway]]:
    """Two replicas sharing PostgreSQL schema and Redis namespace; per-caller limit 5/s (burst 10)."""
    first = gateway_settings(redis_url, database_url, tmp_path / "a", tool_rate_per_caller=5.0,
                             tool_breaker_failures=3, tool_breaker_open_seconds=1.0)
    second = first.model_copy(update={"tool_gateway_grpc_port": test_mcp.free_port(),
                                      "mcp_http_port": test_mcp.free_port()})
    async with test_mcp.running(first) as a, test_mcp.running(second) as b:
        yield a, b
    await test_mcp.drop_namespace(first)


async def test_the_rate_limit_per_caller_holds_across_two_gateway_replicas(
    two_gateways: tuple[Gateway, Gateway], backend: HttpBackend
) -> None:
    a, b = two_gateways
    await register(a, "mail.send", input_schema=ANY, backend=f"http:{backend.url('/sms')}")
    outcomes = []
    started = time.monotonic()
    async with channel(a.grpc, a.token("tools:call")) as ch_a, channel(b.grpc, b.token("tools:call")) as ch_b:
        stubs = [tools_pb2_grpc.ToolGatewayStub(ch) for ch in (ch_a, ch_b)]
        for i in range(40):  # alternating replicas, as fast as they answer
            try:
                await stubs[i % 2].CallTool(tools_pb2.CallToolRequest(name="mail.send"), timeout=10)
                outcomes.append("ok")
            except grpc.aio.AioRpcError as exc:
                outcomes.append(error_detail(exc).error_type)
    elapsed = time.monotonic() - started
    # One shared bucket: the burst of 10, plus what 5/s refilled while the loop ran; never 10 per replica.
    allowed = 10 + math.ceil(elapsed * 5)
    assert 10 <= outcomes.count("ok") <= allowed, (outcomes, elapsed)
    assert outcomes.count("ok") < 20 and outcomes.count("rate_limited") == 40 - outcomes.count("ok")
    assert backend.calls["fallback"] == outcomes.count("ok")


async def test_a_breaker_opened_through_one_replica_refuses_on_the_other_then_half_opens_and_closes(
    two_gateways: tuple[Gateway, Gateway], backend: HttpBackend
) -> None:
    a, b = two_gateways
    backend.down = True
    await register(a, "jobs.submit", input_schema=ANY, backend=f"http:POST {backend.url('/flaky')}")
    for _ in range(3):
        assert (await grpc_call(a, "jobs.submit", {})).error.error_type == "unavailable"
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await grpc_call(b, "jobs.submit", {})
    assert error_detail(refused.value).error_type == "circuit_open"
    assert backend.calls["flaky"] == 3
    backend.down = False
    with anyio.fail_after(10):  # open for 1 s, then one probe is let through and closes it
        while True:
            try:
                response = await grpc_call(b, "jobs.submit", {})
                break
            except grpc.aio.AioRpcError as exc:
                assert error_detail(exc).error_type == "circuit_open"
                await asyncio.sleep(0.25)  # within the caller's rate limit (5/s, burst 10) however fast
    assert response.outcome == "ok"
    assert (await grpc_call(a, "jobs.submit", {})).outcome == "ok"


async def test_audit_rows_still_queued_when_the_gateway_stops_are_written_not_lost(
    redis_url: str, database_url: str, tmp_path, backend: HttpBackend
) -> None:
    # Nothing flushes on its own for a minute: every row is still queued when the gateway is told to stop.
    settings = gateway_settings(redis_url, database_url, tmp_path, tool_audit_flush_ms=60_000)
    try:
        async with test_mcp.running(settings) as gw:
            await register(gw, "mail.send", input_schema=ANY, backend=f"http:{backend.url('/sms')}")
            async with channel(gw.grpc, gw.token("tools:call")) as ch:
                stub = tools_pb2_grpc.ToolGatewayStub(ch)
                answers = await asyncio.gather(*(stub.CallTool(tools_pb2.CallToolRequest(name="mail.send"),
                                                               timeout=15) for _ in range(30)))
            assert all(a.outcome == "ok" for a in answers)
        # The gateway has stopped (the block above waited for it); nothing of its queue may be missing.
        conn = await asyncpg.connect(database_url, server_settings={"search_path": f"{settings.namespace}_tool_gateway"})
        try:
            rows = await conn.fetchval("SELECT count(*) FROM tool_calls WHERE tenant_id = 'acme'")
            events = await conn.fetchval("SELECT count(*) FROM outbox WHERE fields->>'event_type' = 'tool.called'")
        finally:
            await conn.close()
        assert (rows, events) == (30, 30)
    finally:
        await test_mcp.drop_namespace(settings)

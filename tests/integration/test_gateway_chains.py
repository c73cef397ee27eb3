"""Tool chains, status tools, tasks and cancelled calls against real gateways (PostgreSQL, Redis), a real
HTTP backend, gRPC and the official MCP SDK client over Streamable HTTP; two real gateway processes
share a chain and a task."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import grpc
import mcp_types as types
import pytest
import redis.asyncio
import test_mcp
from mcp.shared.exceptions import MCPError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from http_backend import serving
from mnemesh.supervisor import check_health
from test_gateway_replicas import gateway_process
from test_gateway_stdio import settings_env
from test_mcp import Gateway, gateway_settings, mcp_client, register

from libs.auth import issue_token
from libs.protogen.mnemesh.v1 import tools_pb2, tools_pb2_grpc
from libs.rpc import channel, error_detail
from mnemesh.infra import free_port

pytestmark = pytest.mark.integration
ANY = {"type": "object"}
CHAIN = "mnemesh/chain_id"


@dataclass
class Booking:
    """A booking backend: quote, hold, pay (down on demand, or slow: it pays, then answers late), the status of
    a payment, and a report that takes until released."""

    port: int
    calls: Counter = field(default_factory=Counter)
    pay_down: bool = False
    pay_delay: float = 0.0
    pay_records: bool = True  # a slow payment happens (is recorded) before its late answer
    paid: dict = field(default_factory=dict)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def booking_app(state: Booking) -> Starlette:
    async def quote(request: Request) -> JSONResponse:
        state.calls["quote"] += 1
        return JSONResponse({"price": 90, "n": state.calls["quote"], "city": (await request.json()).get("city")})

    async def hold(request: Request) -> JSONResponse:
        state.calls["hold"] += 1
        return JSONResponse({"hold": f"h-{state.calls['hold']}"})

    async def pay(request: Request) -> JSONResponse:
        state.calls["pay"] += 1
        body = await request.json()
        if state.pay_down:
            return JSONResponse({"error": "payments down"}, 503)
        if state.pay_records:
            state.paid[body["ref"]] = {"transfer": f"t-{body['ref']}", "amount": body.get("amount")}
        await asyncio.sleep(state.pay_delay)
        return JSONResponse(state.paid.get(body["ref"], {"transfer": None}))

    async def pay_status(request: Request) -> JSONResponse:
        state.calls["pay_status"] += 1
        ref = (await request.json())["ref"]
        if ref in state.paid:
            return JSONResponse({"status": "completed", "result": state.paid[ref]})
        return JSONResponse({"status": "not_found"})

    async def report(request: Request) -> JSONResponse:
        state.calls["report"] += 1
        await state.release.wait()
        return JSONResponse({"report": "ready", "for": (await request.json()).get("month")})

    return Starlette(routes=[Route(f"/{name}", fn, methods=["POST"]) for name, fn in
                             [("quote", quote), ("hold", hold), ("pay", pay), ("pay_status", pay_status),
                              ("report", report)]])


@pytest.fixture
async def booking() -> AsyncIterator[Booking]:
    state = Booking(free_port())
    async with serving(booking_app(state), state, "/hold", "booking backend", method="POST"):
        yield state


async def register_booking(gw: Gateway, b: Booking, **pay_fields) -> None:
    await register(gw, "trip.quote", input_schema=ANY, backend=f"http:{b.url('/quote')}")
    await register(gw, "trip.hold", input_schema=ANY, backend=f"http:{b.url('/hold')}", requires=["trip.quote"])
    await register(gw, "trip.pay_status", input_schema=ANY, backend=f"http:{b.url('/pay_status')}")
    await register(gw, "trip.pay", input_schema=ANY, backend=f"http:{b.url('/pay')}", requires=["trip.hold"],
                   **pay_fields)
    await register(gw, "trip.report", input_schema=ANY, backend=f"http:{b.url('/report')}", timeout_seconds=60)


@contextlib.asynccontextmanager
async def one_gateway(redis_url: str, database_url: str, tmp_path: Path, **overrides) -> AsyncIterator[Gateway]:
    settings = gateway_settings(redis_url, database_url, tmp_path, tool_rate_per_caller=1000.0,
                                tool_breaker_failures=1000, **overrides)
    try:
        async with test_mcp.running(settings) as gw:
            yield gw
    finally:
        await test_mcp.drop_namespace(settings)


@pytest.fixture
async def gateway(redis_url: str, database_url: str, tmp_path: Path) -> AsyncIterator[Gateway]:
    async with one_gateway(redis_url, database_url, tmp_path) as gw:
        yield gw


def call(name: str, arguments: dict | None = None, **fields) -> tools_pb2.CallToolRequest:
    request = tools_pb2.CallToolRequest(name=name, **fields)
    request.arguments.update(arguments or {})
    return request


@contextlib.asynccontextmanager
async def stub_of(gw: Gateway, port: int | None = None) -> AsyncIterator[tools_pb2_grpc.ToolGatewayStub]:
    address = f"127.0.0.1:{port}" if port else gw.grpc
    async with channel(address, gw.token("tools:call", "tools:read")) as ch:
        yield tools_pb2_grpc.ToolGatewayStub(ch)


# Chains ------------------------------------------------------------------------------------------------


async def test_requires_is_refused_with_a_structured_error_then_allowed_once_done_in_the_chain_over_mcp(
    gateway: Gateway, booking: Booking
) -> None:
    await register_booking(gateway, booking)
    async with mcp_client(gateway, gateway.token("tools:read", "tools:call")) as client:
        refused = await client.call_tool("trip.hold", {}, meta={CHAIN: "trip-1"})
        quoted = await client.call_tool("trip.quote", {"city": "Oslo"}, meta={CHAIN: "trip-1"})
        held = await client.call_tool("trip.hold", {}, meta={CHAIN: "trip-1"})
        unchained = await client.call_tool("trip.hold", {})
    assert refused.is_error and refused.structured_content == {
        "error_type": "requires_unmet", "field": "chain_id", "retryable": False,
        "reason": "trip.hold requires trip.quote done successfully in chain 'trip-1' first (no step of this chain "
                  "is known: new, or expired)", "hint": "call trip.quote first with this chain id"}
    assert not quoted.is_error and not held.is_error and held.structured_content == {"hold": "h-1"}
    assert unchained.is_error and unchained.structured_content["hint"].startswith("call trip.quote first, passing")
    assert booking.calls == Counter({"quote": 1, "hold": 1})


async def test_a_failed_step_resumes_the_chain_without_calling_its_done_steps_again(
    gateway: Gateway, booking: Booking
) -> None:
    await register_booking(gateway, booking)
    steps = [("trip.quote", {"city": "Oslo"}), ("trip.hold", {}), ("trip.pay", {"ref": "r1", "amount": 90})]
    booking.pay_down = True
    async with mcp_client(gateway, gateway.token("tools:read", "tools:call")) as client:
        first = [await client.call_tool(name, args, meta={CHAIN: "trip-2"}) for name, args in steps]
        booking.pay_down = False
        again = [await client.call_tool(name, args, meta={CHAIN: "trip-2"}) for name, args in steps]
        twice = [await client.call_tool(name, args, meta={CHAIN: "trip-2"}) for name, args in steps]
    assert [r.is_error for r in first] == [False, False, True]
    # resumed a second time: every step replays (the replays did not replace the steps they replayed)
    replay_of = [(r.meta or {}).get("mnemesh/replay_of") for r in twice]
    assert replay_of[:2] == [(r.meta or {}).get("mnemesh/replay_of") for r in again[:2]] and replay_of[2]
    assert [r.structured_content for r in twice] == [r.structured_content for r in again]
    assert first[2].structured_content["error_type"] == "unavailable"
    assert [r.is_error for r in again] == [False, False, False]
    assert again[0].structured_content == first[0].structured_content  # the kept result, not a new quote
    assert [bool((r.meta or {}).get("mnemesh/replay_of")) for r in again] == [True, True, False]
    assert again[2].structured_content == {"transfer": "t-r1", "amount": 90}
    assert booking.calls == Counter({"quote": 1, "hold": 1, "pay": 2})
    async with stub_of(gateway) as stub:  # the audit trail says what happened, by the chain id
        last = await stub.GetCall(tools_pb2.GetCallRequest(call_id="trip-2"))
    assert (last.state, last.tool, last.outcome) == ("done", "trip.pay", "replayed")


async def test_a_chain_expires_after_its_ttl_in_redis(redis_url: str, database_url: str, tmp_path: Path,
                                                      booking: Booking) -> None:
    async with one_gateway(redis_url, database_url, tmp_path, tool_chain_ttl_seconds=1.0) as gw:
        await register_booking(gw, booking)
        async with stub_of(gw) as stub:
            await stub.CallTool(call("trip.quote", chain_id="trip-3"), timeout=10)
            held = await stub.CallTool(call("trip.hold", chain_id="trip-3"), timeout=10)
            client = redis.asyncio.from_url(redis_url)
            keys = [k async for k in client.scan_iter(match=f"{gw.settings.namespace}.tool-gateway.chain.*")]
            ttl_ms = await client.pttl(keys[0])
            await anyio.sleep(1.3)
            left = await client.exists(*keys)
            await client.aclose()
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.CallTool(call("trip.pay", {"ref": "r3"}, chain_id="trip-3"), timeout=10)
    assert held.outcome == "ok" and len(keys) == 1 and 0 < ttl_ms <= 1000 and left == 0
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    detail = error_detail(refused.value)
    assert (detail.error_type, detail.field) == ("requires_unmet", "chain_id") and "expired" in detail.reason


async def test_two_gateway_processes_share_a_chain_and_a_task(redis_url: str, database_url: str, tmp_path: Path,
                                                              booking: Booking) -> None:
    first = gateway_settings(redis_url, database_url, tmp_path, tool_rate_per_caller=1000.0)
    second = first.model_copy(update={"tool_gateway_grpc_port": free_port(), "mcp_http_port": free_port()})
    gw = Gateway(first, asyncio.Event(), None)  # type: ignore[arg-type]
    try:
        async with gateway_process(first, "first", tmp_path), gateway_process(second, "second", tmp_path):
            await register_booking(gw, booking)
            async with stub_of(gw) as a, stub_of(gw, second.tool_gateway_grpc_port) as b:
                await a.CallTool(call("trip.quote", {"city": "Rome"}, chain_id="trip-4"), timeout=10)
                held = await b.CallTool(call("trip.hold", chain_id="trip-4"), timeout=10)
                replayed = await b.CallTool(call("trip.quote", {"city": "Rome"}, chain_id="trip-4"), timeout=10)
                started = await a.CallTool(call("trip.report", {"month": "2026-11"}, as_task=True), timeout=10)
                working = await b.GetTask(tools_pb2.GetTaskRequest(task_id=started.task_id), timeout=10)
                doomed = await a.CallTool(call("trip.report", {"month": "2026-06"}, as_task=True, chain_id="report-c"),
                                          timeout=10)
                with anyio.fail_after(10):
                    while booking.calls["report"] < 2:
                        await anyio.sleep(0.05)
                cancelled = await b.CancelTask(tools_pb2.CancelTaskRequest(task_id=doomed.task_id), timeout=10)
                with anyio.fail_after(10):
                    while (audited := await b.GetCall(tools_pb2.GetCallRequest(call_id="report-c"))).state != "failed":
                        await anyio.sleep(0.1)
                with pytest.raises(grpc.aio.AioRpcError) as again_cancelled:
                    await b.CancelTask(tools_pb2.CancelTaskRequest(task_id=doomed.task_id), timeout=10)
                booking.release.set()
                with anyio.fail_after(20):
                    while (done := await b.GetTask(tools_pb2.GetTaskRequest(task_id=started.task_id),
                                                   timeout=10)).state == "working":
                        await anyio.sleep(0.1)
            shown = subprocess.run([sys.executable, "-m", "mnemesh", "tools", "task", started.task_id, "--json",
                                    "--tenant", "acme"], env=settings_env(second), capture_output=True, text=True,
                                   timeout=60)
            again = subprocess.run([sys.executable, "-m", "mnemesh", "tools", "call", "trip.hold", "--chain-id",
                                    "trip-4", "--json", "--tenant", "acme", "--user", "agent-1"],  # the chain's caller
                                   env=settings_env(first),
                                   capture_output=True, text=True, timeout=60)
    finally:
        await test_mcp.drop_namespace(first)
    assert held.outcome == "ok" and (replayed.outcome, replayed.result["city"]) == ("replayed", "Rome")
    assert booking.calls["quote"] == 1
    assert started.task_id and not started.call_id and working.state == "working" and working.tool == "trip.report"
    assert (done.state, done.call.outcome, dict(done.call.result)) == \
        ("completed", "ok", {"report": "ready", "for": "2026-11"})
    assert cancelled.state == "cancelled" and (audited.outcome, audited.tool) == ("cancelled", "trip.report")
    assert error_detail(again_cancelled.value).error_type == "task_ended"
    assert shown.returncode == 0, shown.stderr
    printed = json.loads(shown.stdout)
    assert (printed["state"], printed["call"]["result"]["report"]) == ("completed", "ready")
    assert again.returncode == 0, again.stderr
    replayed_hold = json.loads(again.stdout)
    assert (replayed_hold["outcome"], replayed_hold["replay_of"], replayed_hold["result"]) == \
        ("replayed", held.call_id, {"hold": "h-1"})
    assert booking.calls["hold"] == 1


# Status tools -------------------------------------------------------------------------------------------


async def test_a_timed_out_call_is_checked_with_its_status_tool_and_not_retried_when_it_happened(
    gateway: Gateway, booking: Booking
) -> None:
    await register_booking(gateway, booking, timeout_seconds=0.5, retries=2, status_tool="trip.pay_status")
    booking.pay_delay = 2.0
    async with stub_of(gateway) as stub:
        await stub.CallTool(call("trip.quote", chain_id="trip-5"), timeout=10)
        await stub.CallTool(call("trip.hold", chain_id="trip-5"), timeout=10)
        paid = await stub.CallTool(call("trip.pay", {"ref": "r5", "amount": 40}, chain_id="trip-5"), timeout=10)
    assert (paid.outcome, paid.served_by, dict(paid.result)) == ("ok", "trip.pay_status",
                                                                {"transfer": "t-r5", "amount": 40})
    assert (booking.calls["pay"], booking.calls["pay_status"]) == (1, 1)


async def test_a_timed_out_call_whose_status_says_it_did_not_happen_is_retried(
    gateway: Gateway, booking: Booking
) -> None:
    await register_booking(gateway, booking, timeout_seconds=0.5, retries=2, status_tool="trip.pay_status")
    booking.pay_delay, booking.pay_records = 2.0, False
    async with stub_of(gateway) as stub:
        await stub.CallTool(call("trip.quote", chain_id="trip-6"), timeout=10)
        await stub.CallTool(call("trip.hold", chain_id="trip-6"), timeout=10)
        paid = await stub.CallTool(call("trip.pay", {"ref": "r6"}, chain_id="trip-6"), timeout=20)
    assert (paid.outcome, paid.error.error_type, paid.error.retryable) == ("timeout", "deadline_exceeded", True)
    assert (booking.calls["pay"], booking.calls["pay_status"]) == (3, 3)


# Tasks and cancellation ----------------------------------------------------------------------------------


async def test_mcp_tasks_on_2025_11_25_with_the_official_client(gateway: Gateway, booking: Booking) -> None:
    await register_booking(gateway, booking)
    async with mcp_client(gateway, gateway.token("tools:read", "tools:call"), mode="legacy") as client:
        assert client.protocol_version == "2025-11-25"
        tasks_capability = client.server_capabilities.tasks
        listed = {t.name: t for t in (await client.list_tools()).tools}
        created = await client.session.send_request(
            types.CallToolRequest(params=types.CallToolRequestParams(
                name="trip.report", arguments={"month": "2026-10"}, task=types.TaskMetadata(ttl=60_000))),
            types.CreateTaskResult)
        polled = await client.session.send_request(
            types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=created.task.task_id)), types.GetTaskResult)
        booking.release.set()
        result = await client.session.send_request(
            types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=created.task.task_id)),
            types.CallToolResult)
        done = await client.session.send_request(
            types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=created.task.task_id)), types.GetTaskResult)
        booking.release = asyncio.Event()
        other = await client.session.send_request(
            types.CallToolRequest(params=types.CallToolRequestParams(
                name="trip.report", arguments={"month": "2026-05"}, task=types.TaskMetadata(ttl=60_000))),
            types.CreateTaskResult)
        cancelled = await client.session.send_request(
            types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=other.task.task_id)),
            types.CancelTaskResult)
        with pytest.raises(MCPError) as ended:
            await client.session.send_request(
                types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=created.task.task_id)),
                types.CancelTaskResult)
    assert tasks_capability is not None and tasks_capability.requests.tools.call is not None
    assert tasks_capability.cancel is not None and cancelled.status == "cancelled"
    assert ended.value.error.data["error_type"] == "task_ended"
    assert listed["trip.report"].execution.task_support == "optional"
    assert created.task.status == "working" and polled.status == "working"
    assert not result.is_error and result.structured_content == {"report": "ready", "for": "2026-10"}
    assert result.meta["io.modelcontextprotocol/related-task"] == {"taskId": created.task.task_id}
    assert done.status == "completed"


async def test_a_call_its_grpc_caller_cancels_is_audited_as_cancelled(gateway: Gateway, booking: Booking) -> None:
    await register_booking(gateway, booking)
    async with stub_of(gateway) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as gave_up:
            await stub.CallTool(call("trip.report", {"month": "2026-09"}, chain_id="report-9"), timeout=0.5)
        with anyio.fail_after(10):
            while (found := await stub.GetCall(tools_pb2.GetCallRequest(call_id="report-9"))).state != "failed":
                await anyio.sleep(0.1)
    assert gave_up.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert (found.tool, found.outcome, found.error.error_type) == ("trip.report", "cancelled", "cancelled")
    assert booking.calls["report"] == 1


@contextlib.asynccontextmanager
async def doomed_process(settings, log_dir: Path) -> AsyncIterator[subprocess.Popen]:
    """A gateway process with a short task lease (a setting the shared helper does not pass on), killed by the test."""
    log = (log_dir / "doomed.log").open("w")
    process = subprocess.Popen([sys.executable, "-m", "mnemesh", "serve", "tool-gateway"],
                               env=settings_env(settings, MNEMESH_TOOL_TASK_LEASE_SECONDS="1.5"), stdout=log,
                               stderr=subprocess.STDOUT)
    try:
        with anyio.fail_after(60):
            while not await check_health(f"127.0.0.1:{settings.tool_gateway_grpc_port}"):
                assert process.poll() is None, (log_dir / "doomed.log").read_text()[-2000:]
                await anyio.sleep(0.2)
        yield process
    finally:
        process.kill()
        process.wait(20)
        log.close()


async def test_a_task_whose_gateway_process_is_killed_answers_failed_as_lost_on_another(
    redis_url: str, database_url: str, tmp_path: Path, booking: Booking
) -> None:
    first = gateway_settings(redis_url, database_url, tmp_path, tool_task_lease_seconds=1.5)
    second = first.model_copy(update={"tool_gateway_grpc_port": free_port(), "mcp_http_port": free_port()})
    try:
        async with doomed_process(first, tmp_path) as doomed, test_mcp.running(second) as other:
            await register_booking(other, booking)
            async with stub_of(other, first.tool_gateway_grpc_port) as a, stub_of(other) as b:
                started = await a.CallTool(call("trip.report", {"month": "2026-08"}, as_task=True), timeout=10)
                with anyio.fail_after(10):
                    while booking.calls["report"] == 0:
                        await anyio.sleep(0.05)
                working = await b.GetTask(tools_pb2.GetTaskRequest(task_id=started.task_id), timeout=10)
                doomed.kill()
                doomed.wait(10)
                with anyio.fail_after(15):
                    while (lost := await b.GetTask(tools_pb2.GetTaskRequest(task_id=started.task_id),
                                                   timeout=10)).state == "working":
                        await anyio.sleep(0.2)
            async with mcp_client(other, other.token("tools:read", "tools:call"), mode="legacy") as client:
                result = await client.session.send_request(types.GetTaskPayloadRequest(
                    params=types.GetTaskPayloadRequestParams(task_id=started.task_id)), types.CallToolResult)
    finally:
        await test_mcp.drop_namespace(first)
    assert working.state == "working"
    assert lost.state == "failed" and "stopped before it ended" in lost.status_message
    # MCP tasks/result: a structured error saying the task was lost, not an internal error
    assert result.is_error and result.structured_content["error_type"] == "task_lost"
    assert result.structured_content["retryable"] is False and "GetCall" in result.structured_content["hint"]


async def test_a_task_call_refused_before_its_backend_answers_the_refusal_itself_over_grpc_and_mcp(
    gateway: Gateway, booking: Booking
) -> None:
    await register_booking(gateway, booking)
    async with stub_of(gateway) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await stub.CallTool(call("trip.nothing", as_task=True), timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as unmet:
            await stub.CallTool(call("trip.hold", as_task=True, chain_id="task-chain"), timeout=10)
    async with mcp_client(gateway, gateway.token("tools:read", "tools:call"), mode="legacy") as client:
        refused = await client.session.send_request(
            types.CallToolRequest(params=types.CallToolRequestParams(
                name="trip.hold", arguments={}, task=types.TaskMetadata(ttl=60_000))), types.CallToolResult)
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_detail(unmet.value).error_type == "requires_unmet"
    assert refused.is_error and refused.structured_content["error_type"] == "requires_unmet"
    assert booking.calls == Counter()


async def test_mcp_and_grpc_tasks_are_their_callers_own_and_task_ids_are_checked(gateway: Gateway,
                                                                                booking: Booking) -> None:
    await register_booking(gateway, booking)
    stranger = issue_token(gateway.settings, subject="agent-2", tenant_id="acme", scopes=["tools:read", "tools:call"])
    async with mcp_client(gateway, gateway.token("tools:read", "tools:call"), mode="legacy") as client:
        created = await client.session.send_request(
            types.CallToolRequest(params=types.CallToolRequestParams(
                name="trip.report", arguments={"month": "2026-04"}, task=types.TaskMetadata(ttl=60_000))),
            types.CreateTaskResult)
        with pytest.raises(MCPError) as malformed:
            await client.session.send_request(
                types.GetTaskRequest(params=types.GetTaskRequestParams(task_id="../x")), types.GetTaskResult)
    task_id = created.task.task_id
    refusals = []
    async with mcp_client(gateway, stranger, mode="legacy") as client:
        for request, answer in ((types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id)),
                                 types.GetTaskResult),
                                (types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=task_id)),
                                 types.CallToolResult),
                                (types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=task_id)),
                                 types.CancelTaskResult)):
            with pytest.raises(MCPError) as refused:
                await client.session.send_request(request, answer)
            refusals.append(refused.value.error.data["error_type"])
    async with channel(gateway.grpc, stranger) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as grpc_refused:
            await tools_pb2_grpc.ToolGatewayStub(ch).GetTask(tools_pb2.GetTaskRequest(task_id=task_id), timeout=10)
    async with stub_of(gateway) as stub:
        mine = await stub.GetTask(tools_pb2.GetTaskRequest(task_id=task_id), timeout=10)
    booking.release.set()
    assert refusals == ["not_found"] * 3 and grpc_refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert mine.state == "working" and mine.tool == "trip.report"  # the stranger's cancel did nothing
    assert (malformed.value.error.data["error_type"], malformed.value.error.data["field"]) == \
        ("validation", "taskId")


@pytest.mark.parametrize("mode", test_mcp.MODES)
async def test_a_call_its_mcp_client_cancels_is_audited_as_cancelled(gateway: Gateway, booking: Booking,
                                                                    mode: str) -> None:
    await register_booking(gateway, booking)
    async with mcp_client(gateway, gateway.token("tools:read", "tools:call"), mode) as client:
        running = asyncio.create_task(client.call_tool("trip.report", {"month": "2026-07"},
                                                       meta={CHAIN: f"report-{mode}"}))
        with anyio.fail_after(10):
            while booking.calls["report"] == 0:
                await anyio.sleep(0.05)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
    async with stub_of(gateway) as stub:
        with anyio.fail_after(10):
            while (found := await stub.GetCall(tools_pb2.GetCallRequest(call_id=f"report-{mode}"))).state != "failed":
                await anyio.sleep(0.1)
    assert (found.tool, found.outcome, found.error.error_type) == ("trip.report", "cancelled", "cancelled")

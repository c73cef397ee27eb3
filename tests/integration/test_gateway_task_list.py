"""Listing tasks against a real gateway (PostgreSQL, Redis): MCP `tasks/list` with the official SDK client on
2025-11-25, gRPC `ListTasks` and `mnemesh tools tasks`, each caller seeing only its own tasks; and the Redis task
store's listing itself (order within a millisecond, expired tasks, trimming, a bounded read)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import anyio
import grpc
import mcp_types as types
import pytest
from http_backend import serving
from mcp.shared.exceptions import MCPError
from test_gateway_chains import Booking, booking_app, call, one_gateway, register_booking, stub_of
from test_gateway_stdio import settings_env
from test_mcp import mcp_client

from libs.auth import issue_token
from libs.protogen.mnemesh.v1 import tools_pb2, tools_pb2_grpc
from libs.rpc import channel, error_detail
from mnemesh.infra import free_port
from services.tool_gateway.adapters.redis_chains import RedisTaskStore

pytestmark = pytest.mark.integration


async def list_all(client, cursor: str | None = None) -> types.ListTasksResult:
    return await client.session.send_request(
        types.ListTasksRequest(params=types.PaginatedRequestParams(cursor=cursor)), types.ListTasksResult)


async def cli(gw, *args: str) -> subprocess.CompletedProcess:
    return await anyio.run_process([sys.executable, "-m", "mnemesh", "tools", "tasks", *args, "--tenant", "acme",
                                    "--user", "agent-1"], env=settings_env(gw.settings), check=False)


async def test_callers_list_their_own_tasks_over_mcp_grpc_and_the_cli(redis_url: str, database_url: str,
                                                                      tmp_path: Path) -> None:
    booking = Booking(free_port())
    async with serving(booking_app(booking), booking, "/hold", "booking backend", method="POST"), \
            one_gateway(redis_url, database_url, tmp_path) as gw:
        await register_booking(gw, booking)
        stranger = issue_token(gw.settings, subject="agent-2", tenant_id="acme", scopes=["tools:read", "tools:call"])
        async with mcp_client(gw, gw.token("tools:read", "tools:call"), mode="legacy") as client:
            announced = client.server_capabilities.tasks
            created = [await client.session.send_request(
                types.CallToolRequest(params=types.CallToolRequestParams(
                    name="trip.report", arguments={"month": f"2026-0{k}"}, task=types.TaskMetadata(ttl=60_000))),
                types.CreateTaskResult) for k in (1, 2, 3)]
            working = await list_all(client)
            with pytest.raises(MCPError) as bad_cursor:
                await list_all(client, "not-a-cursor")
            async with stub_of(gw) as stub:
                first = await stub.ListTasks(tools_pb2.ListTasksRequest(limit=2), timeout=10)
                rest = await stub.ListTasks(tools_pb2.ListTasksRequest(cursor=first.next_cursor, limit=2), timeout=10)
                with pytest.raises(grpc.aio.AioRpcError) as too_many:
                    await stub.ListTasks(tools_pb2.ListTasksRequest(limit=51), timeout=10)
                await stub.CallTool(call("trip.quote", {"city": "Oslo"}), timeout=10)  # not a task: not listed
            booking.release.set()
            with anyio.fail_after(20):
                ended = await list_all(client)
                while {t.status for t in ended.tasks} != {"completed"}:
                    await asyncio.sleep(0.1)
                    ended = await list_all(client)
        async with mcp_client(gw, stranger, mode="legacy") as client:
            theirs = await list_all(client)
        async with channel(gw.grpc, stranger) as ch:
            theirs_grpc = await tools_pb2_grpc.ToolGatewayStub(ch).ListTasks(tools_pb2.ListTasksRequest(), timeout=10)
        with anyio.fail_after(60):  # the gateway runs in this process: its loop must go on meanwhile
            printed = await cli(gw, "--json")
            shown = await cli(gw, "--limit", "1")
    ids = [c.task.task_id for c in created]
    assert announced is not None and announced.list is not None
    assert [t.task_id for t in working.tasks] == ids and {t.status for t in working.tasks} == {"working"}
    assert working.next_cursor is None
    assert bad_cursor.value.error.code == types.INVALID_PARAMS
    assert bad_cursor.value.error.data["field"] == "cursor"
    assert [t.task_id for t in first.tasks] == ids[:2] and first.next_cursor
    assert [t.task_id for t in rest.tasks] == ids[2:] and rest.next_cursor == ""
    assert too_many.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_detail(too_many.value).field == "limit"
    assert [t.task_id for t in ended.tasks] == ids
    assert theirs.tasks == [] and list(theirs_grpc.tasks) == []
    assert printed.returncode == 0, printed.stderr.decode()
    listed = json.loads(printed.stdout)
    assert [t["task_id"] for t in listed["tasks"]] == ids and listed["tasks"][0]["call"]["outcome"] == "ok"
    assert shown.returncode == 0, shown.stderr.decode()
    out = shown.stdout.decode()
    assert out.startswith(f"task {ids[0]} (trip.report): completed") and "--cursor" in out


# The task store's listing against real Redis ------------------------------------------------------------


def task(caller: str = "agent-1") -> tuple[str, dict]:
    task_id = uuid.uuid4().hex
    return task_id, {"task_id": task_id, "state": "working", "caller": caller}


async def test_tasks_begun_in_one_burst_list_in_order_and_a_full_last_page_has_no_cursor(redis_factory,
                                                                                         unique: str) -> None:
    store = RedisTaskStore(redis_factory, unique, ttl_seconds=60)
    begun = [task() for _ in range(12)]
    for task_id, state in begun:  # one after the other, several in one millisecond
        await store.begin("acme", task_id, state, 30, 100)
    listed, end = await store.list("acme", "agent-1", "", 12)
    first, cursor = await store.list("acme", "agent-1", "", 5)
    rest, _ = await store.list("acme", "agent-1", cursor, 50)
    client = await redis_factory()
    kept = await client.pttl(store.tenant_key("acme", "listed", "agent-1"))
    assert [s["task_id"] for s in listed] == [i for i, _ in begun] and end == ""
    assert [s["task_id"] for s in first + rest] == [i for i, _ in begun] and cursor
    assert 60_000 < kept <= 120_000  # two TTLs


async def test_expired_tasks_are_dropped_from_the_listing_and_a_listing_reads_a_bounded_number(redis_factory,
                                                                                              unique: str) -> None:
    store = RedisTaskStore(redis_factory, unique, ttl_seconds=60)
    client = await redis_factory()
    listed_key = store.tenant_key("acme", "listed", "agent-1")
    # 2,500 tasks whose keys expired (only their members are left), older than the live one
    await client.zadd(listed_key, {f"0000000000001:{k:012d}:{uuid.uuid4().hex}": 0 for k in range(2_500)})
    live_id, live = task()
    await store.begin("acme", live_id, live, 30, 16)  # trims members older than two TTLs: all of the above
    trimmed = await client.zcard(listed_key)
    await client.zadd(listed_key, {f"9000000000000:{k:012d}:{uuid.uuid4().hex}": 0 for k in range(2_500)})
    await client.zadd(listed_key, {f"0000000000002:{k:012d}:{uuid.uuid4().hex}": 0 for k in range(5)})
    started = time.perf_counter()
    page, cursor = await store.list("acme", "agent-1", "", 10)
    took = time.perf_counter() - started
    after, cursor2 = await store.list("acme", "agent-1", cursor, 10)
    left = await client.zcard(listed_key)
    assert trimmed == 1
    assert [s["task_id"] for s in page] == [live_id] and cursor  # the live one, then 2,000 members read: a cursor
    assert after == [] and cursor2 == ""  # the rest read on the next page, all expired
    assert left == 1 and took < 5  # every expired member met was removed

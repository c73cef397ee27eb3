"""Listing a caller's tasks (gRPC ListTasks, MCP tasks/list) through the TaskRunner and the pipeline's fakes."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from gateway_fakes import FakeTasks, fake_ports

from libs.auth import Principal
from libs.errors import ValidationFailed
from services.tool_gateway.domain import ToolCall, ToolSpec
from services.tool_gateway.service_layer import handlers
from services.tool_gateway.service_layer.tasks import LIST_PAGE, TaskRunner

AGENT = Principal(subject="agent-1", tenant_id="acme", scopes=frozenset({"tools:call"}))


async def runner_with_a_hanging_tool() -> tuple[TaskRunner, FakeTasks]:
    ports = fake_ports()
    await handlers.register_tool(ToolSpec(name="slow.job", description="A report that takes a while.",
                                          input_schema={"type": "object"}, timeout_seconds=30), ports.registry)

    async def hang(arguments: dict) -> dict:
        await asyncio.Event().wait()
        return {}

    ports.backends.behaviours["slow.job"] = hang
    store = FakeTasks()
    return TaskRunner(ports, store), store


def start(runner: TaskRunner, principal: Principal = AGENT):
    return runner.start(ToolCall(name="slow.job", arguments={}, principal=principal))


async def test_a_caller_lists_its_own_tasks_oldest_first_a_page_at_a_time() -> None:
    runner, _ = await runner_with_a_hanging_tool()
    mine = [(await start(runner))["task_id"] for _ in range(5)]
    await start(runner, replace(AGENT, subject="agent-2"))
    first, cursor = await runner.list(AGENT, limit=2)
    second, cursor2 = await runner.list(AGENT, cursor, limit=2)
    third, end = await runner.list(AGENT, cursor2, limit=2)
    whole, none_after = await runner.list(AGENT, limit=5)
    await runner.close()
    assert [t["task_id"] for t in first + second + third] == mine
    assert cursor and cursor2 and end == ""
    assert [t["task_id"] for t in whole] == mine and none_after == ""  # a full last page has no cursor
    assert {t["state"] for t in first + second + third} == {"working"}


async def test_a_listed_working_task_whose_lease_lapsed_is_listed_failed_as_lost() -> None:
    runner, store = await runner_with_a_hanging_tool()
    task_id = (await start(runner))["task_id"]
    store.leases.clear()  # as when its replica died
    [listed], _ = await runner.list(AGENT)
    await runner.close()
    assert (listed["task_id"], listed["state"], listed["lost"]) == (task_id, "failed", True)


async def test_a_caller_without_tools_call_lists_nothing_and_an_admin_only_its_own() -> None:
    runner, _ = await runner_with_a_hanging_tool()
    await start(runner)
    reader = replace(AGENT, scopes=frozenset({"tools:read"}))
    admin = Principal(subject="ops", tenant_id="acme", scopes=frozenset({"tools:call", "tools:admin"}))
    assert await runner.list(reader) == ([], "")
    assert await runner.list(admin) == ([], "")
    assert await runner.list(None) == ([], "")
    await runner.close()


@pytest.mark.parametrize("cursor", ["x", "0" * 13, "0" * 13 + ":" + "0" * 12 + ":" + "g" * 32,
                                    "0" * 13 + ":" + "a" * 32, "0" * 12 + ":" + "0" * 12 + ":" + "a" * 32, "-"])
async def test_a_cursor_the_gateway_did_not_give_is_refused_naming_the_field(cursor: str) -> None:
    runner, _ = await runner_with_a_hanging_tool()
    with pytest.raises(ValidationFailed) as refused:
        await runner.list(AGENT, cursor)
    assert refused.value.field == "cursor" and "cursor" in refused.value.hint


@pytest.mark.parametrize("limit", [0, -1, LIST_PAGE + 1])
async def test_a_page_size_out_of_range_is_refused_naming_the_field(limit: int) -> None:
    runner, _ = await runner_with_a_hanging_tool()
    with pytest.raises(ValidationFailed) as refused:
        await runner.list(AGENT, limit=limit)
    assert refused.value.field == "limit" and str(LIST_PAGE) in refused.value.reason

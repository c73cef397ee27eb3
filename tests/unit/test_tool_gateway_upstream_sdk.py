"""A call through the official SDK client (adapters/upstream_sdk.py), on a real in-process MCP server: the progress its
upstream reported is all forwarded, in order, before the call returns (the SDK runs each progress callback in a task
nobody waits for), a forward that never ends holds the call for a bounded time only, and an `input_required` answer
comes back as such (nobody on this path can be asked)."""

from __future__ import annotations

import asyncio

import mcp_types as types
from mcp import Client
from mcp.server.mcpserver import Context, MCPServer

from services.tool_gateway.adapters import upstream_sdk
from services.tool_gateway.adapters.upstream_sdk import ProgressForwards

server = MCPServer("counter")


@server.tool()
async def count(steps: int, ctx: Context) -> dict[str, int]:
    for step in range(1, steps + 1):
        await ctx.report_progress(step, steps, f"step {step}")
    return {"steps": steps}


@server.tool()
async def ask(ctx: Context) -> dict[str, str]:
    answer = (ctx.input_responses or {}).get("ask")
    if answer is None:
        question = types.ElicitRequestFormParams(message="Who?", requested_schema={"type": "object", "properties": {}})
        return types.InputRequiredResult(  # type: ignore[return-value]
            input_requests={"ask": types.ElicitRequest(params=question)})
    return {"answered": "yes"}


async def test_every_progress_notification_is_forwarded_in_order_before_the_call_returns() -> None:
    forwarded: list[float] = []

    async def slow_report(progress: float, total: float | None, message: str | None) -> None:
        for _ in range(3):  # a caller's stream that takes a moment per message
            await asyncio.sleep(0)
        forwarded.append(progress)

    async with Client(server, mode="legacy") as client:  # framed JSON-RPC: the SDK's dispatcher spawns callbacks
        await client.list_tools()
        result = await upstream_sdk.call_tool(client, "count", {"steps": 20}, 10, slow_report)
        at_return = list(forwarded)
    assert isinstance(result, types.CallToolResult) and result.structured_content == {"steps": 20}
    assert at_return == [float(step) for step in range(1, 21)]


async def test_a_forward_that_never_ends_holds_the_call_for_the_bound_only() -> None:
    never = asyncio.Event()

    async def stuck(progress: float, total: float | None, message: str | None) -> None:
        await never.wait()

    forwards = ProgressForwards(stuck, drain_seconds=0.05)
    running = asyncio.create_task(forwards(1, None, None))
    await asyncio.sleep(0)
    await asyncio.wait_for(forwards.drained(), timeout=5)  # returns after 0.05 s, the forward still going
    assert not running.done()
    running.cancel()


async def test_an_input_required_answer_comes_back_as_such_without_asking_anyone() -> None:
    async with Client(server) as client:  # 2026-07-28, the revision of input_required results
        await client.list_tools()
        result = await upstream_sdk.call_tool(client, "ask", {}, 10, None)
    assert isinstance(result, types.InputRequiredResult) and list(result.input_requests) == ["ask"]

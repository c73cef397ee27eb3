"""A call through the official SDK client (adapters/upstream_sdk.py), on a real in-process MCP server: the progress its
upstream reported is all forwarded, in order, before the call returns (the SDK runs each progress callback in a task
nobody waits for), a forward that never ends holds the call for a bounded time only and never past its deadline, an
`input_required` answer that asks for input comes back as such (nobody on this path can be asked) while one that only
carries its state is asked again with it, and a HEADER_MISMATCH lists the tools again and resends once."""

from __future__ import annotations

import asyncio

import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPError
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


polls: list[str | None] = []


@server.tool()
async def slow_job(ctx: Context) -> dict[str, str]:
    polls.append(ctx.request_state)
    if ctx.request_state != "round 2":  # still working: call again with this state
        state = "round 1" if ctx.request_state is None else "round 2"
        return types.InputRequiredResult(request_state=state)  # type: ignore[return-value]
    return {"job": "done"}


async def test_an_upstream_still_working_is_asked_again_with_its_state_needing_no_caller() -> None:
    polls.clear()
    async with Client(server) as client:
        await client.list_tools()
        result = await upstream_sdk.call_tool(client, "slow_job", {}, 10, None)
    assert isinstance(result, types.CallToolResult) and result.structured_content == {"job": "done"}
    assert polls == [None, "round 1", "round 2"]


async def test_progress_a_caller_never_takes_does_not_cost_the_call_its_answer_within_its_deadline() -> None:
    """The pipeline runs the call under its deadline: waiting for forwards must end before it, answer in hand."""
    never = asyncio.Event()

    async def stuck(progress: float, total: float | None, message: str | None) -> None:
        await never.wait()

    async with Client(server, mode="legacy") as client:
        await client.list_tools()
        async with asyncio.timeout(1.0):  # as the pipeline's deadline; the drain bound (5 s) is longer
            result = await upstream_sdk.call_tool(client, "count", {"steps": 3}, 1.0, stuck)
    assert isinstance(result, types.CallToolResult) and result.structured_content == {"steps": 3}


class _MarksChanged:
    """An SDK client whose upstream now marks an argument its last listing did not: the first call is refused
    HEADER_MISMATCH until the tools are listed again (as a 2026-07-28 upstream answers)."""

    protocol_version = "2026-07-28"

    def __init__(self) -> None:
        self.listed, self.sent = 0, 0
        self.session = self

    async def call_tool(self, tool, arguments, **kwargs) -> types.CallToolResult:
        self.sent += 1
        if not self.listed:
            raise MCPError(types.HEADER_MISMATCH, "Mcp-Param-Region is missing")
        return types.CallToolResult(content=[], structured_content={"ok": True})

    async def list_tools(self, cursor=None, cache_mode=None) -> types.ListToolsResult:
        self.listed += 1
        return types.ListToolsResult(tools=[types.Tool(name="route", input_schema={"type": "object"})])


async def test_a_header_mismatch_lists_the_tools_again_and_resends_once() -> None:
    client = _MarksChanged()
    result = await upstream_sdk.call_tool(client, "route", {"region": "eu"}, 10, None)  # type: ignore[arg-type]
    assert isinstance(result, types.CallToolResult) and (client.listed, client.sent) == (1, 2)

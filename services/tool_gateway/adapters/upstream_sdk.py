"""A tools/call on an upstream through the official SDK client: stdio upstreams, and calls whose caller asked for
progress but cannot be relayed to (upstreams.py sends the others through upstream_http.py).

- progress: the SDK client runs each progress callback in a task of its own that nobody waits for, so the
  call's answer could reach the caller before the progress reported ahead of it. The caller's reporter is
  wrapped (`ProgressForwards`): forwards leave one at a time, in the order the upstream sent them, and the
  call waits for those still going before it answers (at most `DRAIN_SECONDS`: a caller whose stream is stuck
  must not hold the call);
- input: a 2026-07-28 upstream's `input_required` result that asks for input is answered as such, not handed
  to the SDK client's callbacks: no caller on this path can be asked (the manager answers it as the caller's
  doing); one that carries only its `requestState` (the upstream is still working) is called again with it,
  after a short wait, as the SDK client would (at most STATE_ONLY_ROUNDS);
- a 2026-07-28 HEADER_MISMATCH (the upstream's tool marks other arguments now): the tool is listed again and
  the call resent once, as the SDK client would.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from services.tool_gateway.service_layer.call_context import ProgressFn

__all__ = ["DRAIN_SECONDS", "ProgressForwards", "call_tool"]

DRAIN_SECONDS = 5.0
DRAIN_MARGIN_SECONDS = 0.25  # of the call's deadline, left for the answer after the progress before it
STATE_ONLY_ROUNDS = 10
_RELIST_PAGES = 20


class ProgressForwards:
    """The caller's progress reporter as the SDK client's progress callback of one call (see the module)."""

    def __init__(self, report: ProgressFn, drain_seconds: float = DRAIN_SECONDS) -> None:
        self.report, self.drain_seconds = report, drain_seconds
        self._order = asyncio.Lock()  # its waiters are woken first come, first served: the upstream's order
        self._running = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self._running += 1  # before any await: a forward the SDK started is counted at once
        self._idle.clear()
        try:
            async with self._order:
                await self.report(progress, total, message)
        finally:
            self._running -= 1
            if not self._running:
                self._idle.set()

    async def drained(self, deadline: float | None = None) -> None:
        """Once every forward started so far has been sent, or `drain_seconds` passed, or the call's `deadline`
        (loop time) is near: the upstream's answer is never lost to a caller slow to take its progress."""
        # The SDK started the task of a progress notification read before the answer ahead of the task waiting
        # for the answer, so one turn of the loop has it counted.
        await asyncio.sleep(0)
        wait = self.drain_seconds
        if deadline is not None:
            wait = min(wait, deadline - asyncio.get_running_loop().time() - DRAIN_MARGIN_SECONDS)
        if wait <= 0:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await self._idle.wait()


async def call_tool(client: Client, tool: str, arguments: dict[str, Any], timeout: float,
                    report: ProgressFn | None) -> types.CallToolResult | types.InputRequiredResult:
    """The upstream's answer (an `input_required` one only when it asks for input), once the progress it reported
    before it has been forwarded to `report`."""
    deadline = asyncio.get_running_loop().time() + timeout
    forwards = ProgressForwards(report) if report is not None else None
    try:
        result = await _answer(client, tool, arguments, timeout, forwards)
    except Exception:
        if forwards is not None:
            await forwards.drained(deadline)  # a failure is answered too: after the progress before it
        raise
    if forwards is not None:
        await forwards.drained(deadline)
    return result


async def _answer(client: Client, tool: str, arguments: dict[str, Any], timeout: float,
                  forwards: ProgressForwards | None) -> types.CallToolResult | types.InputRequiredResult:
    state, delay = None, 0.05
    for _ in range(STATE_ONLY_ROUNDS):
        result = await _send(client, tool, arguments, timeout, forwards, state)
        if not isinstance(result, types.InputRequiredResult) or result.input_requests:
            return result
        await asyncio.sleep(delay)  # the upstream is still working: asked again with its state
        state, delay = result.request_state, min(delay * 2, 0.25)
    return result


async def _send(client: Client, tool: str, arguments: dict[str, Any], timeout: float,
                forwards: ProgressForwards | None,
                state: str | None) -> types.CallToolResult | types.InputRequiredResult:
    async def send() -> types.CallToolResult | types.InputRequiredResult:
        result = await client.session.call_tool(tool, arguments, read_timeout_seconds=timeout,
                                                 progress_callback=forwards, request_state=state,
                                                 allow_input_required=True)
        assert isinstance(result, types.CallToolResult | types.InputRequiredResult)  # no extension claims results
        return result

    try:
        return await send()
    except MCPError as mismatch:
        if mismatch.error.code != types.HEADER_MISMATCH or client.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            raise
        await _relist(client, tool)  # the tool's schema the client mirrors headers from is stale
        return await send()


async def _relist(client: Client, tool: str) -> None:
    cursor: str | None = None
    for _ in range(_RELIST_PAGES):
        page = await client.list_tools(cursor=cursor, cache_mode="refresh")
        cursor = page.next_cursor
        if cursor is None or any(listed.name == tool for listed in page.tools):
            return

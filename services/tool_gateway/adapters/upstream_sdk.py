"""A tools/call on an upstream through the official SDK client: stdio upstreams, and calls whose caller asked for
progress but cannot be relayed to (upstreams.py sends the others through upstream_http.py).

- progress: the SDK client runs each progress callback in a task of its own that nobody waits for, so the
  call's answer could reach the caller before the progress reported ahead of it. The caller's reporter is
  wrapped (`ProgressForwards`): forwards leave one at a time, in the order the upstream sent them, and the
  call waits for those still going before it answers (at most `DRAIN_SECONDS`: a caller whose stream is stuck
  must not hold the call);
- input: a 2026-07-28 upstream's `input_required` result is answered as such, not handed to the SDK client's
  callbacks: no caller on this path can be asked (the manager answers it as the caller's doing).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import mcp_types as types
from mcp import Client

from services.tool_gateway.service_layer.call_context import ProgressFn

__all__ = ["DRAIN_SECONDS", "ProgressForwards", "call_tool"]

DRAIN_SECONDS = 5.0


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

    async def drained(self) -> None:
        """Once every forward started so far has been sent (or `drain_seconds` passed)."""
        # The SDK started the task of a progress notification read before the answer ahead of the task waiting
        # for the answer, so one turn of the loop has it counted.
        await asyncio.sleep(0)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.drain_seconds):
                await self._idle.wait()


async def call_tool(client: Client, tool: str, arguments: dict[str, Any], timeout: float,
                    report: ProgressFn | None) -> types.CallToolResult | types.InputRequiredResult:
    """The upstream's answer, once the progress it reported before it has been forwarded to `report`."""
    forwards = ProgressForwards(report) if report is not None else None
    try:
        result = await client.session.call_tool(tool, arguments, read_timeout_seconds=timeout,
                                                 progress_callback=forwards, allow_input_required=True)
    except Exception:
        if forwards is not None:
            await forwards.drained()  # a failure is answered too: after the progress before it
        raise
    if forwards is not None:
        await forwards.drained()
    assert isinstance(result, types.CallToolResult | types.InputRequiredResult)  # no extension claims results
    return result

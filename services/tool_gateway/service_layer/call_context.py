"""What travels with one call beside its arguments: where the backend's progress reports go, and the
calling client an upstream's log messages and requests (sampling, elicitation) are relayed to.

A contextvar rather than a parameter of the pipeline: progress is a side channel between the
entry point that has a caller to report to (MCP, when the request carried a progress token) and
the backend that hears progress (a federated MCP upstream). The pipeline between them neither
produces nor reads it, and each call runs in its own task, so the value never leaks across calls.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import Any, Protocol

__all__ = ["CallRelay", "ProgressFn", "RelayRefused", "call_relay", "progress_reporter", "relaying",
           "reporting_progress"]

ProgressFn = Callable[[float, float | None, str | None], Awaitable[None]]
"""`(progress, total, message)`, as MCP progress notifications carry them."""

_reporter: ContextVar[ProgressFn | None] = ContextVar("tool_progress_reporter", default=None)


def progress_reporter() -> ProgressFn | None:
    """Where the current call's progress goes; None when its caller asked for none."""
    return _reporter.get()


@contextlib.contextmanager
def reporting_progress(report: ProgressFn | None) -> Iterator[None]:
    token = _reporter.set(report)
    try:
        yield
    finally:
        _reporter.reset(token)


class RelayRefused(Exception):
    """The calling client cannot answer an upstream's request (no capability, no back-channel, no answer in
    time, or it answered with an error): the upstream is answered this JSON-RPC error instead."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class CallRelay(Protocol):
    """The calling client, as an upstream serving its call sees it (mcp_relay.ClientRelay)."""

    capabilities: dict[str, Any]
    """What the client declared that the gateway can relay (`sampling`, `elicitation`), as MCP spells it."""

    async def log(self, params: dict[str, Any]) -> None:
        """Pass an upstream's `notifications/message` params on (the relay filters by the caller's level)."""
        ...

    async def ask(self, method: str, params: dict[str, Any], *, within: float | None = None) -> dict[str, Any]:
        """Ask the client (`sampling/createMessage`, `elicitation/create`); its result, or RelayRefused.
        `within`: seconds left for the answer in the call's deadline (the relay's own timeout applies too)."""
        ...


_relay: ContextVar[CallRelay | None] = ContextVar("tool_call_relay", default=None)


def call_relay() -> CallRelay | None:
    """The current call's client, when its entry point can relay to it (None: nothing is relayed)."""
    return _relay.get()


@contextlib.contextmanager
def relaying(relay: CallRelay | None) -> Iterator[None]:
    token = _relay.set(relay)
    try:
        yield
    finally:
        _relay.reset(token)

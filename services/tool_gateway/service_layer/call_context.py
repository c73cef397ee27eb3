"""What travels with one call beside its arguments: where the backend's progress reports go.

A contextvar rather than a parameter of the pipeline: progress is a side channel between the
entry point that has a caller to report to (MCP, when the request carried a progress token) and
the backend that hears progress (a federated MCP upstream). The pipeline between them neither
produces nor reads it, and each call runs in its own task, so the value never leaks across calls.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar

__all__ = ["ProgressFn", "progress_reporter", "reporting_progress"]

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

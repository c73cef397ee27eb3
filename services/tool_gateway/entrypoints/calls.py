"""Shared by the entry points: the trace id of the current span, and outcomes as plain dicts."""

from __future__ import annotations

from opentelemetry import trace

__all__ = ["current_trace_id"]


def current_trace_id() -> str:
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else ""

"""The procedural-memory projection (tool experience), fed by tool events."""

from __future__ import annotations

import asyncpg

from libs.events import Envelope

__all__ = ["project_tool_event"]


async def project_tool_event(envelope: Envelope, conn: asyncpg.Connection) -> None:
    message = envelope.message()
    if envelope.event_type == "tool.registered":
        await conn.execute("INSERT INTO tool_experience (name) VALUES ($1) ON CONFLICT DO NOTHING",
                           message.tool.name)
    elif envelope.event_type == "tool.called":
        failed = message.outcome != "ok"
        await conn.execute(
            "INSERT INTO tool_experience AS t (name, calls, failures, total_latency_ms, last_error)"
            " VALUES ($1, 1, $2, $3, $4)"
            " ON CONFLICT (name) DO UPDATE SET calls = t.calls + 1, failures = t.failures + $2,"
            " total_latency_ms = t.total_latency_ms + $3,"
            " last_error = CASE WHEN $4 <> '' THEN $4 ELSE t.last_error END, updated_at = now()",
            message.tool, int(failed), float(message.latency_ms), message.error.reason if failed else "")

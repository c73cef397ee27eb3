"""The procedural-memory projection (tool experience), fed by tool events."""

from __future__ import annotations

from psycopg import AsyncConnection

from libs.events import Envelope

__all__ = ["project_tool_event"]


async def project_tool_event(envelope: Envelope, conn: AsyncConnection) -> None:
    message = envelope.message()
    if envelope.event_type == "tool.registered":
        await conn.execute("INSERT INTO tool_experience (name) VALUES (%s) ON CONFLICT DO NOTHING",
                           [message.tool.name])
    elif envelope.event_type == "tool.called":
        failed = message.outcome != "ok"
        await conn.execute(
            "INSERT INTO tool_experience AS t (name, calls, failures, total_latency_ms, last_error)"
            " VALUES (%(name)s, 1, %(failed)s, %(latency)s, %(error)s)"
            " ON CONFLICT (name) DO UPDATE SET calls = t.calls + 1, failures = t.failures + %(failed)s,"
            " total_latency_ms = t.total_latency_ms + %(latency)s,"
            " last_error = CASE WHEN %(error)s <> '' THEN %(error)s ELSE t.last_error END, updated_at = now()",
            {"name": message.tool, "failed": int(failed), "latency": message.latency_ms,
             "error": message.error.reason if failed else ""})

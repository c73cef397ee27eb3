"""Procedural memory in PostgreSQL (tool_stats, per tenant), and the tool-events projection feeding it."""

from __future__ import annotations

import asyncpg
from google.protobuf import json_format

from libs.db import Database
from libs.events import Envelope, MalformedEvent
from services.tool_gateway.domain.experience import Experience, Observation
from services.tool_gateway.service_layer.experience import record_calls

__all__ = ["PostgresExperience", "PostgresExperienceReader", "project_tool_events"]

_COLUMNS = "name, context, calls, failures, buckets, errors, arguments"


def _experience(row: asyncpg.Record) -> Experience:
    return Experience(tool=row["name"], context=row["context"], calls=row["calls"], failures=row["failures"],
                      buckets=list(row["buckets"]), errors=dict(row["errors"]),
                      arguments=dict(row["arguments"]))


class PostgresExperience:
    """Inside the projection's transaction (the event's tenant): rows are locked while they are updated."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    async def load(self, tenant_id: str, tool: str, context: str) -> Experience | None:
        row = await self.conn.fetchrow(f"SELECT {_COLUMNS} FROM tool_stats WHERE tenant_id = $1 AND name = $2"
                                       " AND context = $3 FOR UPDATE", tenant_id, tool, context)
        return None if row is None else _experience(row)

    async def save(self, tenant_id: str, exp: Experience) -> None:
        await self.conn.execute(
            "INSERT INTO tool_stats (tenant_id, name, context, calls, failures, buckets, errors, arguments)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (tenant_id, name, context) DO UPDATE SET"
            " calls = $4, failures = $5, buckets = $6, errors = $7, arguments = $8, updated_at = now()",
            tenant_id, exp.tool, exp.context, exp.calls, exp.failures, exp.buckets, exp.errors, exp.arguments)

    async def find(self, tenant_id: str, names: list[str], context: str) -> list[Experience]:
        rows = await self.conn.fetch(
            f"SELECT {_COLUMNS} FROM tool_stats WHERE tenant_id = $1 AND context = $2"
            " AND (cardinality($3::text[]) = 0 OR name = ANY($3)) ORDER BY name", tenant_id, context, names)
        return [_experience(row) for row in rows]


class PostgresExperienceReader:
    """Reads for tools/list, ListTools and ToolStats, each in the caller's tenant."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def load(self, tenant_id: str, tool: str, context: str) -> Experience | None:
        raise NotImplementedError("experience is written by the projection only")  # pragma: no cover

    async def save(self, tenant_id: str, exp: Experience) -> None:
        raise NotImplementedError("experience is written by the projection only")  # pragma: no cover

    async def find(self, tenant_id: str, names: list[str], context: str) -> list[Experience]:
        async with self.db.transaction(tenant_id) as conn:
            return await PostgresExperience(conn).find(tenant_id, names, context)


def _observation(envelope: Envelope) -> tuple[str, str, Observation] | None:
    """A tool.called event as (tool, context, observation); None for what teaches nothing."""
    if envelope.event_type != "tool.called":
        return None
    message = envelope.peek()
    if not message.version:
        return None  # an unknown tool name: nothing to learn, and no row for whatever a caller typed
    if message.outcome in ("replayed", "cancelled"):
        return None  # a chain's kept result (no backend called), or a call its caller gave up: not the tool's doing
    error = json_format.MessageToDict(message.error, preserving_proto_field_name=True) \
        if message.HasField("error") else None
    if message.outcome == "fallback":  # the tool failed; a fallback answered in its place
        error = {"error_type": "fallback", "reason": f"failed; {message.served_by} answered instead",
                 "hint": f"{message.served_by} may be the better tool for now"}
    obs = Observation(ok=message.outcome == "ok", latency_ms=message.latency_ms, error=error,
                      arguments=json_format.MessageToDict(message.arguments) if message.HasField("arguments")
                      else {})
    return message.tool, message.context, obs


async def project_tool_events(tenant_id: str, envelopes: list[Envelope],
                              conn: asyncpg.Connection) -> list[BaseException | None]:
    """The projection for a BatchConsumer: one tenant's events in one transaction, each stats row once.

    An event that does not parse is that event's failure (dead-lettered); the others still count.
    """
    calls, outcomes = [], []
    for envelope in envelopes:
        try:
            found = _observation(envelope)
        except MalformedEvent as exc:
            outcomes.append(exc)
            continue
        outcomes.append(None)
        if found is not None:
            calls.append(found)
    await record_calls(tenant_id, calls, PostgresExperience(conn))
    return outcomes

"""The tool registry in PostgreSQL, with its events through the outbox."""

from __future__ import annotations

from dataclasses import asdict

from google.protobuf import struct_pb2

from libs.db import Database, rowcount
from libs.events import Envelope
from libs.outbox import Outbox
from libs.protogen.mnemesh.v1 import common_pb2, events_pb2
from services.tool_gateway.adapters.mapping import spec_to_proto
from services.tool_gateway.domain import CallRecord, ToolSpec

__all__ = ["PostgresCallLog", "PostgresRegistry"]

# Tools are shared by every tenant of a deployment (the registry has no row-level security);
# their events carry this tenant id.
SYSTEM_TENANT = "_system"


class PostgresRegistry:
    def __init__(self, db: Database, outbox: Outbox) -> None:
        self.db, self.outbox = db, outbox

    async def register(self, spec: ToolSpec) -> bool:
        async with self.db.transaction(SYSTEM_TENANT) as conn:
            status = await conn.execute(
                "INSERT INTO tools (name, version, spec) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                spec.name, spec.version, asdict(spec))
            if rowcount(status) == 0:
                return False
            event = events_pb2.ToolRegistered(tool=spec_to_proto(spec))
            await self.outbox.add(conn, Envelope.wrap(event, event_type="tool.registered", tenant_id=SYSTEM_TENANT))
            return True

    async def list(self) -> list[ToolSpec]:
        async with self.db.connection() as conn:
            rows = await conn.fetch("SELECT spec FROM tools ORDER BY name, registered_at DESC")
        return [_spec(row[0]) for row in rows]

    async def versions(self, name: str) -> list[ToolSpec]:
        async with self.db.connection() as conn:
            rows = await conn.fetch("SELECT spec FROM tools WHERE name = $1", name)  # the primary key's prefix
        return [_spec(row[0]) for row in rows]


def _spec(stored: dict) -> ToolSpec:
    return ToolSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in stored.items()})


class PostgresCallLog:
    """The audit row and its tool.called event commit together, in the caller's tenant."""

    def __init__(self, db: Database, outbox: Outbox) -> None:
        self.db, self.outbox = db, outbox

    async def record(self, record: CallRecord) -> None:
        error = record.error or {}
        event = events_pb2.ToolCalled(
            tenant=common_pb2.TenantContext(tenant_id=record.tenant_id), call_id=record.call_id, tool=record.tool,
            version=record.version, caller=record.caller, args_sha256=record.args_sha256, outcome=record.outcome,
            latency_ms=record.latency_ms, context=record.context, served_by=record.served_by,
            attempts=record.attempts, error=common_pb2.ErrorDetail(**error) if error else None)
        if record.arguments:
            event.arguments.CopyFrom(_struct(record.arguments))
        async with self.db.transaction(record.tenant_id) as conn:
            await conn.execute(
                "INSERT INTO tool_calls (call_id, tenant_id, caller, tool, version, args_sha256, outcome, error_type,"
                " error, latency_ms, trace_id, context) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
                record.call_id, record.tenant_id, record.caller, record.tool, record.version, record.args_sha256,
                record.outcome, str(error.get("error_type", "")), record.error, record.latency_ms, record.trace_id,
                record.context)
            await self.outbox.add(conn, Envelope.wrap(event, event_type="tool.called", tenant_id=record.tenant_id))


def _struct(value: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(value)
    return s

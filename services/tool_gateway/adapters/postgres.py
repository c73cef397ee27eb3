"""The tool registry in PostgreSQL, with its events through the outbox."""

from __future__ import annotations

from dataclasses import asdict

from libs.db import Database, rowcount
from libs.events import Envelope
from libs.outbox import Outbox
from libs.protogen.mnemesh.v1 import events_pb2
from services.tool_gateway.adapters.mapping import spec_to_proto
from services.tool_gateway.domain import ToolSpec

__all__ = ["PostgresRegistry"]

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
        return [ToolSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in row[0].items()}) for row in rows]

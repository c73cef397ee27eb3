"""Wire the tool-gateway."""

from __future__ import annotations

from libs.events.schema import TOOL_EVENTS
from libs.runtime import ServiceContext
from services.tool_gateway.adapters.postgres import PostgresRegistry
from services.tool_gateway.adapters.experience import project_tool_event
from services.tool_gateway.entrypoints import grpc_api

NAME = "tool-gateway"
MIGRATIONS = "services.tool_gateway"


async def bootstrap(ctx: ServiceContext) -> None:
    ctx.add_grpc(grpc_api.registration(PostgresRegistry(ctx.db, ctx.outbox)))
    ctx.subscribe(TOOL_EVENTS, project_tool_event)

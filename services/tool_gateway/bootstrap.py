"""Wire the tool-gateway."""

from __future__ import annotations

from libs.events.schema import TOOL_EVENTS
from libs.http import serve_asgi
from libs.runtime import ServiceContext
from services.tool_gateway.adapters.experience import project_tool_event
from services.tool_gateway.adapters.postgres import PostgresRegistry
from services.tool_gateway.entrypoints import grpc_api, mcp_server

NAME = "tool-gateway"
MIGRATIONS = "services.tool_gateway"


async def bootstrap(ctx: ServiceContext) -> None:
    registry = PostgresRegistry(ctx.db, ctx.outbox)
    ctx.add_grpc(grpc_api.registration(registry))
    ctx.subscribe(TOOL_EVENTS, project_tool_event)
    settings = ctx.settings
    mcp_app = mcp_server.http_app(registry, ctx.verifier, allowed_hosts=settings.mcp_allowed_hosts,
                                  allowed_origins=settings.mcp_allowed_origins)

    async def serve_mcp() -> None:
        await serve_asgi(mcp_app, host=settings.host, port=settings.mcp_http_port,
                         port_setting="MNEMESH_MCP_HTTP_PORT")

    ctx.tasks.append(serve_mcp)

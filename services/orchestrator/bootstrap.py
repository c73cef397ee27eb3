"""Wire the orchestrator."""

from __future__ import annotations

from libs.runtime import ServiceContext
from services.orchestrator.adapters.repository import EventSourcedSessions
from services.orchestrator.entrypoints import grpc_api

NAME = "orchestrator"
MIGRATIONS = None


async def bootstrap(ctx: ServiceContext) -> None:
    ctx.add_grpc(grpc_api.registration(EventSourcedSessions(ctx.db, ctx.event_store, ctx.outbox)))

"""Wire the tool-gateway."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from libs.auth import service_token
from libs.config import ConfigError
from libs.events.schema import TOOL_EVENTS
from libs.http import serve_asgi
from libs.logs import get_logger
from libs.runtime import ServiceContext
from libs.transient import TRANSIENT_ERRORS
from services.tool_gateway.adapters.backends import BackendRouter
from services.tool_gateway.adapters.backends.adapter import AdapterBackend, GrpcAdapterClient
from services.tool_gateway.adapters.backends.http import HttpBackend
from services.tool_gateway.adapters.backends.memory import MEMORY_TOOLS, memory_backend
from services.tool_gateway.adapters.experience import PostgresExperienceReader, project_tool_event
from services.tool_gateway.adapters.federated import FederatedRegistry
from services.tool_gateway.adapters.postgres import PostgresCallLog, PostgresRegistry
from services.tool_gateway.adapters.redis_state import (
    BreakerSettings,
    RedisBreakers,
    RedisCanaryCounters,
    RedisRateLimiter,
    RedisResultStore,
)
from services.tool_gateway.adapters.upstream_store import PostgresUpstreams
from services.tool_gateway.adapters.upstreams import UpstreamManager, load_upstreams
from services.tool_gateway.entrypoints import grpc_api, mcp_server
from services.tool_gateway.service_layer.pipeline import CallPolicy, CallPorts
from services.tool_gateway.service_layer.upstreams import reconcile

log = get_logger(__name__)
NAME = "tool-gateway"
MIGRATIONS = "services.tool_gateway"


async def bootstrap(ctx: ServiceContext) -> None:
    settings = ctx.settings
    namespace = settings.namespace
    http = httpx.AsyncClient(follow_redirects=False, limits=httpx.Limits(max_connections=200))
    ctx.closers.append(http.aclose)
    upstreams = UpstreamManager()
    ctx.closers.append(upstreams.close)  # stops every upstream process
    if settings.tool_upstreams_file:
        for config in load_upstreams(Path(settings.tool_upstreams_file).read_text()):
            upstreams.add(config)
    from_file = frozenset(upstreams.connections)
    upstream_store = PostgresUpstreams(ctx.db)
    try:
        adapter_token = service_token(settings, settings.tool_adapter_token.get_secret_value(),
                                      subject="service:tool-gateway", scopes=["adapter:invoke"],
                                      setting="MNEMESH_TOOL_ADAPTER_TOKEN")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    adapter = GrpcAdapterClient(f"{settings.host}:{settings.adapter_grpc_port}", adapter_token)
    ctx.closers.append(adapter.aclose)
    ports = CallPorts(
        registry=FederatedRegistry(PostgresRegistry(ctx.db, ctx.outbox), upstreams),
        limiter=RedisRateLimiter(ctx.bus.redis, namespace),
        breakers=RedisBreakers(ctx.bus.redis, namespace, BreakerSettings(
            failures=settings.tool_breaker_failures, error_rate=settings.tool_breaker_error_rate,
            min_calls=settings.tool_breaker_min_calls, window_seconds=settings.tool_breaker_window_seconds,
            open_seconds=settings.tool_breaker_open_seconds)),
        backends=BackendRouter({"http": HttpBackend(http), "mcp": upstreams, "adapter": AdapterBackend(adapter),
                                "memory": memory_backend(settings, ctx.closers)}),
        call_log=PostgresCallLog(ctx.db, ctx.outbox),
        results=RedisResultStore(ctx.bus.redis, namespace, settings.tool_result_ttl_hours * 3600),
        canaries=RedisCanaryCounters(ctx.bus.redis, namespace),
        policy=CallPolicy(rate_per_caller=settings.tool_rate_per_caller, rate_per_tool=settings.tool_rate_per_tool,
                          result_max_bytes=settings.tool_result_max_bytes),
    )
    for spec in MEMORY_TOOLS:  # memory.remember, .recall, .forget, .confirm (a version already there stays)
        await ports.registry.register(spec)
    experience = PostgresExperienceReader(ctx.db)
    allowed = frozenset(c.strip() for c in settings.tool_upstream_commands.split(",") if c.strip())
    ctx.add_grpc(grpc_api.registration(ports, grpc_api.Admin(experience, upstream_store, upstreams, allowed)))
    ctx.subscribe(TOOL_EVENTS, project_tool_event)
    mcp_app = mcp_server.http_app(ports, ctx.verifier, allowed_hosts=settings.mcp_allowed_hosts,
                                  allowed_origins=settings.mcp_allowed_origins,
                                  experience=experience if settings.tool_list_experience else None)

    async def follow_upstreams() -> None:
        """Upstreams added or removed through any replica reach this one within a poll."""
        while True:
            try:
                await reconcile(upstream_store, upstreams, from_file)
            except TRANSIENT_ERRORS as exc:  # PostgreSQL away for a moment: the next poll catches up
                log.warning("upstreams not reconciled", error=type(exc).__name__)
            await asyncio.sleep(settings.tool_upstream_poll_seconds)

    ctx.tasks.append(follow_upstreams)

    async def serve_mcp() -> None:
        await serve_asgi(mcp_app, host=settings.host, port=settings.mcp_http_port,
                         port_setting="MNEMESH_MCP_HTTP_PORT")

    ctx.tasks.append(serve_mcp)

"""Wire the tool-gateway."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import httpx
from mcp.shared.subscriptions import ResourceUpdated
from redis.exceptions import RedisError

from libs.auth import Principal, service_token
from libs.config import ConfigError
from libs.db.notify import Notifier
from libs.events.batches import BatchConsumer
from libs.events.schema import TOOL_EVENTS
from libs.http import serve_asgi
from libs.logs import get_logger
from libs.runtime import ServiceContext
from libs.transient import TRANSIENT_ERRORS
from services.tool_gateway.adapters.backends import BackendRouter
from services.tool_gateway.adapters.backends.adapter import AdapterBackend, GrpcAdapterClient
from services.tool_gateway.adapters.backends.http import HttpBackend
from services.tool_gateway.adapters.audit_buffer import BufferedCallLog
from services.tool_gateway.adapters.local_gate import LocalGate
from services.tool_gateway.adapters.backends.memory import MEMORY_TOOLS, memory_backend
from services.tool_gateway.adapters.broadcast import TOOLS_CHANGED, ChangeBus, RedisBroadcast
from services.tool_gateway.adapters.experience import PostgresExperienceReader, project_tool_events
from services.tool_gateway.adapters.federated import FederatedRegistry
from services.tool_gateway.adapters.postgres import PostgresCallLog, PostgresRegistry, registry_channel
from services.tool_gateway.adapters.registry_cache import CachedRegistry
from services.tool_gateway.adapters.redis_chains import RedisChainStore, RedisTaskStore
from services.tool_gateway.adapters.redis_state import (
    BreakerSettings,
    RedisBreakers,
    RedisCanaryCounters,
    RedisRateLimiter,
    RedisResultStore,
)
from services.tool_gateway.adapters.upstream_store import PostgresUpstreams
from services.tool_gateway.adapters.relay_state import RedisLogLevels, RedisSubscribed
from services.tool_gateway.adapters.upstreams import UpstreamManager, load_upstreams
from services.tool_gateway.entrypoints import grpc_api, mcp_server, mcp_stdio
from services.tool_gateway.entrypoints.mcp_relay import RelayAnswers
from services.tool_gateway.entrypoints.mcp_sessions import InFlightCalls
from services.tool_gateway.service_layer.pipeline import CallPolicy, CallPorts
from services.tool_gateway.service_layer.tasks import TaskRunner
from services.tool_gateway.service_layer.upstreams import reconcile

log = get_logger(__name__)
NAME = "tool-gateway"
MIGRATIONS = "services.tool_gateway"
STDIO_START_SECONDS = 10.0  # at most this long `serve-stdio` waits for its upstreams before it answers


async def upstreams_settled(upstreams: UpstreamManager, reconciled: asyncio.Event, within: float) -> None:
    """Once the stored upstreams were added (`reconciled`) and every upstream connected or failed its first
    attempt, or `within` seconds passed; those still connecting then are logged."""
    loop = asyncio.get_running_loop()
    until = loop.time() + within
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(within):
            await reconciled.wait()
    pending = await upstreams.settled(max(0.0, until - loop.time()))
    if pending:
        log.warning("serving before these upstreams connected; they connect in the background", upstreams=pending,
                    waited_seconds=within)


async def bootstrap(ctx: ServiceContext, *, stdio_principal: Principal | None = None) -> None:
    """Wire the gateway; with `stdio_principal`, its MCP server answers on stdin/stdout for that one caller
    (`mnemesh tools serve-stdio`) instead of on HTTP, and the process stops when stdin closes."""
    settings = ctx.settings
    namespace = settings.namespace
    http = httpx.AsyncClient(follow_redirects=False, limits=httpx.Limits(max_connections=200))
    ctx.closers.append(http.aclose)
    # What tools/list shows changed: every replica's MCP clients hear of it (mcp_sessions, subscriptions/listen).
    channel = f"{namespace}.tool-gateway." if namespace else "tool-gateway."
    changes = ChangeBus(RedisBroadcast(ctx.bus.redis, f"{channel}changes"))
    cancels = RedisBroadcast(ctx.bus.redis, f"{channel}cancels")
    in_flight = InFlightCalls()
    cancels.subscribe(lambda message: in_flight.cancel(str(message.get("key", ""))))
    # Clients' answers to relayed sampling and elicitation requests, to whichever replica waits for them.
    relay_channel = RedisBroadcast(ctx.bus.redis, f"{channel}relay")
    relay_answers = RelayAnswers(relay_channel)
    relay_channel.subscribe(relay_answers.deliver)
    ctx.tasks.extend([changes.broadcast.run, cancels.run, relay_channel.run])
    seen_upstream_tools: list[object] = [None]

    def upstream_tools_changed() -> None:
        """Each replica keeps its own upstream connections, so each announces their changes to its own clients."""
        now = (sorted((s.name, s.description, repr(s.input_schema)) for s in upstreams.specs()),
               [(name, catalog) for name, catalog, _ in upstreams.catalogs()])
        if now != seen_upstream_tools[0]:
            seen_upstream_tools[0] = now
            for event in TOOLS_CHANGED:
                changes.publish_local(event)

    async def registry_changed() -> None:
        try:
            for event in TOOLS_CHANGED:
                await changes.publish(event)
        except (*TRANSIENT_ERRORS, RedisError) as exc:  # clients miss one notice; they still list afresh
            log.warning("tool-list change not announced", error=type(exc).__name__)

    async def upstream_resource_updated(uri: str) -> None:
        """An upstream's `notifications/resources/updated`: to the subscribed sessions of every replica."""
        try:
            await changes.publish(ResourceUpdated(uri=uri))
        except (*TRANSIENT_ERRORS, RedisError) as exc:
            log.warning("resource update not broadcast", error=type(exc).__name__)

    upstreams = UpstreamManager(on_change=upstream_tools_changed, on_resource_updated=upstream_resource_updated)
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
    # Audit rows and tool events leave the call's path: written in batches, the rest at shutdown
    # (closers run after the entry points have drained). Every batch costs a transaction, an outbox
    # publish and a projection round whatever its size, so a batch gathers (MNEMESH_TOOL_AUDIT_FLUSH_MS, 50).
    call_log = BufferedCallLog(PostgresCallLog(ctx.db, ctx.outbox), flush_seconds=settings.tool_audit_flush_ms / 1000,
                               batch=500)
    ctx.closers.append(call_log.close)
    # Calls read the registry from memory; NOTIFY of every change (any replica's) keeps it right.
    registered = CachedRegistry(PostgresRegistry(ctx.db, ctx.outbox), Notifier(ctx.db.connect, registry_channel(ctx.db)))
    ctx.closers.append(registered.close)
    limiter = RedisRateLimiter(ctx.bus.redis, namespace)
    breakers = RedisBreakers(ctx.bus.redis, namespace, BreakerSettings(
        failures=settings.tool_breaker_failures, error_rate=settings.tool_breaker_error_rate,
        min_calls=settings.tool_breaker_min_calls, window_seconds=settings.tool_breaker_window_seconds,
        open_seconds=settings.tool_breaker_open_seconds), cache_seconds=settings.tool_breaker_cache_ms / 1000)
    ctx.closers.append(breakers.close)  # stops the batch of successes waiting to be counted
    # Rate limit and breaker from a local allowance refilled from Redis in batches (bounds: local_gate.py).
    gate = LocalGate(limiter, breakers, batch_seconds=settings.tool_rate_batch_ms / 1000)
    ctx.closers.append(gate.close)
    ports = CallPorts(
        registry=FederatedRegistry(registered, upstreams, on_change=registry_changed),
        limiter=limiter,
        breakers=breakers,
        gate=gate,
        backends=BackendRouter({"http": HttpBackend(http), "mcp": upstreams, "adapter": AdapterBackend(adapter),
                                "memory": memory_backend(settings, ctx.closers)}),
        call_log=call_log,
        results=RedisResultStore(ctx.bus.redis, namespace, settings.tool_result_ttl_hours * 3600),
        canaries=RedisCanaryCounters(ctx.bus.redis, namespace),
        chains=RedisChainStore(ctx.bus.redis, namespace, settings.tool_chain_ttl_seconds,
                               settings.tool_chain_max_steps),
        policy=CallPolicy(rate_per_caller=settings.tool_rate_per_caller, rate_per_tool=settings.tool_rate_per_tool,
                          result_max_bytes=settings.tool_result_max_bytes),
    )
    # Calls run as tasks: their state shared in Redis; stopping cancels those still running (each audited
    # "cancelled") before the audit log's last flush (closers run in reverse).
    tasks = TaskRunner(ports, RedisTaskStore(ctx.bus.redis, namespace, settings.tool_task_ttl_seconds),
                       ttl_seconds=settings.tool_task_ttl_seconds, lease_seconds=settings.tool_task_lease_seconds,
                       announce_cancel=lambda task_id: cancels.publish({"task": task_id}),
                       max_working_per_caller=settings.tool_tasks_per_caller)
    cancels.subscribe(lambda message: tasks.cancel(str(message["task"])) if "task" in message else None)
    ctx.closers.append(tasks.close)
    for spec in MEMORY_TOOLS:  # memory.remember, .recall, .forget, .confirm (a version already there stays)
        await ports.registry.register(spec)
    experience = PostgresExperienceReader(ctx.db)
    allowed = frozenset(c.strip() for c in settings.tool_upstream_commands.split(",") if c.strip())
    ctx.add_grpc(grpc_api.registration(ports, grpc_api.Admin(experience, upstream_store, upstreams, allowed, tasks)))

    reconciled = asyncio.Event()  # the stored upstreams were added once (or could not be read)

    async def follow_upstreams() -> None:
        """Upstreams added or removed through any replica reach this one within a poll."""
        while True:
            try:
                await reconcile(upstream_store, upstreams, from_file)
            except TRANSIENT_ERRORS as exc:  # PostgreSQL away for a moment: the next poll catches up
                log.warning("upstreams not reconciled", error=type(exc).__name__)
            reconciled.set()
            await asyncio.sleep(settings.tool_upstream_poll_seconds)

    ctx.tasks.append(follow_upstreams)
    if stdio_principal is not None:
        stdio = mcp_server.build_server(ports, stdio_principal, experience if settings.tool_list_experience else None,
                                        changes=changes, upstreams=upstreams, tasks=tasks)

        async def serve_stdio() -> None:
            # A local client lists the tools right after initialize, and has no reason to list them again: answer
            # it once the upstreams are up or failed their first attempt (a dead one delays it STDIO_START_SECONDS
            # at most; it is reported, and retried as always).
            await upstreams_settled(upstreams, reconciled, STDIO_START_SECONDS)
            await mcp_stdio.serve(stdio, changes)

        ctx.tasks.append(serve_stdio)
        return  # the HTTP replicas project the tool events
    # The experience projection reads tool events in batches: one transaction per batch and tenant, each
    # stats row read and written once per batch, instead of a transaction per call.
    projection = BatchConsumer(ctx.bus, ctx.db, TOOL_EVENTS, ctx.group, project_tool_events, ctx.verifier)
    ctx.tasks.append(projection.run)
    mcp_app = mcp_server.http_app(ports, ctx.verifier, allowed_hosts=settings.mcp_allowed_hosts,
                                  allowed_origins=settings.mcp_allowed_origins,
                                  experience=experience if settings.tool_list_experience else None,
                                  changes=changes, cancels=cancels, in_flight=in_flight, upstreams=upstreams,
                                  tasks=tasks, answers=relay_answers,
                                  levels=RedisLogLevels(ctx.bus.redis, namespace),
                                  subscribed=RedisSubscribed(ctx.bus.redis, namespace),
                                  relay_timeout=settings.tool_relay_timeout_seconds,
                                  resource_url=settings.mcp_resource_url,
                                  authorization_servers=tuple(a.strip() for a in
                                                              settings.mcp_authorization_servers.split(",")
                                                              if a.strip()))

    async def serve_mcp() -> None:
        await serve_asgi(mcp_app, host=settings.host, port=settings.mcp_http_port,
                         port_setting="MNEMESH_MCP_HTTP_PORT")

    ctx.tasks.append(serve_mcp)

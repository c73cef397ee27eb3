"""The life of one service process: wire, start, serve, stop gracefully.

A service's bootstrap receives a ServiceContext with the shared ports already
connected (database pinned to its schema, event bus, outbox, event store) and
adds its gRPC servicers, stream handlers and background tasks. ``run_service``
does the rest: migrations, start order, signals, and the reverse stop order.
"""

from __future__ import annotations

import asyncio
import functools
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta

import asyncpg
import redis.asyncio
import redis.exceptions

from libs.auth import TokenVerifier
from libs.config import ConfigError, Settings, redacted
from libs.db import Database, RoleError, apply_migrations, load_migrations
from libs.events.bus import EventBus, stable_consumer_name
from libs.events.producers import admitted
from libs.eventloop import note_event_loop
from libs.eventstore import EventStore
from libs.housekeeping import housekeeping
from libs.idempotency import TransactionalHandler, idempotent
from libs.logs import configure_logging, get_logger
from libs.outbox import Outbox, OutboxRelay
from libs.readiness import dependency_probes, watch_dependencies
from libs.rpc import GrpcServer, Registration
from libs.telemetry import setup_telemetry

__all__ = ["InfrastructureError", "ServiceContext", "check_infrastructure", "run_service"]

log = get_logger(__name__)


class InfrastructureError(Exception):
    """Redis, PostgreSQL or Qdrant is missing or unreachable; the message says what to set."""


@dataclass
class ServiceContext:
    name: str
    settings: Settings
    db: Database
    bus: EventBus
    outbox: Outbox
    event_store: EventStore
    # Verifies bearer tokens for entry points other than gRPC (e.g. HTTP); None when auth is disabled.
    verifier: TokenVerifier | None = None
    registrations: list[Registration] = field(default_factory=list)
    tasks: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    @property
    def group(self) -> str:
        return self.name

    def add_grpc(self, registration: Registration) -> None:
        self.registrations.append(registration)

    def subscribe(self, stream: str, handler: TransactionalHandler) -> None:
        """Consume `stream` in this service's group; `handler` runs once per event id, in a transaction,
        for entries that pass admission (event type of this stream; producer credential on external streams)."""
        handle = idempotent(self.db, self.group, handler)
        self.bus.subscribe(stream, self.group, admitted(stream, handle, self.verifier))


_STEP_SECONDS = 5.0


async def _bounded(step: Awaitable[None], what: str) -> None:
    try:
        await asyncio.wait_for(step, _STEP_SECONDS)
    except TimeoutError:
        log.warning("shutdown step did not finish in time; going on", step=what, timeout_s=_STEP_SECONDS)


async def check_infrastructure(settings: Settings) -> None:
    """Fail fast, naming what is missing and how to provide it."""
    if not settings.redis_url:
        raise InfrastructureError("REDIS_URL is not set: point it at Redis (e.g. redis://127.0.0.1:6379/0), "
                                  "or start the whole mesh with `mnemesh run`, which starts an embedded one")
    if not settings.database_url:
        raise InfrastructureError("DATABASE_URL is not set: point it at PostgreSQL (e.g. "
                                  "postgresql://postgres@127.0.0.1:5432/mnemesh), or use `mnemesh run`")
    client = redis.asyncio.from_url(settings.redis_url)
    try:
        await client.ping()
    except (redis.exceptions.RedisError, OSError) as exc:
        raise InfrastructureError(f"cannot reach Redis at {redacted(settings.redis_url)}: {exc}; "
                                  "start it or fix REDIS_URL") \
            from None
    finally:
        await client.aclose()
    try:
        conn = await asyncpg.connect(settings.database_url, timeout=5)
        await conn.close()
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise InfrastructureError(f"cannot reach PostgreSQL at {redacted(settings.database_url)}: {str(exc).strip()}; "
                                  "start it or fix DATABASE_URL") from None


async def run_service(
    name: str,
    settings: Settings,
    bootstrap: Callable[[ServiceContext], Awaitable[None]],
    *,
    migrations_package: str | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run service `name` until SIGTERM/SIGINT (or until `stop` is set)."""
    configure_logging(name, settings.log_level)
    note_event_loop(settings.event_loop)
    setup_telemetry(name, otlp_endpoint=settings.otlp_endpoint, host=settings.host,
                    instance=stable_consumer_name(name, settings.replica or None),
                    metrics_port=settings.metrics_port(name) if settings.metrics_enabled else 0)
    await check_infrastructure(settings)
    schema = "_".join(filter(None, [settings.namespace, name])).replace("-", "_")
    migrations = load_migrations(*([migrations_package] if migrations_package else []))
    await apply_migrations(settings.database_url, schema, migrations, app_role=settings.database_app_role)
    try:
        verifier = TokenVerifier(settings) if settings.auth_enabled else None
    except ValueError as exc:
        raise ConfigError(str(exc)) from None

    db = Database(settings.database_url, schema, role=settings.database_app_role,
                  app_url=settings.database_app_url)
    try:
        await db.open()
    except RoleError as exc:
        raise ConfigError(str(exc)) from None
    bus = EventBus(settings.redis_url, consumer_name=stable_consumer_name(name, settings.replica or None),
                   max_deliveries=settings.stream_max_deliveries, min_idle_ms=settings.stream_min_idle_ms,
                   maxlen=settings.stream_maxlen, retention_ms=int(settings.stream_retention_hours * 3_600_000),
                   namespace=settings.namespace)
    outbox = Outbox(db)
    ctx = ServiceContext(name, settings, db, bus, outbox, EventStore(db), verifier)
    ctx.closers.append(ctx.event_store.close)
    await bootstrap(ctx)
    relay = OutboxRelay(outbox, bus, poll_seconds=settings.outbox_poll_seconds)
    ctx.tasks.append(relay.run)
    ctx.tasks.append(functools.partial(
        housekeeping, bus, relay, db, every_seconds=settings.housekeeping_seconds,
        processed_retention=timedelta(days=settings.processed_retention_days)))

    server = GrpcServer(settings.host, settings.grpc_port(name), ctx.registrations, verifier)
    ctx.tasks.append(functools.partial(watch_dependencies, server, dependency_probes(settings)))
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks: list[asyncio.Task] = []
    waiter = asyncio.create_task(stop.wait())
    try:
        await bus.start()
        tasks = [asyncio.create_task(task(), name=f"{name}:{getattr(task, '__qualname__', 'task')}")
                 for task in ctx.tasks]
        await server.start()
        log.info("service started", grpc=server.address)
        done, _ = await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not waiter and task.exception():
                raise task.exception()  # a background task died: stop, and let the supervisor restart us
        log.info("service stopping")
    finally:
        # Calls drain first (health says NOT_SERVING), then background work stops, then consumers
        # finish their in-flight events, then connections close.
        await server.stop(settings.shutdown_grace_seconds)
        for task in [waiter, *tasks]:
            task.cancel()
        # Every step is bounded: a task or client that does not let go must not hang the shutdown.
        stopped, stuck = await asyncio.wait([waiter, *tasks], timeout=_STEP_SECONDS)
        for task in stopped:  # retrieved, so that none is reported as never retrieved
            if not task.cancelled():
                task.exception()
        if stuck:
            log.warning("background tasks did not stop in time", tasks=sorted(t.get_name() for t in stuck))
        await _bounded(bus.stop(), "the event bus")
        for close in reversed(ctx.closers):
            await _bounded(close(), getattr(close, "__qualname__", "a closer"))
        await db.close(timeout=_STEP_SECONDS)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        log.info("service stopped")

"""`mnemesh bench NAME`: the benchmarks of the foundation; services add theirs to BENCHMARKS.

- eventstore: EventStore.append (expected-version check, NOTIFY) vs a plain INSERT of the same row.
- bus: EventBus.publish (envelope, span, XADD with trim) vs a raw XADD of the same fields.
- adapter: SOAP calls through the adapter's gRPC Invoke vs zeep directly (services/adapter/bench.py).
- search: the retriever (services/retriever/bench.py): embedder vs indexing pipeline, engine vs Search,
  read-after-write visibility; its final JSON line carries a `summary`.
- write: memories/s through the commands stream and gRPC WriteBatch of the running mesh vs plain
  batched inserts of the same rows (services/memory_writer/bench.py; --n, --batch).
- tools: one upstream MCP tool directly with the SDK vs through the tool-gateway (MCP and gRPC)
  (services/tool_gateway/bench.py); its final JSON line carries a `summary`.
- sessions: the orchestrator (services/orchestrator/bench.py): convergence lag of 5 device replicas under
  200 events/s, and the deterministic planner's turn latency; its final JSON line carries a `summary`.
"""

from __future__ import annotations

import inspect
import json
import sys
import uuid
from collections.abc import Awaitable, Callable

import asyncpg

from libs.bench import Case, report, run_case
from libs.config import Settings
from libs.db import APP_ROLE, Database, apply_migrations, load_migrations
from libs.events import Envelope
from libs.events.bus import EventBus
from libs.eventstore import EventStore
from libs.logs import configure_logging
from libs.protogen.mnemesh.v1 import events_pb2
from services.adapter.bench import bench_adapter

__all__ = ["BENCHMARKS", "run_benchmark"]


def _envelope(i: int) -> Envelope:
    message = events_pb2.SessionMessageAppended(device_id="bench", role="user", text=f"message {i} 你好")
    return Envelope.wrap(message, event_type="session.message_appended", tenant_id="bench")


async def bench_eventstore(settings: Settings, repetitions: int, warmup: int) -> list[dict]:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    await apply_migrations(settings.database_url, schema, load_migrations())
    owner = await asyncpg.connect(settings.database_url)
    try:  # the baseline: the same columns, no version check, no notify, no row-level security
        await owner.execute(f'CREATE TABLE "{schema}".plain_events (LIKE "{schema}".events INCLUDING DEFAULTS'
                            f' INCLUDING IDENTITY); GRANT INSERT ON "{schema}".plain_events TO {APP_ROLE}')
    finally:
        await owner.close()
    db = Database(settings.database_url, schema, max_size=2)
    await db.open()
    store = EventStore(db)
    try:

        async def candidate(i: int) -> None:
            async with db.transaction("bench") as conn:
                await store.append(conn, f"s-{i % 50}", -1, [_envelope(i)])

        async def baseline(i: int) -> None:
            e = _envelope(i)
            async with db.transaction("bench") as conn:
                await conn.execute(
                    "INSERT INTO plain_events (stream_id, version, event_id, event_type, schema_version, tenant_id,"
                    " payload, occurred_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                    f"s-{i % 50}", i, e.event_id, e.event_type, 1, e.tenant_id, e.payload, e.occurred_at)

        async def candidate_expected(i: int) -> None:
            async with db.transaction("bench") as conn:
                await store.append(conn, f"new-{i}", 0, [_envelope(i)])  # a device's write: exact version

        return [
            await run_case(Case("append, any version", candidate, baseline,
                                "EventStore.append(ANY_VERSION) vs plain INSERT, one transaction each"),
                           repetitions=repetitions, warmup=warmup),
            await run_case(Case("append, expected version", candidate_expected, baseline,
                                "EventStore.append(expected=0) vs plain INSERT, one transaction each"),
                           repetitions=repetitions, warmup=warmup),
        ]
    finally:
        await db.close()
        conn = await asyncpg.connect(settings.database_url)
        try:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        finally:
            await conn.close()


async def bench_bus(settings: Settings, repetitions: int, warmup: int) -> list[dict]:
    bus = EventBus(settings.redis_url, consumer_name="bench", maxlen=settings.stream_maxlen)
    stream = f"bench.{uuid.uuid4().hex[:8]}"
    redis = await bus.redis()
    try:
        async def candidate(i: int) -> None:
            await bus.publish(_envelope(i), stream=stream)

        async def baseline(i: int) -> None:
            await redis.xadd(stream + ".raw", _envelope(i).to_fields())

        return [await run_case(Case("publish 1 event", candidate, baseline, "EventBus.publish vs raw XADD"),
                               repetitions=repetitions, warmup=warmup)]
    finally:
        await redis.delete(stream, stream + ".raw")
        await bus.stop()


async def bench_tools(settings: Settings, repetitions: int, warmup: int) -> dict:
    from services.tool_gateway.bench import bench_tools as run

    return await run(settings, repetitions, warmup)


async def bench_search(settings: Settings, repetitions: int, warmup: int, memories: str = "10000,100000") -> dict:
    from services.retriever.bench import bench_search as run

    return await run(settings, repetitions, warmup, memories=memories)  # not --seconds (the sessions bench's)


async def bench_sessions(settings: Settings, repetitions: int, warmup: int, seconds: float = 30.0) -> dict:
    from services.orchestrator.bench import bench_sessions as run

    return await run(settings, repetitions, warmup, seconds=seconds)


BENCHMARKS: dict[str, Callable[..., Awaitable[list[dict] | dict]]] = {
    "eventstore": bench_eventstore,
    "bus": bench_bus,
    "adapter": bench_adapter,
    "search": bench_search,
    "tools": bench_tools,
    "sessions": bench_sessions,
}


async def run_benchmark(name: str, settings: Settings, *, repetitions: int, warmup: int, **options) -> int:
    """`options` (e.g. memories=..., n=..., batch=...) go to the benchmarks that take them; the others ignore them."""
    if name == "list" or name not in [*BENCHMARKS, "write"]:
        print("benchmarks: " + ", ".join([*BENCHMARKS, "write"]), file=sys.stderr if name != "list" else sys.stdout)
        return 0 if name == "list" else 2
    missing = [n for n, v in (("REDIS_URL", settings.redis_url), ("DATABASE_URL", settings.database_url)) if not v]
    if missing:
        print(f"mnemesh bench {name} needs {' and '.join(missing)}: point them at servers, or use `make bench`, "
              "which provides them", file=sys.stderr)
        return 2
    configure_logging("bench", "warning")
    if name == "write":  # against the running mesh; prints as it goes, then its own summary line
        from services.memory_writer.bench import BenchUnavailable, bench_write

        sizes = {k: v for k, v in options.items() if k in ("n", "batch") and v is not None}
        try:
            print(json.dumps(await bench_write(settings, **sizes)))
        except BenchUnavailable as exc:
            print(f"mnemesh bench write: {exc}", file=sys.stderr)
            return 2
        return 0
    bench = BENCHMARKS[name]
    accepted = inspect.signature(bench).parameters
    given = {k: v for k, v in options.items() if v is not None and (k in accepted or "options" in accepted)}
    outcome = await bench(settings, repetitions, warmup, **given)
    if isinstance(outcome, dict):  # figures of its own and a summary: the summary is on the final line
        print(json.dumps({"benchmark": name, **outcome}, ensure_ascii=False))
    elif outcome:  # a benchmark that returns nothing printed its own report (adapter: a summary line)
        report(name, outcome)
    return 0

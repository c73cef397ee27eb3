"""`mnemesh bench write`: memories/s through the commands stream and gRPC WriteBatch, against a baseline.

Against the running mesh (its namespace, Redis, PostgreSQL and memory-writer port from the settings):

- stream: N commands (mixed English/Chinese, 10 % holding a sensitive value) published as a producer
  would, at most `4 × batch` unacknowledged at a time; a command is acknowledged when its
  `memory.written` event is on `mnemesh.memory.events` (committed and announced);
- grpc: the same mix through `WriteBatch`, `batch` writes per call, 4 calls in flight; a write is
  acknowledged when its call returns;
- baseline: the very rows the stream run committed (memory, event, outbox row, processed id),
  copied into plain tables (same columns and indexes, no row-level security) with batched
  `executemany` at the same batch size, one transaction per batch.

The last line is JSON with `summary` holding exactly: stream_writes_per_s, grpc_writes_per_s,
baseline_rows_per_s (memories whose rows are inserted per second), ratio_stream_to_baseline,
ack_p50_ms, ack_p95_ms, ack_p99_ms (stream acknowledgements).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg
import redis.asyncio

from libs.bench import percentile
from libs.auth import issue_token
from libs.config import Settings
from libs.events import Envelope
from libs.events.schema import MEMORY_COMMANDS, MEMORY_EVENTS
from libs.protogen.mnemesh.v1 import common_pb2, memory_pb2, memory_pb2_grpc
from libs.rpc import channel
from mnemesh.supervisor import check_health
from services.memory_writer.domain.entities import luhn_ok

__all__ = ["bench_write"]

IN_FLIGHT = 4
STALL_S = 60.0  # no acknowledgement for this long: the writer is not consuming this namespace's stream


class BenchUnavailable(RuntimeError):
    """The mesh the bench runs against is not there or not consuming; the message says what to do."""


def _card(i: int) -> str:
    body = f"62220{i:010d}"
    return next(body + d for d in "0123456789" if luhn_ok(body + d))


def _request(run: str, i: int) -> memory_pb2.WriteMemoryRequest:
    text = (f"user prefers window seats and green tea, note {i}" if i % 2 else f"用户喜欢靠窗的座位和绿茶，记录{i}")
    if i % 10 == 0:
        text += f"; card {_card(i)}"
    return memory_pb2.WriteMemoryRequest(
        tenant=common_pb2.TenantContext(tenant_id="bench", user_id=f"bench-u{i % 1000}", session_id=f"s{i % 50}"),
        layer=common_pb2.MEMORY_LAYER_LONG_TERM, source=common_pb2.SOURCE_KIND_USER_STATEMENT,
        content=f"#{run}-{i}# {text}", idempotency_key=f"{run}-{i}")




async def _stream_run(settings: Settings, run: str, n: int, batch: int) -> tuple[float, list[float]]:
    client = redis.asyncio.from_url(settings.redis_url)
    prefix = f"{settings.namespace}." if settings.namespace else ""
    commands, events = prefix + MEMORY_COMMANDS, prefix + MEMORY_EVENTS
    credential = issue_token(settings, subject="bench", tenant_id="bench", scopes=[f"produce:{MEMORY_COMMANDS}"],
                             ttl_seconds=3600) if settings.auth_enabled else ""
    # Printed before the clock starts: a producer's own serialisation is not the writer's work, and on
    # two cores the bench's CPU would otherwise be taken from the writer it measures.
    fields = [Envelope.wrap(_request(run, i), event_type="memory.write_requested", tenant_id="bench",
                            credential=credential).to_fields() for i in range(n)]
    published: dict[int, float] = {}
    latencies: list[float] = []
    last = (await client.xinfo_stream(events))["last-generated-id"] if await client.exists(events) else "0-0"
    marker = f"#{run}-".encode()
    started = progressed = time.perf_counter()
    sent = 0
    try:
        while len(latencies) < n:
            if time.perf_counter() - progressed > STALL_S:
                raise BenchUnavailable(
                    f"no memory.written on {events} for {STALL_S:.0f} s ({len(latencies)} of {n} acknowledged): is "
                    f"a memory-writer of namespace {settings.namespace or '(none)'!r} running against this Redis?")
            while sent < n and sent - len(latencies) < IN_FLIGHT * batch:
                pipe = client.pipeline(transaction=False)
                for i in range(sent, min(n, sent + batch)):
                    pipe.xadd(commands, fields[i])
                await pipe.execute()
                now = time.perf_counter()
                for i in range(sent, min(n, sent + batch)):
                    published[i] = now
                sent = min(n, sent + batch)
            read = await client.xread({events: last}, count=1000, block=2000)
            now = time.perf_counter()
            for _, entries in read or []:
                for entry_id, entry in entries:
                    last = entry_id
                    if entry.get(b"event_type") != b"memory.written":
                        continue
                    # The content starts with the marker (redacted or not); found without parsing the payload.
                    payload = entry[b"payload"]
                    at = payload.find(marker)
                    if at >= 0:
                        at += len(marker)
                        i = int(payload[at:payload.index(b"#", at)])
                        latencies.append((now - published[i]) * 1000)
                        progressed = now
    finally:
        await client.aclose()
    return n / (time.perf_counter() - started), latencies


async def _grpc_run(settings: Settings, run: str, n: int, batch: int) -> float:
    token = issue_token(settings, subject="bench", tenant_id="bench", scopes=["*"], ttl_seconds=3600)
    async with channel(f"{settings.host}:{settings.grpc_port('memory-writer')}", token) as ch:
        stub = memory_pb2_grpc.MemoryWriterStub(ch)
        chunks = [memory_pb2.WriteBatchRequest(writes=[_request(run, i) for i in range(s, min(n, s + batch))])
                  for s in range(0, n, batch)]
        gate = asyncio.Semaphore(IN_FLIGHT)
        started = time.perf_counter()

        async def send(chunk: memory_pb2.WriteBatchRequest) -> None:
            async with gate:
                reply = await stub.WriteBatch(chunk, timeout=120)
                failed = [r.error for r in reply.results if r.error.error_type]
                if failed:
                    raise RuntimeError(f"WriteBatch refused writes: {failed[0]}")

        await asyncio.gather(*(send(c) for c in chunks))
    return n / (time.perf_counter() - started)


async def _baseline(settings: Settings, run: str, batch: int) -> tuple[float, int]:
    """Copy the rows the stream run committed into plain tables with batched executemany."""
    schema = "_".join(filter(None, [settings.namespace, "memory-writer"])).replace("-", "_")
    target = f"bench_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(settings.database_url)
    try:
        memories = await conn.fetch(f'SELECT * FROM "{schema}".memories WHERE idempotency_key LIKE $1',
                                    f"{run}-s-%")
        ids = [str(r["memory_id"]) for r in memories]
        events = await conn.fetch(f'SELECT * FROM "{schema}".events WHERE stream_id = ANY($1::text[])',
                                  [f"memory-{i}" for i in ids])
        event_ids = [r["event_id"] for r in events]
        outbox = await conn.fetch(f'SELECT * FROM "{schema}".outbox WHERE event_id = ANY($1::uuid[])', event_ids)
        processed = await conn.fetch(f'SELECT * FROM "{schema}".processed_events LIMIT $1', len(ids))
        tables = {"memories": memories, "events": events, "outbox": outbox, "processed_events": processed}
        await conn.execute(f'CREATE SCHEMA "{target}"')
        statements = {}
        for table, rows in tables.items():
            await conn.execute(f'CREATE TABLE "{target}".{table} (LIKE "{schema}".{table} INCLUDING DEFAULTS'
                               f" INCLUDING IDENTITY INCLUDING INDEXES)")
            generated = {r[0] for r in await conn.fetch(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2"
                " AND (is_identity = 'YES' OR column_default LIKE 'nextval%%')", schema, table)}
            columns = [c for c in rows[0].keys() if c not in generated] if rows else []
            statements[table] = (f'INSERT INTO "{target}".{table} ({", ".join(columns)}) VALUES '
                                 f'({", ".join(f"${k + 1}" for k in range(len(columns)))})', columns)
        started = time.perf_counter()
        for start in range(0, len(memories), batch):
            async with conn.transaction():
                for table, rows in tables.items():
                    sql, columns = statements[table]
                    share = rows[start * len(rows) // max(len(memories), 1):
                                 (start + batch) * len(rows) // max(len(memories), 1)]
                    if share:
                        await conn.executemany(sql, [tuple(r[c] for c in columns) for r in share])
        elapsed = time.perf_counter() - started
        return len(memories) / elapsed, len(memories)
    finally:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{target}" CASCADE')
        await conn.close()


async def bench_write(settings: Settings, n: int = 20_000, batch: int = 200) -> dict:
    address = f"{settings.host}:{settings.grpc_port('memory-writer')}"
    if not await check_health(address):
        raise BenchUnavailable(f"no memory-writer serving at {address}: start the mesh (`make run`, or `mnemesh serve "
                               "memory-writer` with the same settings), then run the bench again")
    run = uuid.uuid4().hex[:8]
    print(f"write bench {run}: {n} memories, batches of {batch}, against the running memory-writer", flush=True)
    stream_rate, latencies = await _stream_run(settings, f"{run}-s", n, batch)
    print(f"  stream: {stream_rate:,.0f} memories/s; ack p50 {percentile(latencies, .5):.1f} ms, "
          f"p95 {percentile(latencies, .95):.1f} ms, p99 {percentile(latencies, .99):.1f} ms", flush=True)
    grpc_rate = await _grpc_run(settings, f"{run}-g", n, batch)
    print(f"  gRPC WriteBatch: {grpc_rate:,.0f} memories/s", flush=True)
    baseline_rate, copied = await _baseline(settings, run, batch)
    print(f"  baseline (executemany of the same {copied} memories' rows): {baseline_rate:,.0f} memories/s", flush=True)
    summary = {"stream_writes_per_s": round(stream_rate, 1), "grpc_writes_per_s": round(grpc_rate, 1),
               "baseline_rows_per_s": round(baseline_rate, 1),
               "ratio_stream_to_baseline": round(stream_rate / baseline_rate, 3) if baseline_rate else 0.0,
               "ack_p50_ms": round(percentile(latencies, .5), 2), "ack_p95_ms": round(percentile(latencies, .95), 2),
               "ack_p99_ms": round(percentile(latencies, .99), 2)}
    print(f"  ratio stream/baseline: {summary['ratio_stream_to_baseline']}")
    return {"benchmark": "write", "n": n, "batch": batch, "summary": summary}

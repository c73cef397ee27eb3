"""A real retriever process (`mnemesh serve retriever`) killed mid-projection, then restarted."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg
import pytest

from libs.events import Envelope
from libs.events.bus import EventBus
from libs.events.schema import MEMORY_EVENTS
from libs.protogen.mnemesh.v1 import common_pb2, events_pb2
from mnemesh.infra import free_port

pytestmark = pytest.mark.integration

EVENTS = 1200
TENANT = "acme"


def _written(n: int) -> Envelope:
    memory = common_pb2.Memory(memory_id=str(uuid.uuid4()), tenant=common_pb2.TenantContext(tenant_id=TENANT,
                                                                                            user_id="u1"),
                               layer=5, source=2, confidence=1,
                               content=f"note {n}: {'买了去上海的机票' if n % 2 else 'booked the flight to Lisbon'}")
    memory.created_at.GetCurrentTime()
    return Envelope.wrap(events_pb2.MemoryWritten(memory=memory, version=1), event_type="memory.written",
                         tenant_id=TENANT)


def _start(redis_url: str, database_url: str, namespace: str, data_dir: Path) -> subprocess.Popen:
    env = {**os.environ, "REDIS_URL": redis_url, "DATABASE_URL": database_url, "MNEMESH_NAMESPACE": namespace,
           "MNEMESH_DATA_DIR": str(data_dir), "MNEMESH_EMBEDDER": "hash", "MNEMESH_METRICS_ENABLED": "false",
           "MNEMESH_RETRIEVER_GRPC_PORT": str(free_port()), "MNEMESH_LOG_LEVEL": "warning", "MNEMESH_DEV_MODE": "true"}
    log = data_dir / f"retriever-{uuid.uuid4().hex[:6]}.log"  # a file, not a pipe: a full pipe would block it
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mnemesh", "serve", "retriever"], env=env,
                                stdout=subprocess.DEVNULL, stderr=out)
    proc.log = log
    return proc


async def _counts(conn: asyncpg.Connection, schema: str) -> tuple[int, int, int]:
    """(events applied, documents, documents with their vectors written)."""
    row = await conn.fetchrow(
        f'SELECT (SELECT count(*) FROM "{schema}".processed_events) AS applied,'
        f' (SELECT count(*) FROM "{schema}".documents) AS documents,'
        f' (SELECT count(*) FROM "{schema}".documents WHERE projected) AS projected')
    return row["applied"], row["documents"], row["projected"]


async def _until(conn: asyncpg.Connection, schema: str, proc: subprocess.Popen, done, seconds: float = 90):
    """Wait (bounded) for the projection to reach `done(counts)`; the process must stay alive meanwhile."""
    counts = None
    try:
        async with asyncio.timeout(seconds):
            while True:
                assert proc.poll() is None, proc.log.read_text()[-2000:]
                migrated = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL",
                                               f"{schema}.documents_unprojected")
                if migrated and done(counts := await _counts(conn, schema)):
                    return counts
                await asyncio.sleep(0.02)  # polling the database: a condition with a bound, not a guess
    except TimeoutError:
        raise AssertionError(f"the projection stopped at {counts} (applied, documents, projected)") from None


async def test_a_retriever_killed_mid_projection_resumes_with_no_duplicate_and_no_gap(
    redis_url: str, database_url: str, unique: str, tmp_path: Path
) -> None:
    from services.retriever.adapters.vectors import COLLECTION, EdgeVectorIndex

    namespace, schema = f"t{unique}", f"t{unique}_retriever"
    bus = EventBus(redis_url, consumer_name="producer", namespace=namespace)
    envelopes = [_written(n) for n in range(EVENTS)]
    for envelope in envelopes:
        await bus.publish(envelope, stream=MEMORY_EVENTS)
    conn = await asyncpg.connect(database_url)
    first = second = None
    try:
        first = _start(redis_url, database_url, namespace, tmp_path)
        # Killed once some events are applied and some vectors written, long before the end.
        applied, _, projected = await _until(conn, schema, first, lambda c: c[2] >= 50)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        killed_at = await _counts(conn, schema)
        # Events are applied in stream batches of 256, far faster than vectors are written: the kill lands
        # mid-projection (and, when early enough, mid-stream too).
        assert killed_at[2] < EVENTS, "the projection finished before it was killed: nothing was tested"

        second = _start(redis_url, database_url, namespace, tmp_path)
        final = await _until(conn, schema, second, lambda c: c == (EVENTS, EVENTS, EVENTS))
        second.send_signal(signal.SIGTERM)  # a graceful stop flushes the embedded index
        assert second.wait(30) == 0
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
        redis = await bus.redis()
        groups = await redis.xinfo_groups(bus.stream_name(MEMORY_EVENTS))
        await redis.delete(bus.stream_name(MEMORY_EVENTS))
        await bus.stop()
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()

    assert final == (EVENTS, EVENTS, EVENTS) and [g["pending"] for g in groups] == [0]
    index = EdgeVectorIndex(tmp_path / "qdrant" / f"{COLLECTION}-256", dim=256)
    try:
        ids = [e.message().memory.memory_id for e in envelopes]
        assert index.count(TENANT) == EVENTS  # every memory once: no gap, no duplicate point
        assert set(index.retrieve(TENANT, ids)) == set(ids)
    finally:
        index.close()

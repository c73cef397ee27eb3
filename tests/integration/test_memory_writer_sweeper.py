"""The sweeper against real PostgreSQL and Redis: expiry with an injected clock, one leader at a time,
no memory expired twice even by two sweepers; idle memories archived; accesses raise engagement."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import redis.asyncio

from libs.crypto import LocalKeyFile
from libs.db import Database, apply_migrations, load_migrations
from libs.eventstore import EventStore
from libs.lease import RedisLease
from libs.outbox import Outbox
from services.memory_writer.adapters.keys import KeyRing
from services.memory_writer.adapters.postgres import PostgresUnitOfWork
from services.memory_writer.domain import Layer, Source, WriteMemory
from services.memory_writer.entrypoints.sweeper import Sweeper
from services.memory_writer.service_layer.handlers import write_batch
from services.memory_writer.service_layer.upkeep import SweepPolicy, record_access

pytestmark = pytest.mark.integration
T0 = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture
async def writer_db(database_url: str, schema: str, db: Database, tmp_path):
    await apply_migrations(database_url, schema, load_migrations("services.memory_writer"))
    keys = KeyRing(LocalKeyFile(tmp_path / "master.key", create=True))
    store, outbox = EventStore(db), Outbox(db)
    yield lambda: PostgresUnitOfWork(db, store, outbox, keys)
    await store.close()


async def write_many(uow, n: int, *, expires_at: datetime | None, now: datetime = T0) -> list[str]:
    cmds = [WriteMemory(tenant_id="acme", user_id=f"u{i % 10}", session_id="s", layer=Layer.LONG_TERM,
                        source=Source.USER_STATEMENT, content=f"fact number {i} 事实 {uuid.uuid4().hex[:6]}",
                        expires_at=expires_at) for i in range(n)]
    outcomes = await write_batch(cmds, uow, tenant_id="acme", now=now)
    return [o.memory_id for o in outcomes]


async def expired_ids_in_events(db: Database) -> list[str]:
    async with db.system_transaction() as conn:
        rows = await conn.fetch("SELECT payload FROM events WHERE event_type = 'memory.expired'")
    return [m for r in rows for m in json.loads(r["payload"])["memoryIds"]]


async def test_two_sweeper_replicas_one_leader_each_round_and_no_memory_expired_twice(
    writer_db, db: Database, redis_client: redis.asyncio.Redis, unique: str,
) -> None:
    ids = await write_many(writer_db, 300, expires_at=T0 + timedelta(hours=1))
    keep = await write_many(writer_db, 20, expires_at=T0 + timedelta(days=3))
    key = f"test.{unique}.sweeper"
    policy = SweepPolicy(batch=40)  # several rounds are needed, so the replicas contend each round
    replicas = [Sweeper(db, writer_db, RedisLease(redis_client, key, ttl_ms=60_000), policy, every_seconds=1,
                        clock=lambda: T0 + timedelta(hours=2)) for _ in range(2)]
    assert [await r.sweep_once() for r in replicas][1] is None  # the second replica does not lead
    leaders_per_round = []
    for _ in range(10):
        results = await asyncio.gather(*(r.sweep_once() for r in replicas))
        leaders_per_round.append(sum(r is not None for r in results))
    expired = await expired_ids_in_events(db)
    assert leaders_per_round == [1] * 10
    assert sorted(expired) == sorted(ids) and len(set(expired)) == len(expired)
    async with db.transaction("acme") as conn:
        assert sorted(r[0] for r in await conn.fetch("SELECT memory_id::text FROM memories")) == sorted(keep)
    await redis_client.delete(key)


async def test_without_a_shared_lease_two_sweepers_still_never_expire_a_memory_twice(
    writer_db, db: Database, redis_client: redis.asyncio.Redis, unique: str,
) -> None:
    ids = await write_many(writer_db, 200, expires_at=T0 + timedelta(hours=1))
    replicas = [Sweeper(db, writer_db, RedisLease(redis_client, f"test.{unique}.own-{i}", ttl_ms=60_000),
                        SweepPolicy(batch=25), every_seconds=1, clock=lambda: T0 + timedelta(hours=2))
                for i in range(2)]
    for _ in range(6):
        await asyncio.gather(*(r.sweep_once() for r in replicas))
    expired = await expired_ids_in_events(db)
    assert sorted(expired) == sorted(ids) and len(set(expired)) == len(expired)
    await redis_client.delete(*[f"test.{unique}.own-{i}" for i in range(2)])


async def test_idle_memories_are_archived_accessed_ones_are_not_and_engagement_decays_by_half_life(
    writer_db, db: Database, redis_client: redis.asyncio.Redis, unique: str,
) -> None:
    idle, used = await write_many(writer_db, 2, expires_at=None)
    policy = SweepPolicy(archive_after=timedelta(days=90), half_life=timedelta(days=30))
    assert await record_access("acme", [used], T0 + timedelta(days=30), writer_db(), policy) == 1
    assert await record_access("acme", [used], T0 + timedelta(days=60), writer_db(), policy) == 1
    sweeper = Sweeper(db, writer_db, RedisLease(redis_client, f"test.{unique}.arch", ttl_ms=60_000), policy,
                      every_seconds=1, clock=lambda: T0 + timedelta(days=91))
    result = await sweeper.sweep_once()
    assert result.archived == (idle,)
    async with db.transaction("acme") as conn:
        rows = {r["memory_id"]: r for r in await conn.fetch(
            "SELECT memory_id::text, status, engagement FROM memories")}
    assert rows[idle]["status"] == 5 and rows[used]["status"] == 1
    # 0 → 1 at day 30; halves by day 60 (0.5) → 1.5
    assert rows[used]["engagement"] == pytest.approx(1.5)
    assert await record_access("acme", [idle], T0 + timedelta(days=92), writer_db(), policy) == 1
    async with db.transaction("acme") as conn:
        assert await conn.fetchval("SELECT status FROM memories WHERE memory_id::text = $1", idle) == 1
    await redis_client.delete(f"test.{unique}.arch")

"""The batch's lookups by user go by user on a table the planner has no statistics for yet.

Before autovacuum first analyses `memories` (a new deployment's first minute), the planner took an
index partial on `status = 1` by tenant (memories_idle) for these lookups and scanned every memory of
the tenant once per user of a batch. Checked here on a table of 600 memories of 600 users, never analysed, with the
generic plan a prepared statement ends up with.
"""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from libs.crypto import LocalKeyFile
from libs.db import Database, apply_migrations, load_migrations
from libs.eventstore import EventStore
from libs.outbox import Outbox
from services.memory_writer.adapters.batched import CANDIDATES, CURRENT_VALUES, IDENTICAL
from services.memory_writer.adapters.keys import KeyRing
from services.memory_writer.adapters.postgres import PostgresUnitOfWork
from services.memory_writer.domain import Layer, Source, WriteMemory
from services.memory_writer.service_layer.handlers import write_batch

pytestmark = pytest.mark.integration


async def test_the_batch_lookups_go_by_user_before_the_table_is_analysed(
        database_url: str, schema: str, db: Database, tmp_path) -> None:
    await apply_migrations(database_url, schema, load_migrations("services.memory_writer"))
    owner = await asyncpg.connect(database_url)
    try:  # no analysis during the test, whatever autovacuum's timing
        await owner.execute(f'ALTER TABLE "{schema}".memories SET (autovacuum_enabled = false)')
    finally:
        await owner.close()
    keys = KeyRing(LocalKeyFile(tmp_path / "master.key", create=True))
    store, outbox = EventStore(db), Outbox(db)
    try:
        for start in range(0, 600, 200):  # many users, a few memories each, as a busy tenant's first minute
            cmds = [WriteMemory(tenant_id="acme", user_id=f"u{i}", session_id="s", layer=Layer.LONG_TERM,
                                source=Source.USER_STATEMENT, content=f"fact {i} {uuid.uuid4().hex}")
                    for i in range(start, start + 200)]
            await write_batch(cmds, lambda: PostgresUnitOfWork(db, store, outbox, keys), tenant_id="acme")
    finally:
        await store.close()
    async with db.transaction("acme") as conn:
        assert await conn.fetchval("SELECT count(*) FROM memories") == 600
        assert await conn.fetchval("SELECT last_analyze IS NULL AND last_autoanalyze IS NULL FROM"
                                   " pg_stat_user_tables WHERE relid = 'memories'::regclass")
        await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        users = [f"u{i}" for i in range(200)]
        for query, args in [(CANDIDATES, ("acme", users, [5] * 200, list(range(200)), 800)),
                            (IDENTICAL, ("acme", users, [5] * 200, ["d"] * 200)),
                            (CURRENT_VALUES, ("acme", users, ["user.phone"] * 200))]:
            plan = "\n".join(r[0] for r in await (await conn.prepare("EXPLAIN " + query)).fetch(*args))
            assert "memories_idle" not in plan, plan
            assert "(user_id = " in plan.split("Index Cond:", 1)[-1].split("\n", 1)[0], plan  # by user

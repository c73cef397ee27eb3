"""Two memory-writer replicas writing the same content at once, against real PostgreSQL.

Each replica has its own key ring and its own transaction, as two processes would. The first one's
transaction is held open after its write; the second's write of identical content must wait for it,
then merge into the first's memory: one row, whatever the interleaving.
"""

from __future__ import annotations

import asyncio

import anyio
import pytest

from libs.crypto import LocalKeyFile
from libs.db import Database, apply_migrations, load_migrations
from libs.eventstore import EventStore
from libs.outbox import Outbox
from services.memory_writer.adapters.keys import KeyRing
from services.memory_writer.adapters.postgres import PostgresUnitOfWork
from services.memory_writer.domain import Layer, Source, WriteMemory, WriteStatus
from services.memory_writer.service_layer.handlers import write_batch, write_memory

pytestmark = pytest.mark.integration

CONTENT = "I always book an aisle seat on long flights"


@pytest.fixture
async def replicas(database_url: str, schema: str, db: Database, tmp_path):
    """A unit-of-work factory per replica: (replica, connection or None) -> unit."""
    await apply_migrations(database_url, schema, load_migrations("services.memory_writer"))
    LocalKeyFile(tmp_path / "master.key", create=True)
    rings = [KeyRing(LocalKeyFile(tmp_path / "master.key")) for _ in range(2)]
    store, outbox = EventStore(db), Outbox(db)
    yield lambda replica, conn=None: PostgresUnitOfWork(db, store, outbox, rings[replica], conn=conn)
    await store.close()


def same_content(key: str, content: str = CONTENT) -> WriteMemory:
    return WriteMemory(tenant_id="acme", user_id="u1", session_id="s1", layer=Layer.LONG_TERM,
                       source=Source.USER_STATEMENT, content=content, idempotency_key=key)


async def waits_on_a_lock(db: Database, pid: int) -> bool:
    async with db.system_transaction() as conn:
        return await conn.fetchval("SELECT count(*) > 0 FROM pg_locks WHERE pid = $1 AND NOT granted", pid)


@pytest.mark.parametrize("second_path", ["batch", "single"])
async def test_identical_content_written_at_once_by_two_replicas_is_stored_once_and_merged(
        replicas, db: Database, second_path: str) -> None:
    second_pid: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def second_replica():
        async with db.transaction("acme") as conn:
            second_pid.set_result(conn.get_server_pid())
            if second_path == "batch":
                return (await write_batch([same_content("r2-k")], lambda: replicas(1, conn), tenant_id="acme"))[0]
            return await write_memory(same_content("r2-k"), replicas(1, conn))

    async with db.transaction("acme") as conn:  # replica 1 writes and has not committed yet
        first, _ = await write_batch([same_content("r1-k"), same_content("r1-other", "a different memory")],
                                     lambda: replicas(0, conn), tenant_id="acme")
        assert first.status is WriteStatus.STORED
        second = asyncio.create_task(second_replica())
        pid = await second_pid
        with anyio.fail_after(10):  # replica 2 must wait for replica 1's content, not write its own
            while not await waits_on_a_lock(db, pid):
                assert not second.done(), f"the second replica did not wait: {second.result()}"
                await anyio.sleep(0.02)
    result = await second
    assert result.status is WriteStatus.MERGED and result.memory_id == first.memory_id
    async with db.transaction("acme") as conn:
        stored = await conn.fetch("SELECT memory_id::text, merged_count FROM memories WHERE content = $1", CONTENT)
    assert [(r["memory_id"], r["merged_count"]) for r in stored] == [(first.memory_id, 1)]

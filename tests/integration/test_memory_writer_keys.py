"""Keys and forgetting against real PostgreSQL: a forget and the writes in flight around it.

Two key rings stand for two replicas. A write that holds a user's keys when a forget starts makes the
forget wait, and what it wrote is deleted with the rest; a write that comes while a forget waits or runs
tries for a moment (`hold_wait`), then is refused as Busy (retryable), and starts afresh, under new keys,
when retried after it. A write holding a memory's row lock never deadlocks with a forget. Nothing is ever sealed under a destroyed key,
and the tenant key can still be rotated.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import anyio
import pytest

from libs.crypto import LocalKeyFile
from libs.errors import Busy
from libs.db import Database, apply_migrations, load_migrations
from libs.eventstore import EventStore
from libs.outbox import Outbox
from services.memory_writer.adapters.keys import KeyRing
from services.memory_writer.adapters.postgres import PostgresUnitOfWork
from services.memory_writer.domain import Layer, Source, WriteMemory, WriteStatus
from services.memory_writer.service_layer.handlers import (
    ForgetMemory,
    ForgetTenant,
    GetMemory,
    RotateTenantKey,
    forget,
    forget_tenant,
    get_memory,
    rotate_tenant_key,
    write_memory,
)

pytestmark = pytest.mark.integration
PASSWORD = "hunter22-Blue-zebra"


def a_write(user: str, content: str) -> WriteMemory:
    return WriteMemory(tenant_id="acme", user_id=user, session_id="s", layer=Layer.LONG_TERM,
                       source=Source.USER_STATEMENT, content=content)


class PausedAfterAdd(PostgresUnitOfWork):
    """A write that stops once its memory is added (its keys taken) until released."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.added, self.release = asyncio.Event(), asyncio.Event()

    async def add(self, record) -> bool:
        added = await super().add(record)
        self.added.set()
        await self.release.wait()
        return added


class PausedAfterFindingIdentical(PostgresUnitOfWork):
    """A write whose content is already stored: it stops holding the stored memory's row lock (and its keys)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.found, self.release = asyncio.Event(), asyncio.Event()

    async def find_identical(self, *args):
        found = await super().find_identical(*args)
        self.found.set()
        await self.release.wait()
        return found


class Replicas:
    def __init__(self, db: Database, provider: LocalKeyFile) -> None:
        self.db, self.provider = db, provider
        self.store, self.outbox = EventStore(db), Outbox(db)
        self.rings = {"a": KeyRing(provider), "b": KeyRing(provider)}

    def uow(self, replica: str = "a", kind: type[PostgresUnitOfWork] = PostgresUnitOfWork) -> PostgresUnitOfWork:
        return kind(self.db, self.store, self.outbox, self.rings[replica], hold_wait=0.5)

    async def rows(self, query: str) -> list[tuple]:
        async with self.db.transaction("acme") as conn:
            return [tuple(r) for r in await conn.fetch(query)]


@pytest.fixture
async def replicas(database_url: str, schema: str, db: Database, tmp_path) -> AsyncIterator[Replicas]:
    await apply_migrations(database_url, schema, load_migrations("services.memory_writer"))
    mesh = Replicas(db, LocalKeyFile(tmp_path / "master.key", create=True))
    try:
        yield mesh
    finally:
        await mesh.store.close()


async def readable(mesh: Replicas, memory_id: str, replica: str) -> str:
    record, revealed = await get_memory(GetMemory("acme", memory_id, reveal=True), mesh.uow(replica))
    assert revealed
    return record.content


@pytest.mark.parametrize("whole_tenant", [False, True])
async def test_a_forget_waits_for_the_write_in_flight_and_deletes_what_it_wrote(
    replicas: Replicas, whole_tenant: bool
) -> None:
    await write_memory(a_write("u9", "an earlier note"), replicas.uow())
    in_flight = replicas.uow("b", PausedAfterAdd)  # replica b writes for u9 while replica a forgets
    writing = asyncio.create_task(write_memory(a_write("u9", f"my password is {PASSWORD}"), in_flight))
    with anyio.fail_after(10):
        await in_flight.added.wait()
    forgetting = asyncio.create_task(
        forget_tenant(ForgetTenant("acme", "acme"), replicas.uow()) if whole_tenant
        else forget(ForgetMemory("acme", "u9", requested_by="u9"), replicas.uow()))
    await asyncio.sleep(0.3)
    assert not forgetting.done()  # it waits for the write in flight, which holds u9's key
    with pytest.raises(Busy):  # a write that comes meanwhile is refused after hold_wait, never left waiting
        await write_memory(a_write("u9", f"and my pin is {PASSWORD}"), replicas.uow())
    if not whole_tenant:  # another user's writes go on
        await write_memory(a_write("u8", f"my password is {PASSWORD}"), replicas.uow())
    in_flight.release.set()
    with anyio.fail_after(10):
        late = await writing
        await forgetting
    assert await replicas.rows(f"SELECT 1 FROM memories WHERE memory_id = '{late.memory_id}'") == []
    assert await replicas.rows("SELECT user_id FROM user_keys") == ([] if whole_tenant else [("u8",)])
    for replica in ("a", "b"):  # a new start on either replica, under a live key
        again = await write_memory(a_write("u9", f"my new password is {PASSWORD}-{replica}"), replicas.uow(replica))
        assert await readable(replicas, again.memory_id, "a") == f"my new password is {PASSWORD}-{replica}"
        assert await readable(replicas, again.memory_id, "b") == f"my new password is {PASSWORD}-{replica}"
    version, rewrapped = await rotate_tenant_key(RotateTenantKey("acme"), replicas.uow("b"))
    assert (version, rewrapped) == ((3, 1) if whole_tenant else (2, 2))


async def test_a_write_during_a_tenant_forget_is_refused_then_starts_afresh(replicas: Replicas) -> None:
    before = await write_memory(a_write("u1", f"my password is {PASSWORD}"), replicas.uow("b"))
    assert await readable(replicas, before.memory_id, "b") == f"my password is {PASSWORD}"  # b caches version 1
    forgetting = replicas.uow()
    async with forgetting:
        await forgetting.shred_tenant_keys("acme")
        with pytest.raises(Busy) as refused:
            await write_memory(a_write("u1", f"a new password {PASSWORD}"), replicas.uow("b"))
        assert refused.value.retryable and "forget" in refused.value.reason
        await forgetting.delete_tenant("acme")
    written = await write_memory(a_write("u1", f"a new password {PASSWORD}"), replicas.uow("b"))
    assert await readable(replicas, written.memory_id, "a") == f"a new password {PASSWORD}"
    assert await replicas.rows("SELECT version, wrapped IS NULL FROM tenant_keys ORDER BY version") == \
        [(1, True), (2, False)]
    assert await replicas.rows("SELECT user_id, tenant_version FROM user_keys") == [("u1", 2)]


async def test_a_write_holding_a_memorys_row_lock_never_deadlocks_with_a_forget(replicas: Replicas) -> None:
    await write_memory(a_write("u9", "prefers tea over coffee"), replicas.uow())
    merging = replicas.uow("b", PausedAfterFindingIdentical)  # the same content again: merged into the first
    tagged = replace(a_write("u9", "prefers tea over coffee"), tags=("drinks",))  # its tags are sealed: a key
    writing = asyncio.create_task(write_memory(tagged, merging))
    with anyio.fail_after(10):
        await merging.found.wait()  # it holds the stored memory's row, and no key yet
    forgetting = asyncio.create_task(forget(ForgetMemory("acme", "u9", requested_by="u9"), replicas.uow()))
    await asyncio.sleep(0.3)
    assert not forgetting.done()  # the write took u9's keys first: the forget waits for it
    merging.release.set()
    with anyio.fail_after(10):
        assert (await writing).status is WriteStatus.MERGED
        assert await forgetting == 1  # then deletes the memory it merged into
    assert await replicas.rows("SELECT 1 FROM memories") == []


async def test_a_unit_entered_again_after_a_rollback_holds_its_keys_again(replicas: Replicas) -> None:
    """The stream rerun of a batch enters its unit again, inside the consumer's transaction: the keys locks of
    the attempt that rolled back went with its savepoint, and must be taken again, not assumed."""
    await write_memory(a_write("u9", "an earlier note"), replicas.uow())
    async with replicas.db.connection() as conn, conn.transaction():  # the consumer's transaction
        unit = PostgresUnitOfWork(replicas.db, replicas.store, replicas.outbox, replicas.rings["b"], conn=conn,
                                  hold_wait=0.2)
        with pytest.raises(RuntimeError):
            async with unit:
                await unit.hold_keys("acme", ["u9"])
                raise RuntimeError("the first attempt failed after taking u9's keys")
        forgetting = replicas.uow()
        async with forgetting:  # a forget of u9 now holds its keys
            await forgetting.shred_user_key("acme", "u9")
            with pytest.raises(Busy):
                async with unit:  # the rerun
                    await unit.hold_keys("acme", ["u9"])

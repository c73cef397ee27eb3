"""The event store against real PostgreSQL: optimistic concurrency and gap-safe catch-up."""

from __future__ import annotations

import asyncio
import random

import anyio
import pytest

from libs.db import Database
from libs.errors import Conflict
from libs.events import Envelope
from libs.eventstore import ANY_VERSION, Checkpoint, EventStore
from libs.protogen.mnemesh.v1 import events_pb2

pytestmark = pytest.mark.integration


def event(text: str) -> Envelope:
    return Envelope.wrap(events_pb2.SessionMessageAppended(device_id="d", role="user", text=text),
                         event_type="session.message_appended", tenant_id="t1")


async def test_concurrent_appenders_get_one_winner_per_version_and_gapless_versions(db: Database) -> None:
    store = EventStore(db)
    writers, rounds = 12, 15
    wins: list[tuple[int, int]] = []
    conflicts = 0

    async def writer(n: int) -> None:
        nonlocal conflicts
        while len(wins) < rounds:
            seen = await store.current_version("s")
            if seen >= rounds:
                return
            try:
                async with db.connection() as conn, conn.transaction():
                    version = await store.append(conn, "s", seen, [event(f"w{n} at {seen}")])
                wins.append((version, n))
            except Conflict as exc:
                assert exc.field == "expected_version"
                conflicts += 1

    with anyio.fail_after(60):
        await asyncio.gather(*(writer(n) for n in range(writers)))
    stored = await store.read_stream("s")
    assert [e.version for e in stored] == list(range(1, len(stored) + 1))  # gapless, unique
    assert sorted(v for v, _ in wins) == [e.version for e in stored]  # each version won exactly once
    assert conflicts > 0, "the writers never raced; the test proved nothing"


async def test_appending_at_a_stale_version_is_a_conflict_that_names_the_current_version(db: Database) -> None:
    store = EventStore(db)
    async with db.connection() as conn, conn.transaction():
        await store.append(conn, "s", 0, [event("a"), event("b")])
    with pytest.raises(Conflict) as caught:
        async with db.connection() as conn, conn.transaction():
            await store.append(conn, "s", 1, [event("c")])
    assert "version 2" in caught.value.reason and caught.value.field == "expected_version"
    assert [e.version for e in await store.read_stream("s")] == [1, 2]


async def test_a_reader_never_passes_an_event_whose_transaction_commits_late(db: Database) -> None:
    """Writer A takes an earlier position and commits after writer B; the reader must wait for A."""
    store = EventStore(db)
    for attempt in range(25):
        async with db.connection() as conn_a:
            async with conn_a.transaction():
                await store.append(conn_a, f"a{attempt}", 0, [event("early position, late commit")])
                async with db.connection() as conn_b, conn_b.transaction():
                    await store.append(conn_b, f"b{attempt}", 0, [event("later position, early commit")])
                # B is committed, A is not: a catch-up reader must not move past A's position.
                visible = await store.read_all(Checkpoint())
                assert not [e for e in visible if e.stream_id == f"b{attempt}"], \
                    "the reader saw B while A, with an earlier position, was still in flight"
        after = await store.read_all(Checkpoint())
        order = [e.stream_id for e in after if e.stream_id in (f"a{attempt}", f"b{attempt}")]
        assert order == [f"a{attempt}", f"b{attempt}"]


async def test_a_catch_up_subscriber_sees_every_event_of_many_racing_writers(db: Database) -> None:
    store = EventStore(db, poll_seconds=0.05)
    expected: set[str] = set()
    seen: list[str] = []

    async def writer(n: int) -> None:
        for i in range(10):
            async with db.connection() as conn, conn.transaction():
                e = event(f"{n}-{i}")
                await store.append(conn, f"w{n}", ANY_VERSION, [e])
                expected.add(e.event_id)
                await asyncio.sleep(random.random() / 100)  # hold the transaction open a little

    async def reader() -> None:
        async for stored in store.subscribe_all():
            seen.append(stored.envelope.event_id)
            if len(seen) == 80:
                return

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            await asyncio.gather(*(writer(n) for n in range(8)))
    assert len(seen) == len(set(seen)) == 80  # nothing repeated
    assert set(seen) == expected  # nothing skipped


async def test_a_stream_subscription_catches_up_then_follows_live(db: Database) -> None:
    store = EventStore(db, poll_seconds=0.05)
    async with db.connection() as conn, conn.transaction():
        await store.append(conn, "live", 0, [event("1"), event("2")])
    got: list[int] = []
    with anyio.fail_after(20):
        async for stored in store.subscribe_stream("live", after_version=1):
            got.append(stored.version)
            if stored.version == 2:
                async with db.connection() as conn, conn.transaction():
                    await store.append(conn, "live", 2, [event("3")])
            if stored.version == 3:
                break
    assert got == [2, 3]


async def test_the_global_order_follows_transaction_ids_numerically_across_digit_boundaries(db: Database) -> None:
    """Transaction 99 comes before 100 (as text it would not): a fresh cluster crosses such bounds early.

    The ids are below any running transaction's, so the fence lets them all through."""
    store = EventStore(db)
    async with db.connection() as conn, conn.transaction():
        for tx, stream in (("100", "later"), ("99", "earlier"), ("1000", "latest")):
            e = event(stream)
            await conn.execute(
                "INSERT INTO events (transaction_id, stream_id, version, event_id, event_type, schema_version,"
                " tenant_id, payload, occurred_at) VALUES (%s::xid8, %s, 1, %s, %s, 1, 't1', %s, now())",
                [tx, stream, e.event_id, e.event_type, e.payload])
    order = [e.stream_id for e in await store.read_all(Checkpoint())]
    assert order == ["earlier", "later", "latest"]
    after_first = [e.stream_id for e in await store.read_all(Checkpoint(99, 10**9))]
    assert after_first == ["later", "latest"]


async def test_an_expected_version_below_minus_one_is_refused(db: Database) -> None:
    store = EventStore(db)
    async with db.connection() as conn, conn.transaction():
        with pytest.raises(ValueError, match="expected_version"):
            await store.append(conn, "s", -2, [event("x")])

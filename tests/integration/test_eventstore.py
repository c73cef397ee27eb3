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

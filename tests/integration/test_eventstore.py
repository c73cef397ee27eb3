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


async def feed_once_settled(store: EventStore, streams: set[str], count: int) -> list:
    """The global feed once it holds `count` events of `streams`.

    The feed stops at the oldest transaction running anywhere in the cluster, so a transaction of
    another client (another test run on a shared server) can hold it back for a while; this waits
    for that, and a feed that never settles still fails the test.
    """
    with anyio.fail_after(30):
        while True:
            feed = [e for e in await store.read_all(Checkpoint()) if e.stream_id in streams]
            if len(feed) >= count:
                return feed
            await anyio.sleep(0.05)


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
                async with db.transaction("t1") as conn:
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
    async with db.transaction("t1") as conn:
        await store.append(conn, "s", 0, [event("a"), event("b")])
    with pytest.raises(Conflict) as caught:
        async with db.transaction("t1") as conn:
            await store.append(conn, "s", 1, [event("c")])
    assert "version 2" in caught.value.reason and caught.value.field == "expected_version"
    assert [e.version for e in await store.read_stream("s")] == [1, 2]


async def test_a_reader_never_passes_an_event_whose_transaction_commits_late(db: Database) -> None:
    """Writer A takes an earlier position and commits after writer B; the reader must wait for A."""
    store = EventStore(db)
    for attempt in range(25):
        async with db.connection() as conn_a:
            async with conn_a.transaction():
                await conn_a.execute("SELECT set_config('mnemesh.tenant_id', 't1', true)")
                await store.append(conn_a, f"a{attempt}", 0, [event("early position, late commit")])
                async with db.transaction("t1") as conn_b:
                    await store.append(conn_b, f"b{attempt}", 0, [event("later position, early commit")])
                # B is committed, A is not: a catch-up reader must not move past A's position.
                visible = await store.read_all(Checkpoint())
                assert not [e for e in visible if e.stream_id == f"b{attempt}"], \
                    "the reader saw B while A, with an earlier position, was still in flight"
        after = await feed_once_settled(store, {f"a{attempt}", f"b{attempt}"}, 2)
        order = [e.stream_id for e in after]
        assert order == [f"a{attempt}", f"b{attempt}"]


async def test_a_catch_up_subscriber_sees_every_event_of_many_racing_writers(db: Database) -> None:
    store = EventStore(db, poll_seconds=0.05)
    expected: set[str] = set()
    seen: list[str] = []

    async def writer(n: int) -> None:
        for i in range(10):
            async with db.transaction("t1") as conn:
                e = event(f"{n}-{i}")
                await store.append(conn, f"w{n}", ANY_VERSION, [e])
                expected.add(e.event_id)
                await asyncio.sleep(random.random() / 100)  # hold the transaction open a little

    sentinel = event("the end")

    async def reader() -> None:
        async for stored in store.subscribe_all():
            if stored.envelope.event_id == sentinel.event_id:
                return
            seen.append(stored.envelope.event_id)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            await asyncio.gather(*(writer(n) for n in range(8)))
            async with db.transaction("t1") as conn:  # appended after every writer committed
                await store.append(conn, "end", 0, [sentinel])
    # The reader stopped at the sentinel, which comes after every other event: a skipped event is
    # missing here at once, without waiting for a timeout.
    assert len(seen) == len(set(seen))  # nothing repeated
    assert set(seen) == expected  # nothing skipped


async def test_a_stream_subscription_catches_up_then_follows_live(db: Database) -> None:
    store = EventStore(db, poll_seconds=0.05)
    async with db.transaction("t1") as conn:
        await store.append(conn, "live", 0, [event("1"), event("2")])
    got: list[int] = []
    with anyio.fail_after(20):
        async for stored in store.subscribe_stream("live", after_version=1):
            got.append(stored.version)
            if stored.version == 2:
                async with db.transaction("t1") as conn:
                    await store.append(conn, "live", 2, [event("3")])
            if stored.version == 3:
                break
    assert got == [2, 3]


async def test_the_global_order_follows_transaction_ids_numerically_across_digit_boundaries(db: Database) -> None:
    """Transaction 9 comes before 10 and 100 (as text it would not): a fresh cluster crosses such bounds early.

    The ids are below any running transaction's, so the fence lets them all through."""
    store = EventStore(db)
    async with db.transaction("t1") as conn:
        for tx, stream in (("10", "later"), ("9", "earlier"), ("100", "latest")):
            e = event(stream)
            await conn.execute(
                "INSERT INTO events (transaction_id, stream_id, version, event_id, event_type, schema_version,"
                " tenant_id, payload, occurred_at) VALUES ($1::text::xid8, $2, 1, $3, $4, 1, 't1', $5, now())",
                tx, stream, e.event_id, e.event_type, e.payload)
    order = [e.stream_id for e in await store.read_all(Checkpoint())]
    assert order == ["earlier", "later", "latest"]
    after_first = [e.stream_id for e in await store.read_all(Checkpoint(9, 10**9))]
    assert after_first == ["later", "latest"]


async def test_an_expected_version_below_minus_one_is_refused(db: Database) -> None:
    store = EventStore(db)
    async with db.transaction("t1") as conn:
        with pytest.raises(ValueError, match="expected_version"):
            await store.append(conn, "s", -2, [event("x")])


async def test_the_global_feed_never_shows_a_streams_next_version_before_the_previous_one(db: Database) -> None:
    """Writer A takes its transaction id first (it writes something else), writer B then appends v1 and
    commits, and only then does A append v2. By transaction id alone, v2 would come first."""
    store = EventStore(db)
    for attempt in range(10):
        stream = f"s{attempt}"
        async with db.connection() as conn_a, conn_a.transaction():
            await conn_a.execute("SELECT set_config('mnemesh.tenant_id', 't1', true)")
            await conn_a.execute("SELECT pg_current_xact_id()")  # A's id is now older than B's
            async with db.transaction("t1") as conn_b:
                await store.append(conn_b, stream, 0, [event("v1, by the younger transaction")])
            await store.append(conn_a, stream, ANY_VERSION, [event("v2, by the older transaction")])
        feed = [e.version for e in await feed_once_settled(store, {stream}, 2)]
        assert feed == [1, 2]
    # Read one event at a time, resuming from each checkpoint: same order, nothing twice.
    resumed, checkpoint = [], Checkpoint()
    while batch := await store.read_all(checkpoint, limit=1):
        resumed.append((batch[0].stream_id, batch[0].version))
        checkpoint = batch[0].checkpoint
    for attempt in range(10):
        assert [v for s, v in resumed if s == f"s{attempt}"] == [1, 2]
    assert len(resumed) == len(set(resumed)) == 20


async def test_many_writers_appending_at_any_version_to_one_stream_all_succeed_gaplessly(db: Database) -> None:
    store = EventStore(db)
    sent: list[str] = []

    async def writer(n: int) -> None:
        for i in range(5):
            e = event(f"{n}-{i}")
            async with db.transaction("t1") as conn:
                await store.append(conn, "shared", ANY_VERSION, [e])
            sent.append(e.event_id)

    with anyio.fail_after(60):
        await asyncio.gather(*(writer(n) for n in range(20)))
    stored = await store.read_stream("shared")
    assert [e.version for e in stored] == list(range(1, 101))
    assert sorted(e.envelope.event_id for e in stored) == sorted(sent)


async def test_an_append_wakes_the_followers_of_its_stream_and_not_the_others(db: Database) -> None:
    store = EventStore(db, stream_poll_seconds=30)  # only NOTIFY can wake a follower in time
    notifier = store.notifier
    notifier.mark()
    with anyio.fail_after(10):
        await notifier.listening.wait()
    mark_x, mark_y = notifier.mark("x"), notifier.mark("y")
    async with db.transaction("t1") as conn:
        await store.append(conn, "y", 0, [event("for y")])
    with anyio.fail_after(10):
        await notifier.wait(mark_y, 30, "y")  # woken by the NOTIFY naming y
    assert notifier.mark("x") == mark_x, "an append to y woke the followers of x"
    got = []

    async def follow() -> None:
        async for stored in store.subscribe_stream("x"):
            got.append(stored.version)
            return

    with anyio.fail_after(10):  # far below the 30 s poll
        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            await anyio.sleep(0.2)  # let the follower reach its wait; either way it must see the append
            async with db.transaction("t1") as conn:
                await store.append(conn, "x", 0, [event("for x")])
    assert got == [1]
    await store.close()


async def test_append_many_appends_to_many_streams_at_once_and_numbers_each_gaplessly(db: Database) -> None:
    store = EventStore(db)
    async with db.transaction("t1") as conn:
        await store.append(conn, "old", 0, [event("o1")])
    async with db.transaction("t1") as conn:
        versions = await store.append_many(conn, [("new-a", 0, [event("a1"), event("a2")]), ("new-b", 0, [event("b1")]),
                                                  ("old", ANY_VERSION, [event("o2")])])
    assert versions == [2, 1, 2]
    assert [(e.version, e.envelope.message().text) for e in await store.read_stream("new-a")] == [(1, "a1"), (2, "a2")]
    assert [e.envelope.message().text for e in await store.read_stream("old")] == ["o1", "o2"]
    feed = await feed_once_settled(store, {"new-a", "new-b", "old"}, 5)
    assert [e.envelope.message().text for e in feed] == ["o1", "a1", "a2", "b1", "o2"]  # argument order


async def test_append_many_appends_nothing_when_one_stream_is_not_where_its_writer_expects(db: Database) -> None:
    store = EventStore(db)
    async with db.transaction("t1") as conn:
        await store.append(conn, "taken", 0, [event("t1")])
    with pytest.raises(Conflict) as caught:
        async with db.transaction("t1") as conn:
            await store.append_many(conn, [("fresh", 0, [event("f1")]), ("taken", 0, [event("t2")])])
            assert await conn.fetchval("SELECT count(*) FROM events WHERE stream_id = 'fresh'") == 0
    assert caught.value.field == "expected_version" and "taken is at version 1" in caught.value.reason
    with pytest.raises(ValueError, match="each stream once"):
        async with db.transaction("t1") as conn:
            await store.append_many(conn, [("x", 0, [event("1")]), ("x", 1, [event("2")])])

"""Transactional outbox and relay against real PostgreSQL and Redis."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from libs.db import Database
from libs.events import Envelope
from libs.events.bus import EventBus
from libs.idempotency import idempotent
from libs.outbox import Outbox, OutboxRelay
from libs.protogen.mnemesh.v1 import events_pb2

pytestmark = pytest.mark.integration


def envelope(text: str) -> Envelope:
    return Envelope.wrap(events_pb2.SessionMessageAppended(device_id="d", role="user", text=text),
                         event_type="session.message_appended", tenant_id="t1")


@pytest.fixture
async def tables(db: Database, as_owner) -> Database:
    await as_owner("CREATE TABLE notes (id serial PRIMARY KEY, text text NOT NULL);"
                   " CREATE TABLE effects (event_id uuid NOT NULL)")
    return db


@contextlib.asynccontextmanager
async def relay_of(outbox: Outbox, bus: EventBus, **options) -> AsyncIterator[OutboxRelay]:
    relay = OutboxRelay(outbox, bus, **options)
    try:
        yield relay
    finally:
        await relay.resign()


async def write_note(db: Database, outbox: Outbox, stream: str, text: str, *, fail: bool = False) -> Envelope:
    e = envelope(text)
    async with db.transaction("t1") as conn:
        await conn.execute("INSERT INTO notes (text) VALUES ($1)", text)
        await outbox.add(conn, e, stream=stream)
        if fail:
            raise ValueError("the change failed after its event was added")
    return e


async def consume_until(db: Database, redis_url: str, stream: str, expected: int) -> list[str]:
    consumer = EventBus(redis_url, consumer_name="consumer")

    async def effect(env: Envelope, conn) -> None:
        await conn.execute("INSERT INTO effects (event_id) VALUES ($1)", env.event_id)

    consumer.subscribe(stream, "g", idempotent(db, "g", effect))
    await consumer.start()
    try:
        with anyio.fail_after(20):
            while True:
                async with db.connection() as conn:
                    rows = await conn.fetch("SELECT event_id::text FROM effects")
                client = await consumer.redis()
                (group,) = await client.xinfo_groups(stream)
                last = await client.xrevrange(stream, count=1)
                read_all = bool(last) and group["last-delivered-id"] == last[0][0]
                if len(rows) >= expected and read_all and not group["pending"]:
                    return [r[0] for r in rows]
                await anyio.sleep(0.05)
    finally:
        await consumer.stop()


async def test_an_event_committed_while_the_relay_was_down_is_delivered_when_it_restarts(
    tables: Database, redis_url: str, streams: str
) -> None:
    outbox, stream = Outbox(tables), f"{streams}.notes"
    written = await write_note(tables, outbox, stream, "committed, relay down")
    assert await outbox.pending() == 1
    bus = EventBus(redis_url, consumer_name="relay")
    async with relay_of(outbox, bus) as relay:
        assert await relay.publish_pending() == 1
    await bus.stop()
    assert await outbox.pending() == 0
    assert await consume_until(tables, redis_url, stream, 1) == [written.event_id]


async def test_withholding_publication_waits_for_the_round_in_flight_and_holds_back_the_next(
    tables: Database, redis_url: str, streams: str
) -> None:
    """What a forget relies on: once its transaction (which deleted rows, then withheld) commits, every copy a
    relay read before is on the stream, and no relay round reads the rows again."""
    outbox, stream = Outbox(tables), f"{streams}.notes"
    await write_note(tables, outbox, stream, "read by the relay before it was deleted")
    bus = EventBus(redis_url, consumer_name="relay")
    publishing, release = asyncio.Event(), asyncio.Event()
    publish = bus.publish_fenced_batch

    async def slow_publish(batch, fence):
        publishing.set()
        await release.wait()
        return await publish(batch, fence)

    bus.publish_fenced_batch = slow_publish

    async def forget() -> int:
        async with tables.system_transaction() as conn:
            await conn.execute("DELETE FROM outbox")
            await outbox.withhold(conn)
        return await (await bus.redis()).xlen(stream)

    async with relay_of(outbox, bus) as relay:
        in_flight = asyncio.create_task(relay.publish_pending())
        await publishing.wait()  # the round has read the row and is about to publish it
        forgetting = asyncio.create_task(forget())
        await asyncio.sleep(0.3)
        assert not forgetting.done()  # it waits for the round in flight
        release.set()
        assert await in_flight == 1
        assert await forgetting == 1  # by its commit the copy was on the stream, where a purge finds it
        async with tables.system_transaction() as conn:
            await outbox.withhold(conn)
            held_back = asyncio.create_task(relay.publish_pending())
            await asyncio.sleep(0.3)
            assert not held_back.done()  # a new round waits for the transaction to end
        assert await held_back == 0
    await bus.stop()


async def test_a_relay_killed_between_publish_and_mark_republishes_and_the_effect_happens_once(
    tables: Database, redis_url: str, database_url: str, schema: str, streams: str
) -> None:
    outbox, stream = Outbox(tables), f"{streams}.notes"
    written = await write_note(tables, outbox, stream, "published, never marked")
    doomed = subprocess.run([sys.executable, str(Path(__file__).with_name("relay_process.py")), redis_url,
                             database_url, schema, "doomed"], capture_output=True, text=True, timeout=60)
    assert doomed.returncode == -signal.SIGKILL and f"published {written.event_id}" in doomed.stdout
    assert await outbox.pending() == 1  # the mark died with the relay

    restarted = EventBus(redis_url, consumer_name="relay-2")
    async with relay_of(outbox, restarted) as relay:
        with anyio.fail_after(20):
            while not await relay.publish_pending():  # leads once the dead relay's lock is gone
                await anyio.sleep(0.1)
    length = await (await restarted.redis()).xlen(stream)
    await restarted.stop()
    assert length == 2  # delivered twice: at least once
    assert await outbox.pending() == 0
    assert await consume_until(tables, redis_url, stream, 1) == [written.event_id]  # effect exactly once


async def test_a_row_that_no_longer_parses_is_dead_lettered_and_does_not_block_the_rest(
    tables: Database, redis_url: str, streams: str
) -> None:
    outbox, stream = Outbox(tables), f"{streams}.notes"
    # Written before a restart (another Outbox): the relay reads its fields back.
    broken = await write_note(tables, Outbox(tables), stream, "from an older schema")
    async with tables.system_transaction() as conn:
        await conn.execute("UPDATE outbox SET fields = fields || '{\"schema_version\": \"0\"}' WHERE event_id = $1",
                           broken.event_id)
    fine = await write_note(tables, outbox, stream, "current")
    bus = EventBus(redis_url, consumer_name="relay")
    async with relay_of(outbox, bus) as relay:
        assert await relay.publish_pending() == 2
    client = await bus.redis()
    published = [f[b"event_id"].decode() for _, f in await client.xrange(stream)]
    dead = await client.xrange(f"{stream}.dead")
    await bus.stop()
    assert published == [fine.event_id]
    assert dead[0][1][b"original.event_id"].decode() == broken.event_id
    assert json.loads(dead[0][1][b"dead.reason"])["field"] == "schema_version"
    assert await outbox.pending() == 0


async def test_a_rolled_back_change_publishes_no_event(tables: Database, redis_url: str, streams: str) -> None:
    outbox, stream = Outbox(tables), f"{streams}.notes"
    with pytest.raises(ValueError):
        await write_note(tables, outbox, stream, "never happened", fail=True)
    kept = await write_note(tables, outbox, stream, "happened")
    bus = EventBus(redis_url, consumer_name="relay")
    async with relay_of(outbox, bus) as relay:
        assert await relay.publish_pending() == 1
    entries = await (await bus.redis()).xrange(stream)
    await bus.stop()
    assert [fields[b"event_id"].decode() for _, fields in entries] == [kept.event_id]


async def test_the_running_relay_publishes_a_new_commit_without_polling_delay(
    tables: Database, redis_url: str, streams: str
) -> None:
    outbox, stream = Outbox(tables), f"{streams}.notes"
    bus = EventBus(redis_url, consumer_name="relay")
    relay = OutboxRelay(outbox, bus, poll_seconds=30)  # only NOTIFY can wake it in time
    client = await bus.redis()
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        with anyio.fail_after(10):
            await relay.listening.wait()  # its first sweep is done; from now on only NOTIFY can wake it
        await write_note(tables, outbox, stream, "wake up")
        with anyio.fail_after(10):  # far below the 30 s poll
            while not await client.exists(stream):
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()
    length = await client.xlen(stream)
    await bus.stop()
    assert length == 1


async def test_housekeeping_purges_old_published_rows_and_processed_ids(
    tables: Database, redis_url: str, streams: str
) -> None:
    from datetime import timedelta

    from libs.housekeeping import tidy

    outbox, stream = Outbox(tables), f"{streams}.notes"
    await write_note(tables, outbox, stream, "old news")
    bus = EventBus(redis_url, consumer_name="relay")
    async with relay_of(outbox, bus) as relay:
        await relay.publish_pending()
        async with tables.system_transaction() as conn:
            await conn.execute("UPDATE outbox SET published_at = now() - interval '2 days'")
            await conn.execute("INSERT INTO processed_events (consumer, event_id, processed_at) VALUES"
                               " ('g', gen_random_uuid(), now() - interval '8 days'), ('g', gen_random_uuid(), now())")
        await tidy(bus, relay, tables, processed_retention=timedelta(days=7))
    await bus.stop()
    async with tables.system_transaction() as conn:
        outbox_rows = await conn.fetchval("SELECT count(*) FROM outbox")
        processed = await conn.fetchval("SELECT count(*) FROM processed_events")
    assert (outbox_rows, processed) == (0, 1)


async def test_three_relay_processes_keep_every_aggregates_order_when_the_leader_is_killed(
    tables: Database, redis_url: str, database_url: str, schema: str, streams: str
) -> None:
    outbox, stream = Outbox(tables), f"{streams}.ordered"
    aggregates, versions = 4, 15
    for version in range(1, versions + 1):  # each aggregate's versions are committed in order
        for aggregate in range(aggregates):
            await write_note(tables, outbox, stream, f"{aggregate}:{version}")
    script = str(Path(__file__).with_name("relay_process.py"))
    relays = [subprocess.Popen([sys.executable, script, redis_url, database_url, schema, "steady"],
                               stdout=subprocess.PIPE, text=True) for _ in range(3)]
    leaders: asyncio.Queue[subprocess.Popen] = asyncio.Queue()
    published = 0

    async def watch(proc: subprocess.Popen) -> None:
        nonlocal published
        while line := await asyncio.to_thread(proc.stdout.readline):
            if line.strip() == "leading":
                await leaders.put(proc)
            elif line.startswith("published"):
                published += 1

    try:
        async with anyio.create_task_group() as tg:
            for proc in relays:
                tg.start_soon(watch, proc)
            with anyio.fail_after(30):
                first = await leaders.get()
                while published < 20:  # well into the outbox
                    await anyio.sleep(0.01)
            first.kill()  # SIGKILL mid-batch: what it published is not marked
            with anyio.fail_after(30):
                second = await leaders.get()
                while await outbox.pending():
                    await anyio.sleep(0.05)
            assert second is not first
            for proc in relays:
                proc.kill()
    finally:
        for proc in relays:
            proc.kill()
            proc.wait()
            proc.stdout.close()
    client = await tables_bus_client(redis_url)
    entries = await client.xrange(stream)
    await client.aclose()
    payloads = [json.loads(fields[b"payload"])["text"] for _, fields in entries]
    seen: dict[str, list[int]] = {}
    for text in payloads:
        aggregate, version = text.split(":")
        if int(version) not in seen.setdefault(aggregate, []):
            seen[aggregate].append(int(version))  # first appearances; republished ones repeat older versions
    assert seen == {str(a): list(range(1, versions + 1)) for a in range(aggregates)}


async def tables_bus_client(redis_url: str):
    import redis.asyncio

    return redis.asyncio.from_url(redis_url)


class HangingBus(EventBus):
    """Its first fenced publish hangs until released, as an XADD stuck on a slow network would."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hanging, self.release = asyncio.Event(), asyncio.Event()

    async def publish_fenced_batch(self, items: list[tuple[Envelope, str]], fence) -> int:
        if not self.hanging.is_set():
            self.hanging.set()
            await self.release.wait()
        return await super().publish_fenced_batch(items, fence)


async def test_a_deposed_leader_whose_publish_hung_cannot_publish_after_its_successor(
    tables: Database, redis_url: str, database_url: str, streams: str
) -> None:
    import asyncpg

    from libs.events.bus import Fenced

    outbox, stream = Outbox(tables), f"{streams}.fenced"
    first = await write_note(tables, outbox, stream, "v1")
    await write_note(tables, outbox, stream, "v2")
    hung_bus, bus = HangingBus(redis_url, consumer_name="old"), EventBus(redis_url, consumer_name="new")
    async with relay_of(outbox, hung_bus) as old, relay_of(outbox, bus) as new:
        hung = asyncio.create_task(old.publish_pending())
        with anyio.fail_after(10):
            await hung_bus.hanging.wait()
        # The old leader's database session ends (a network partition, say) while its XADD hangs.
        admin = await asyncpg.connect(database_url)
        await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
                            " AND granted AND pid <> pg_backend_pid()"
                            " AND objid = (hashtext('outbox:' || $1))::oid", tables.schema)
        await admin.close()
        with anyio.fail_after(10):
            while not await new.publish_pending():
                await anyio.sleep(0.05)
        assert new.term > old.term
        hung_bus.release.set()
        with anyio.fail_after(10):
            await hung  # the fence refuses its XADD: it resigns instead of publishing
        assert not old.leading.is_set()
        with pytest.raises(Fenced):
            await hung_bus.publish(envelope("late"), stream=stream, fence=(old.fence_key, old.term))
    client = await bus.redis()
    texts = [json.loads(f[b"payload"])["text"] for _, f in await client.xrange(stream)]
    await bus.stop()
    await hung_bus.stop()
    assert texts == ["v1", "v2"], "the deposed leader published after its successor"
    assert first.event_id


async def test_add_many_records_every_envelope_in_order_and_they_are_published_in_that_order(
        tables: Database, redis_url: str, unique: str) -> None:
    outbox, bus = Outbox(tables), EventBus(redis_url, consumer_name="relay")
    stream = f"{unique}.many"
    sent = [envelope(f"m{i}") for i in range(5)]
    async with tables.transaction("t1") as conn:
        await outbox.add_many(conn, sent, stream=stream)
    async with relay_of(outbox, bus) as relay:
        assert await relay.publish_pending() == 5
    entries = await (await bus.redis()).xrange(bus.stream_name(stream))
    assert [Envelope.from_fields({k.decode(): v.decode() for k, v in f.items()}).event_id for _, f in entries] == \
        [e.event_id for e in sent]
    await bus.stop()


async def test_a_redis_that_does_not_know_the_fenced_script_gets_it_and_every_event_goes_out_once_in_order(
        tables: Database, redis_url: str, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The relay publishes by the script's digest (EVALSHA); a Redis without the script (restarted, flushed)
    answers NOSCRIPT, and the relay loads it and publishes the batch. Here the script text is new to Redis."""
    from libs.events import bus as bus_module

    monkeypatch.setattr(bus_module, "_FENCED_XADDS", bus_module._FENCED_XADDS + f"\n-- {unique}\n")
    outbox, bus = Outbox(tables), EventBus(redis_url, consumer_name="relay")
    stream = f"{unique}.noscript"
    sent = [envelope(f"m{i}") for i in range(7)]
    async with tables.transaction("t1") as conn:
        await outbox.add_many(conn, sent, stream=stream)
    client = await bus.redis()
    digest = __import__("hashlib").sha1(bus_module._FENCED_XADDS.encode()).hexdigest()
    assert await client.script_exists(digest) == [False]
    async with relay_of(outbox, bus) as relay:
        assert await relay.publish_pending() == 7
        assert await relay.publish_pending() == 0
    assert await client.script_exists(digest) == [True]
    entries = await client.xrange(bus.stream_name(stream))
    await bus.stop()
    assert [Envelope.from_fields({k.decode(): v.decode() for k, v in f.items()}).event_id for _, f in entries] == \
        [e.event_id for e in sent]


async def test_rows_this_process_wrote_are_published_without_reading_them_back_and_others_are_read(
        tables: Database, redis_url: str, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """While its relay leads, the relay takes the envelope of a row its own process wrote from memory; a row
    another process wrote (or one this process no longer holds: at most Outbox.KNOWN, or written while it
    did not lead) is read back. Either way every committed row goes out once, in id order, and nothing
    rolled back does."""
    monkeypatch.setattr(Outbox, "KNOWN", 4)
    outbox, bus = Outbox(tables), EventBus(redis_url, consumer_name="relay")
    stream = f"{unique}.known"
    before = envelope("before the relay led")
    async with tables.transaction("t1") as conn:
        await outbox.add(conn, before, stream=stream)
    relay = OutboxRelay(outbox, bus)
    assert await relay.publish_pending() == 1 and relay.read_back == 1
    sent = [before, envelope("first, forgotten")]
    async with tables.transaction("t1") as conn:
        await outbox.add(conn, sent[1], stream=stream)
    elsewhere = envelope("another process")
    async with tables.transaction("t1") as conn:
        await Outbox(tables).add(conn, elsewhere, stream=stream)
    sent.append(elsewhere)
    with pytest.raises(ValueError):
        async with tables.transaction("t1") as conn:
            await outbox.add_many(conn, [envelope("rolled back")], stream=stream)
            raise ValueError("the change failed")
    more = [envelope(f"m{i}") for i in range(3)]
    async with tables.transaction("t1") as conn:
        await outbox.add_many(conn, more, stream=stream)
    sent += more
    assert await relay.publish_pending() == 5
    assert relay.read_back == 3  # and the other process's row, and the first (pushed out by the limit of 4)
    await relay.resign()
    assert not outbox.keeping and not outbox.known([1])
    entries = await (await bus.redis()).xrange(bus.stream_name(stream))
    await bus.stop()
    assert [f[b"event_id"].decode() for _, f in entries] == [e.event_id for e in sent]
    assert [dict(f) for _, f in entries][3] == {k.encode(): v.encode() for k, v in more[0].to_fields().items()}
    assert await outbox.pending() == 0

"""Transactional outbox and relay against real PostgreSQL and Redis."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
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
async def tables(db: Database) -> Database:
    async with db.connection() as conn:
        await conn.execute("CREATE TABLE notes (id serial PRIMARY KEY, text text NOT NULL)")
        await conn.execute("CREATE TABLE effects (event_id uuid NOT NULL)")
    return db


async def write_note(db: Database, outbox: Outbox, stream: str, text: str, *, fail: bool = False) -> Envelope:
    e = envelope(text)
    async with db.connection() as conn, conn.transaction():
        await conn.execute("INSERT INTO notes (text) VALUES (%s)", [text])
        await outbox.add(conn, e, stream=stream)
        if fail:
            raise ValueError("the change failed after its event was added")
    return e


async def consume_until(db: Database, redis_url: str, stream: str, expected: int) -> list[str]:
    consumer = EventBus(redis_url, consumer_name="consumer")

    async def effect(env: Envelope, conn) -> None:
        await conn.execute("INSERT INTO effects (event_id) VALUES (%s)", [env.event_id])

    consumer.subscribe(stream, "g", idempotent(db, "g", effect))
    await consumer.start()
    try:
        with anyio.fail_after(20):
            while True:
                async with db.connection() as conn:
                    rows = await (await conn.execute("SELECT event_id::text FROM effects")).fetchall()
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
    assert await OutboxRelay(outbox, bus).publish_pending() == 1
    await bus.stop()
    assert await outbox.pending() == 0
    assert await consume_until(tables, redis_url, stream, 1) == [written.event_id]


async def test_a_relay_killed_between_publish_and_mark_republishes_and_the_effect_happens_once(
    tables: Database, redis_url: str, database_url: str, schema: str, streams: str
) -> None:
    outbox, stream = Outbox(tables), f"{streams}.notes"
    written = await write_note(tables, outbox, stream, "published, never marked")
    doomed = subprocess.run([sys.executable, str(Path(__file__).with_name("relay_process.py")), redis_url,
                             database_url, schema], capture_output=True, text=True, timeout=60)
    assert doomed.returncode == -signal.SIGKILL and f"published {written.event_id}" in doomed.stdout
    assert await outbox.pending() == 1  # the mark died with the relay

    restarted = EventBus(redis_url, consumer_name="relay-2")
    relay = OutboxRelay(outbox, restarted)
    with anyio.fail_after(20):
        while not await relay.publish_pending():  # the dead relay's lease runs out after a second
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
    broken = await write_note(tables, outbox, stream, "from an older schema")
    async with tables.connection() as conn:
        await conn.execute("UPDATE outbox SET fields = fields || '{\"schema_version\": \"0\"}' WHERE event_id = %s",
                           [broken.event_id])
    fine = await write_note(tables, outbox, stream, "current")
    bus = EventBus(redis_url, consumer_name="relay")
    assert await OutboxRelay(outbox, bus).publish_pending() == 2
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
    assert await OutboxRelay(outbox, bus).publish_pending() == 1
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
    relay = OutboxRelay(outbox, bus)
    await relay.publish_pending()
    async with tables.connection() as conn:
        await conn.execute("UPDATE outbox SET published_at = now() - interval '2 days'")
        await conn.execute("INSERT INTO processed_events (consumer, event_id, processed_at) VALUES"
                           " ('g', gen_random_uuid(), now() - interval '8 days'), ('g', gen_random_uuid(), now())")
    await tidy(bus, relay, tables, processed_retention=timedelta(days=7))
    await bus.stop()
    async with tables.connection() as conn:
        outbox_rows = (await (await conn.execute("SELECT count(*) FROM outbox")).fetchone())[0]
        processed = (await (await conn.execute("SELECT count(*) FROM processed_events")).fetchone())[0]
    assert (outbox_rows, processed) == (0, 1)

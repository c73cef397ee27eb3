"""Transactional outbox and relay against real PostgreSQL and Redis."""

from __future__ import annotations

import anyio
import pytest

from libs.db import Database
from libs.events import Envelope
from libs.events.bus import EventBus
from libs.idempotency import idempotent
from libs.outbox import Outbox, OutboxRelay
from libs.protogen.mnemesh.v1 import events_pb2

pytestmark = pytest.mark.integration


class RelayCrash(Exception):
    """Stands for the relay process dying right after the stream accepted an entry."""


class CrashAfterPublish(EventBus):
    async def publish(self, envelope: Envelope, stream: str | None = None) -> str:
        await super().publish(envelope, stream)
        raise RelayCrash


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
                entries = await (await consumer.redis()).xlen(stream)
                pending = (await (await consumer.redis()).xpending(stream, "g"))["pending"]
                if len(rows) >= expected and entries and not pending:
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
    tables: Database, redis_url: str, streams: str
) -> None:
    outbox, stream = Outbox(tables), f"{streams}.notes"
    written = await write_note(tables, outbox, stream, "published, never marked")
    crashing = CrashAfterPublish(redis_url, consumer_name="relay-1")
    with pytest.raises(RelayCrash):
        await OutboxRelay(outbox, crashing).publish_pending()
    await crashing.stop()
    assert await outbox.pending() == 1  # the mark was lost with the relay

    restarted = EventBus(redis_url, consumer_name="relay-2")
    assert await OutboxRelay(outbox, restarted).publish_pending() == 1
    client = await restarted.redis()
    assert await client.xlen(stream) == 2  # delivered twice: at least once
    await restarted.stop()
    assert await consume_until(tables, redis_url, stream, 1) == [written.event_id]  # effect exactly once


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
        await anyio.sleep(0)  # let the relay LISTEN before the commit
        with anyio.fail_after(10):
            while await outbox.pending() or not await client.exists(stream):
                if not await client.exists(stream) and not await outbox.pending():
                    await write_note(tables, outbox, stream, "wake up")
                await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    length = await client.xlen(stream)
    await bus.stop()
    assert length == 1

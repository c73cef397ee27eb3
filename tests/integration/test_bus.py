"""The Redis Streams bus against real Redis and PostgreSQL: reclaim, dead letters, idempotency."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import anyio
import asyncpg
import pytest
import redis.asyncio

from libs.db import Database
from libs.events import Envelope
from libs.events.bus import EventBus
from libs.idempotency import idempotent
from libs.protogen.mnemesh.v1 import events_pb2

pytestmark = pytest.mark.integration


def envelope(text: str, tenant: str = "t1") -> Envelope:
    return Envelope.wrap(events_pb2.SessionMessageAppended(device_id="d", role="user", text=text),
                         event_type="session.message_appended", tenant_id=tenant)


async def effects(db: Database) -> list[tuple[str, str]]:
    async with db.connection() as conn:
        return [tuple(r) for r in await conn.fetch("SELECT event_id::text, handled_by FROM effects ORDER BY handled_by")]


@pytest.fixture
async def effects_table(db: Database, as_owner) -> Database:
    await as_owner("CREATE TABLE effects (event_id uuid NOT NULL, handled_by text NOT NULL)")
    return db


async def wait_for(predicate, timeout: float = 20.0, step: float = 0.05):
    with anyio.fail_after(timeout):
        while not (result := await predicate()):
            await anyio.sleep(step)
    return result


async def test_an_entry_left_by_a_killed_consumer_is_reclaimed_and_takes_effect_once(
    redis_url: str, database_url: str, schema: str, effects_table: Database, streams: str
) -> None:
    stream, group = f"{streams}.work", "workers"
    script = Path(__file__).with_name("consumer_process.py")
    victim = subprocess.Popen([sys.executable, str(script), redis_url, database_url, schema, stream, group, "victim"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert (await asyncio.to_thread(victim.stdout.readline)).strip() == "ready"
        publisher = EventBus(redis_url, consumer_name="publisher")
        sent = envelope("do it once")
        await publisher.publish(sent, stream=stream)
        line = await asyncio.wait_for(asyncio.to_thread(victim.stdout.readline), 20)
        assert line.strip() == f"handling {sent.event_id}"
    finally:
        victim.kill()  # mid-handler: no ack, no commit
        victim.wait()
        victim.stdout.close()

    rescuer = EventBus(redis_url, consumer_name="rescuer", min_idle_ms=300)

    async def work(env: Envelope, conn) -> None:
        await conn.execute("INSERT INTO effects (event_id, handled_by) VALUES ($1, 'rescuer')", env.event_id)

    rescuer.subscribe(stream, group, idempotent(effects_table, group, work))
    await rescuer.start()
    try:
        rows = await wait_for(lambda: effects(effects_table))
        client = await rescuer.redis()
        await wait_for(lambda: _no_pending(client, stream, group))
    finally:
        await rescuer.stop()
        await publisher.stop()
    assert rows == [(sent.event_id, "rescuer")]  # the victim's uncommitted effect is gone; one effect in all


async def _no_pending(client: redis.asyncio.Redis, stream: str, group: str) -> bool:
    return (await client.xpending(stream, group))["pending"] == 0


async def test_a_poison_message_is_dead_lettered_after_n_deliveries_while_others_flow(
    redis_url: str, effects_table: Database, streams: str
) -> None:
    stream, group = f"{streams}.mixed", "g"
    bus = EventBus(redis_url, consumer_name="c1", max_deliveries=3, min_idle_ms=200)

    async def handle(env: Envelope, conn) -> None:
        if env.message().text == "poison":
            raise RuntimeError("cannot digest this")
        await conn.execute("INSERT INTO effects (event_id, handled_by) VALUES ($1, 'c1')", env.event_id)

    bus.subscribe(stream, group, idempotent(effects_table, group, handle))
    await bus.start()
    try:
        good = [envelope(f"good {i}") for i in range(5)]
        poison = envelope("poison")
        await bus.publish(good[0], stream=stream)
        await bus.publish(poison, stream=stream)
        for e in good[1:]:
            await bus.publish(e, stream=stream)
        client = await bus.redis()
        dead = await wait_for(lambda: client.xrange(f"{stream}.dead"))
        await wait_for(lambda: _no_pending(client, stream, group))
        done = await effects(effects_table)
    finally:
        await bus.stop()
    assert sorted(e for e, _ in done) == sorted(e.event_id for e in good)
    (_, fields), = dead
    reason = json.loads(fields[b"dead.reason"])
    assert fields[b"original.event_id"].decode() == poison.event_id
    assert fields[b"dead.deliveries"] == b"3"
    assert reason["error_type"] == "RuntimeError" and "cannot digest this" in reason["reason"]


@pytest.mark.parametrize(
    ("fields", "bad_field"),
    [
        ({"hello": "world"}, "event_id"),
        ({"event_id": "x", "event_type": "nope", "schema_version": "1", "tenant_id": "t", "occurred_at": "2026-01-01",
          "payload": "{}"}, "event_type"),
        ({"blob": b"\xff\xfe\x00"}, "blob"),
        ({"data": "x", "headers": "not a dict"}, "event_id"),
        # a well-formed event but for one field's name
        ({**{k.encode(): v.encode() for k, v in envelope("bad name").to_fields().items()}, b"x\xff": b"1"},
         "x\ufffd"),
    ],
)
async def test_a_malformed_message_goes_to_the_dead_letter_stream_with_its_reason_and_the_consumer_goes_on(
    redis_url: str, effects_table: Database, streams: str, fields: dict, bad_field: str
) -> None:
    stream, group = f"{streams}.bad", "g"
    bus = EventBus(redis_url, consumer_name="c1", min_idle_ms=200)

    async def handle(env: Envelope, conn) -> None:
        await conn.execute("INSERT INTO effects (event_id, handled_by) VALUES ($1, 'c1')", env.event_id)

    bus.subscribe(stream, group, idempotent(effects_table, group, handle))
    await bus.start()
    try:
        client = await bus.redis()
        await client.xadd(stream, fields)
        after = envelope("fine")
        await bus.publish(after, stream=stream)
        dead = await wait_for(lambda: client.xrange(f"{stream}.dead"))
        done = await wait_for(lambda: effects(effects_table))
    finally:
        await bus.stop()
    reason = json.loads(dead[0][1][b"dead.reason"])
    assert reason["error_type"] == "malformed_event" and reason["field"] == bad_field and reason["hint"]
    assert done == [(after.event_id, "c1")]


async def test_a_redelivered_event_takes_effect_once(redis_url: str, effects_table: Database, streams: str) -> None:
    stream, group = f"{streams}.dup", "g"
    bus = EventBus(redis_url, consumer_name="c1")
    handled = asyncio.Event()

    async def handle(env: Envelope, conn) -> None:
        await conn.execute("INSERT INTO effects (event_id, handled_by) VALUES ($1, 'c1')", env.event_id)

    wrapped = idempotent(effects_table, group, handle)

    async def counting(env: Envelope) -> None:
        await wrapped(env)
        handled.set()

    bus.subscribe(stream, group, counting)
    await bus.start()
    try:
        same = envelope("twice")
        for _ in range(3):
            handled.clear()
            await bus.publish(same, stream=stream)  # the same event id, as a republishing relay would
            with anyio.fail_after(10):
                await handled.wait()
    finally:
        await bus.stop()
    assert await effects(effects_table) == [(same.event_id, "c1")]


async def test_an_event_id_marks_an_event_done_for_its_own_tenant_only(effects_table: Database) -> None:
    """Producers choose event ids: the same id in another tenant is another event; a mark from before marks were
    per tenant (tenant '') counts for every tenant."""
    async def handle(env: Envelope, conn) -> None:
        await conn.execute("INSERT INTO effects (event_id, handled_by) VALUES ($1, $2)", env.event_id, env.tenant_id)

    wrapped = idempotent(effects_table, "g", handle)
    first, legacy = envelope("t1's event"), envelope("marked before tenants were kept")
    twin = dataclasses.replace(envelope("t2's event", tenant="t2"), event_id=first.event_id)
    async with effects_table.system_transaction() as conn:  # as the code before marks were per tenant
        await conn.execute("INSERT INTO processed_events (consumer, event_id) VALUES ('g', $1)", legacy.event_id)
    for env in (first, twin, first, twin, legacy):
        await wrapped(env)
    assert sorted(await effects(effects_table)) == sorted([(first.event_id, "t1"), (first.event_id, "t2")])


async def test_trimming_never_removes_entries_a_group_has_not_acknowledged(
    redis_url: str, effects_table: Database, streams: str
) -> None:
    stream, group = f"{streams}.trim", "slow"
    bus = EventBus(redis_url, consumer_name="c1", maxlen=5, retention_ms=0)
    gate = asyncio.Event()
    seen: list[str] = []

    async def handle(env: Envelope) -> None:
        seen.append(env.event_id)
        if len(seen) == 3:
            await gate.wait()  # the third event is being handled: it and all after it are still needed

    bus.subscribe(stream, group, handle)
    await bus.start()
    try:
        sent = [envelope(f"n{i}") for i in range(20)]
        for e in sent:
            await bus.publish(e, stream=stream)
        with anyio.fail_after(10):
            while len(seen) < 3:
                await anyio.sleep(0.02)
        client = await bus.redis()
        await bus.trim()
        kept = [fields[b"event_id"].decode() for _, fields in await client.xrange(stream)]
        assert sent[2].event_id in kept and kept == [e.event_id for e in sent][-len(kept):]
        gate.set()
        with anyio.fail_after(10):
            while len(seen) < 20 or (await client.xpending(stream, group))["pending"]:
                await anyio.sleep(0.02)
        await bus.trim()
        remaining = await client.xlen(stream)
    finally:
        await bus.stop()
    assert seen == [e.event_id for e in sent]
    assert remaining < 20  # once everything is acknowledged, the stream shrinks


async def test_trimming_keeps_entries_younger_than_the_retention_even_when_acknowledged(
    redis_url: str, streams: str
) -> None:
    stream = f"{streams}.young"
    bus = EventBus(redis_url, consumer_name="c1", maxlen=5, retention_ms=3_600_000)
    for i in range(20):
        await bus.publish(envelope(f"n{i}"), stream=stream)
    removed = await bus.trim()
    length = await (await bus.redis()).xlen(stream)
    await bus.stop()
    assert (removed.get(stream, 0), length) == (0, 20)


async def test_a_handler_whose_infrastructure_is_away_is_retried_past_max_deliveries_not_dead_lettered(
    redis_url: str, effects_table: Database, streams: str
) -> None:
    stream, group = f"{streams}.outage", "g"
    bus = EventBus(redis_url, consumer_name="c1", max_deliveries=2, min_idle_ms=100)
    attempts = 0

    async def handle(env: Envelope, conn) -> None:
        nonlocal attempts
        attempts += 1
        if attempts <= 4:
            raise asyncpg.CannotConnectNowError("the database system is starting up")  # SQLSTATE 57P03
        await conn.execute("INSERT INTO effects (event_id, handled_by) VALUES ($1, 'c1')", env.event_id)

    bus.subscribe(stream, group, idempotent(effects_table, group, handle))
    await bus.start()
    try:
        sent = envelope("patience")
        await bus.publish(sent, stream=stream)
        done = await wait_for(lambda: effects(effects_table))
        dead = await (await bus.redis()).xlen(f"{stream}.dead")
    finally:
        await bus.stop()
    assert attempts == 5 and dead == 0
    assert done == [(sent.event_id, "c1")]


async def test_a_permanent_database_error_is_dead_lettered_after_max_deliveries_not_retried_forever(
    redis_url: str, effects_table: Database, streams: str
) -> None:
    """PostgreSQL's "index row requires 15016 bytes" (SQLSTATE 54000) will fail the same way every time."""
    stream, group = f"{streams}.too_big", "g"
    bus = EventBus(redis_url, consumer_name="c1", max_deliveries=3, min_idle_ms=100)
    attempts = 0

    async def handle(env: Envelope, conn) -> None:
        nonlocal attempts
        attempts += 1
        error = asyncpg.ProgramLimitExceededError("index row requires 15016 bytes, maximum size is 8191")
        error.sqlstate = "54000"
        raise error

    bus.subscribe(stream, group, idempotent(effects_table, group, handle))
    await bus.start()
    client = await bus.redis()
    try:
        sent = envelope("one enormous word")
        await bus.publish(sent, stream=stream)
        await wait_for(lambda: client.xlen(f"{stream}.dead"))
        (_, dead), = await client.xrange(f"{stream}.dead")
    finally:
        await bus.stop()
    assert attempts == 3
    assert dead[b"original.event_id"].decode() == sent.event_id
    assert "index row requires" in json.loads(dead[b"dead.reason"])["reason"]


async def test_idle_consumers_that_hold_nothing_are_pruned_and_busy_ones_kept(redis_url: str, streams: str) -> None:
    stream, group = f"{streams}.consumers", "g"
    bus = EventBus(redis_url, consumer_name="current")
    holding, release = asyncio.Event(), asyncio.Event()

    async def handle(env: Envelope) -> None:
        holding.set()
        await release.wait()

    bus.subscribe(stream, group, handle)
    await bus.start()
    client = await bus.redis()
    try:
        entry_id = await bus.publish(envelope("held"), stream=stream)
        with anyio.fail_after(10):
            await holding.wait()
        # Hand the pending entry to a consumer of a process that has since died.
        await client.xclaim(stream, group, "dead-holding", min_idle_time=0, message_ids=[entry_id])
        await client.xgroup_createconsumer(stream, group, "dead-empty")
        pruned = await bus.prune_consumers(idle_ms=-1)
        names = {c["name"].decode() if isinstance(c["name"], bytes) else c["name"]
                 for c in await client.xinfo_consumers(stream, group)}
        release.set()
    finally:
        await bus.stop()
    assert pruned == 1
    assert "dead-empty" not in names and {"dead-holding", "current"} <= names


async def test_a_restarted_consumer_takes_back_the_entry_it_held_at_once_not_after_the_idle_time(
    redis_url: str, streams: str
) -> None:
    stream, group = f"{streams}.restart", "workers"
    script = Path(__file__).with_name("restartable_consumer.py")

    def start(mode: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(script), redis_url, stream, group, "worker-host1", mode],
                                stdout=subprocess.PIPE, text=True)

    async def line(process: subprocess.Popen) -> str:
        """The next line of the script's own protocol (log lines share its stdout)."""
        while (text := (await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), 20)).strip()) \
                and not text.startswith(("ready", "handling", "handled")):
            pass
        return text

    publisher = EventBus(redis_url, consumer_name="publisher")
    sent = envelope("survive a crash")
    first = start("hang")
    try:
        assert await line(first) == "ready"
        await publisher.publish(sent, stream=stream)
        assert await line(first) == f"handling {sent.event_id}"
    finally:
        first.kill()  # mid-handler: no ack
        first.wait()
        first.stdout.close()
    again = start("finish")
    try:
        started = time.monotonic()
        seen: list[str] = []  # "ready" may come before or after the reclaimed entry starts
        while f"handled {sent.event_id}" not in seen:
            seen.append(await line(again))
        elapsed = time.monotonic() - started
        assert f"handling {sent.event_id}" in seen
        client = await publisher.redis()
        await wait_for(lambda: _no_pending(client, stream, group), timeout=5)
    finally:
        again.kill()
        again.wait()
        again.stdout.close()
        await publisher.stop()
    assert elapsed < 10, f"the entry waited {elapsed:.1f} s (the claimer's idle time is 60 s)"

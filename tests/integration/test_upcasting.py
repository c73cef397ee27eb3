"""Schema evolution end to end: a v1 event published on a stream or replayed from the event store
reaches the handler as v2; a newer version than the consumer knows is read tolerantly."""

from __future__ import annotations

import json
from dataclasses import replace

import anyio
import pytest

from libs.db import Database
from libs.events import Envelope, upcasting
from libs.events import schema as event_schema
from libs.events.bus import EventBus
from libs.eventstore import EventStore

pytestmark = pytest.mark.integration

TYPE = "session.message_appended"


@pytest.fixture
def v2_renamed_body_to_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """The change under test: v1 of session.message_appended called the text `body`; v2 calls it `text`."""
    monkeypatch.setitem(event_schema.EVENT_TYPES, TYPE, replace(event_schema.EVENT_TYPES[TYPE], version=2))
    monkeypatch.setattr(upcasting, "UPCASTERS", dict(upcasting.UPCASTERS))

    @upcasting.register_upcaster(TYPE, 1)
    def body_becomes_text(payload: dict) -> dict:
        payload = dict(payload)
        payload["text"] = payload.pop("body", "")
        return payload


def v1_fields(body: str) -> dict[str, str]:
    e = Envelope(event_type=TYPE, tenant_id="t1", schema_version=1,
                 payload=json.dumps({"deviceId": "d", "role": "user", "body": body}))
    return e.to_fields()


async def test_a_v1_event_on_a_stream_reaches_the_handler_as_v2(
    v2_renamed_body_to_text: None, redis_url: str, streams: str
) -> None:
    stream = f"{streams}.sessions"
    bus = EventBus(redis_url, consumer_name="c1")
    got: list[Envelope] = []
    done = anyio.Event()

    async def handle(envelope: Envelope) -> None:
        got.append(envelope)
        done.set()

    bus.subscribe(stream, "g", handle)
    await bus.start()
    try:
        await (await bus.redis()).xadd(stream, v1_fields("published before the upgrade"))
        with anyio.fail_after(20):
            await done.wait()
    finally:
        await bus.stop()
    assert got[0].schema_version == 2
    assert got[0].message().text == "published before the upgrade"


async def test_a_v1_event_replayed_from_the_event_store_is_read_as_v2(
    v2_renamed_body_to_text: None, db: Database
) -> None:
    store = EventStore(db)
    async with db.transaction("t1") as conn:
        await store.append(conn, "session-1", 0, [Envelope(  # stored as it was written back then
            event_type=TYPE, tenant_id="t1", schema_version=1,
            payload=json.dumps({"deviceId": "d", "role": "user", "body": "a year old"}))])
    (stored,) = await store.read_stream("session-1")
    (replayed,) = await store.read_all()
    for event in (stored, replayed):
        assert event.envelope.schema_version == 2
        assert event.envelope.message().text == "a year old"


async def test_an_old_version_without_an_upcaster_is_dead_lettered_naming_the_version(
    monkeypatch: pytest.MonkeyPatch, redis_url: str, streams: str
) -> None:
    monkeypatch.setitem(event_schema.EVENT_TYPES, TYPE, replace(event_schema.EVENT_TYPES[TYPE], version=2))
    stream = f"{streams}.sessions"
    bus = EventBus(redis_url, consumer_name="c1")

    async def handle(envelope: Envelope) -> None:
        raise AssertionError("an unreadable event reached the handler")

    bus.subscribe(stream, "g", handle)
    await bus.start()
    client = await bus.redis()
    try:
        await client.xadd(stream, v1_fields("no way forward"))
        with anyio.fail_after(20):
            while not await client.xlen(f"{stream}.dead"):
                await anyio.sleep(0.05)
        (_, dead), = await client.xrange(f"{stream}.dead")
    finally:
        await bus.stop()
    reason = json.loads(dead[b"dead.reason"])
    assert reason["field"] == "schema_version" and "upcaster" in reason["hint"]


async def test_a_newer_version_than_the_consumer_knows_is_read_tolerantly(redis_url: str, streams: str) -> None:
    stream = f"{streams}.sessions"
    bus = EventBus(redis_url, consumer_name="c1")
    got: list[Envelope] = []
    done = anyio.Event()

    async def handle(envelope: Envelope) -> None:
        got.append(envelope)
        done.set()

    bus.subscribe(stream, "g", handle)
    await bus.start()
    newer = Envelope(event_type=TYPE, tenant_id="t1", schema_version=7,
                     payload=json.dumps({"deviceId": "d", "role": "user", "text": "hi", "mood": "cheerful"}))
    try:
        await (await bus.redis()).xadd(stream, newer.to_fields())
        with anyio.fail_after(20):
            await done.wait()
    finally:
        await bus.stop()
    assert got[0].schema_version == 7 and got[0].message().text == "hi"  # the unknown field is ignored

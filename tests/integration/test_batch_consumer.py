"""BatchConsumer with batches in flight, against real Redis and PostgreSQL: batches of different order
keys overlap, one key's entries keep their stream order, and nothing is handled twice or left pending."""

from __future__ import annotations

import asyncio
import time

import pytest

from libs.auth import Principal
from libs.db import Database
from libs.events import Envelope
from libs.events.bus import EventBus
from libs.events.batches import BatchConsumer
from libs.events.envelope import MalformedEvent
from libs.errors import Unavailable
from libs.events.schema import MEMORY_ACCESS, MEMORY_COMMANDS, dead_letter_stream
from libs.protogen.mnemesh.v1 import common_pb2, events_pb2, memory_pb2

pytestmark = pytest.mark.integration
TENANT = "t1"


def _access(user: str, label: str) -> Envelope:
    message = events_pb2.MemoryAccessed(tenant=common_pb2.TenantContext(tenant_id=TENANT, user_id=user),
                                        memory_ids=[label])
    return Envelope.wrap(message, event_type="memory.accessed", tenant_id=TENANT)


def _user(envelope: Envelope) -> str:
    return envelope.peek().tenant.user_id


async def _stop(task: asyncio.Task) -> None:
    """Cancelled again until it ends: redis-py on Python 3.11 may lose a cancellation that lands as its
    socket timeout fires, and go on reading (the services' shutdown bounds its wait the same way)."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=1)


async def _consume(bus: EventBus, db: Database, labels: list[tuple[str, str]], *, in_flight: int,
                   hold_s: float = 0.3, order_key=_user) -> list[tuple[str, str, float, float]]:
    """Publish one entry per (user, label), consume them in batches of one, each held `hold_s` in its
    transaction; answer (user, label, start, end) per handler call."""
    calls: list[tuple[str, str, float, float]] = []

    async def handler(tenant_id: str, envelopes: list[Envelope], conn) -> list[None]:
        start = time.monotonic()
        await conn.execute("SELECT pg_sleep($1)", hold_s)
        calls.extend((_user(e), e.peek().memory_ids[0], start, time.monotonic()) for e in envelopes)
        return [None] * len(envelopes)

    for user, label in labels:
        await bus.publish(_access(user, label))
    consumer = BatchConsumer(bus, db, MEMORY_ACCESS, "g", handler, None, batch_size=1, block_ms=20,
                             in_flight=in_flight, order_key=order_key if in_flight > 1 else None)
    task = asyncio.create_task(consumer.run())
    try:
        async with asyncio.timeout(20):
            while len(calls) < len([label for _, label in labels if label != "bad"]):
                await asyncio.sleep(0.02)
            redis = await bus.redis()
            while (await redis.xpending(bus.stream_name(MEMORY_ACCESS), "g"))["pending"]:
                await asyncio.sleep(0.02)
    finally:
        await _stop(task)
    return calls


async def _until_handled(bus: EventBus, db: Database, handler, handled: list, count: int, *,
                         batch_size: int) -> None:
    """Consume with two batches in flight and a min_idle_ms of 1 s until `handled` holds `count` items and
    nothing is pending."""
    bus.min_idle_ms = 1000
    task = asyncio.create_task(BatchConsumer(bus, db, MEMORY_ACCESS, "g", handler, None, batch_size=batch_size,
                                             block_ms=20, in_flight=2, order_key=_user).run())
    redis = await bus.redis()
    try:
        async with asyncio.timeout(20):
            while len(handled) < count or (await redis.xpending(bus.stream_name(MEMORY_ACCESS), "g"))["pending"]:
                assert not task.done(), task.exception()
                await asyncio.sleep(0.02)
    finally:
        await _stop(task)


@pytest.fixture
async def bus(redis_url: str, redis_client, streams: str):
    bus = EventBus(redis_url, consumer_name="c1", namespace=streams.replace(".", "_"))
    yield bus
    await bus.stop()
    await redis_client.delete(bus.stream_name(MEMORY_ACCESS), dead_letter_stream(bus.stream_name(MEMORY_ACCESS)))


async def test_batches_of_other_users_overlap_and_one_users_entries_keep_their_order(bus: EventBus,
                                                                                     db: Database) -> None:
    calls = await _consume(bus, db, [("ann", "a1"), ("bob", "b1"), ("ann", "a2"), ("cat", "c1"), ("ann", "a3")],
                           in_flight=3)
    assert sorted(label for _, label, _, _ in calls) == ["a1", "a2", "a3", "b1", "c1"]  # each once
    by_label = {label: (start, end) for _, label, start, end in calls}
    # ann's entries one after the other, in stream order
    assert by_label["a1"][1] <= by_label["a2"][0] and by_label["a2"][1] <= by_label["a3"][0]
    # bob's batch ran while ann's first was in its transaction
    assert by_label["b1"][0] < by_label["a1"][1]
    # never more than three at once
    for _, _, start, _ in calls:
        assert sum(1 for _, _, s, e in calls if s <= start < e) <= 3


async def test_one_batch_in_flight_handles_batches_one_after_the_other(bus: EventBus, db: Database) -> None:
    calls = await _consume(bus, db, [("ann", "a1"), ("bob", "b1"), ("cat", "c1")], in_flight=1, hold_s=0.1)
    ordered = sorted(calls, key=lambda c: c[2])
    assert [label for _, label, _, _ in ordered] == ["a1", "b1", "c1"]
    assert all(prev[3] <= nxt[2] for prev, nxt in zip(ordered, ordered[1:], strict=False))


async def test_an_entry_whose_order_key_fails_is_dead_lettered_and_its_neighbours_handled(
        bus: EventBus, db: Database, redis_client) -> None:
    def strict(envelope: Envelope) -> str:
        if envelope.peek().memory_ids[0] == "bad":
            raise MalformedEvent(field="memory_ids", reason="names no memory", hint="send memory ids")
        return _user(envelope)

    calls = await _consume(bus, db, [("ann", "a1"), ("bob", "bad"), ("cat", "c1")], in_flight=2, hold_s=0.05,
                           order_key=strict)
    assert sorted(label for _, label, _, _ in calls) == ["a1", "c1"]
    dead = await redis_client.xrange(dead_letter_stream(bus.stream_name(MEMORY_ACCESS)))
    assert len(dead) == 1 and b"memory_ids" in dead[0][1][b"dead.reason"]


async def test_a_batch_slower_than_the_idle_time_is_not_claimed_again_nor_its_deliveries_counted(
        redis_url: str, redis_client, streams: str, db: Database) -> None:
    """Reclaiming runs every min_idle_ms / 2 while a batch is in flight: it must neither deliver that batch's
    entry again nor count deliveries, or the entry's one failure would dead-letter it (max_deliveries 3)."""
    bus = EventBus(redis_url, consumer_name="c1", namespace=streams.replace(".", "_") + "_slow", min_idle_ms=200,
                   max_deliveries=3)
    attempts: list[str] = []

    async def handler(tenant_id: str, envelopes: list[Envelope], conn) -> list[BaseException | None]:
        attempts.extend(e.peek().memory_ids[0] for e in envelopes)
        if len(attempts) == 1:
            await conn.execute("SELECT pg_sleep(1.5)")
            return [RuntimeError("the first attempt fails after a slow commit")]
        return [None] * len(envelopes)

    await bus.publish(_access("ann", "a1"))
    consumer = BatchConsumer(bus, db, MEMORY_ACCESS, "g", handler, None, batch_size=1, block_ms=20, in_flight=2,
                             order_key=_user)
    task = asyncio.create_task(consumer.run())
    try:
        async with asyncio.timeout(20):
            while attempts != ["a1", "a1"]:
                await asyncio.sleep(0.02)
            while (await redis_client.xpending(bus.stream_name(MEMORY_ACCESS), "g"))["pending"]:
                await asyncio.sleep(0.02)
    finally:
        await _stop(task)
        await bus.stop()
    assert await redis_client.xrange(dead_letter_stream(bus.stream_name(MEMORY_ACCESS))) == []
    await redis_client.delete(bus.stream_name(MEMORY_ACCESS))


async def test_an_entry_deleted_while_a_dead_consumer_held_it_is_acknowledged_not_handled(
        bus: EventBus, db: Database, redis_client) -> None:
    key = bus.stream_name(MEMORY_ACCESS)
    await redis_client.xgroup_create(key, "g", id="0", mkstream=True)
    gone = await bus.publish(_access("ann", "a1"))
    kept = await bus.publish(_access("bob", "b1"))
    await redis_client.xreadgroup("g", "dead-consumer", {key: ">"})  # both pending with a consumer that died
    await redis_client.xdel(key, gone)  # e.g. trimmed
    handled: list[str] = []

    async def handler(tenant_id: str, envelopes: list[Envelope], conn) -> list[None]:
        handled.extend(e.peek().memory_ids[0] for e in envelopes)
        return [None] * len(envelopes)

    bus.min_idle_ms = 50
    consumer = BatchConsumer(bus, db, MEMORY_ACCESS, "g", handler, None, batch_size=10, block_ms=20, in_flight=2,
                             order_key=_user)
    task = asyncio.create_task(consumer.run())
    try:
        async with asyncio.timeout(20):
            while handled != ["b1"] or (await redis_client.xpending(key, "g"))["pending"]:
                assert not task.done(), task.exception()
                await asyncio.sleep(0.02)
    finally:
        await _stop(task)
    assert kept and handled == ["b1"]


def test_batches_in_flight_need_an_order_key(bus: EventBus, db: Database) -> None:
    with pytest.raises(ValueError, match="order_key"):
        BatchConsumer(bus, db, MEMORY_ACCESS, "g", lambda *a: [], None, in_flight=2)
    with pytest.raises(ValueError, match="in_flight"):
        BatchConsumer(bus, db, MEMORY_ACCESS, "g", lambda *a: [], None, in_flight=0, order_key=_user)


async def test_two_replicas_keep_one_users_order_and_handle_other_users_side_by_side(
        redis_url: str, redis_client, bus: EventBus, db: Database) -> None:
    """Two consumers of one group (two writer processes): each reads its own batches, yet one user's entries
    are handled one after the other in stream order, whichever replica holds them."""
    other = EventBus(redis_url, consumer_name="c2", namespace=bus.namespace)
    labels = [("ann", "a1"), ("bob", "b1"), ("ann", "a2"), ("cat", "c1"), ("ann", "a3"), ("cat", "c2"),
              ("bob", "b2"), ("dan", "d1"), ("ann", "a4"), ("eve", "e1")]
    for user, label in labels:
        await bus.publish(_access(user, label))
    calls: list[tuple[str, str, str, float, float]] = []
    sizes: list[int] = []

    def handler_of(replica: str):
        async def handler(tenant_id: str, envelopes: list[Envelope], conn) -> list[None]:
            start = time.monotonic()
            await conn.execute("SELECT pg_sleep(0.2)")
            sizes.append(len(envelopes))
            calls.extend((replica, _user(e), e.peek().memory_ids[0], start, time.monotonic()) for e in envelopes)
            return [None] * len(envelopes)
        return handler

    tasks = [asyncio.create_task(BatchConsumer(b, db, MEMORY_ACCESS, "g", handler_of(name), None, batch_size=2,
                                               block_ms=20, order_key=_user).run())
             for name, b in (("c1", bus), ("c2", other))]
    try:
        async with asyncio.timeout(30):
            while len(calls) < len(labels) or (await redis_client.xpending(bus.stream_name(MEMORY_ACCESS),
                                                                            "g"))["pending"]:
                assert not any(t.done() for t in tasks), [t.exception() for t in tasks if t.done()]
                await asyncio.sleep(0.02)
    finally:
        for task in tasks:
            await _stop(task)
        await other.stop()
    assert sorted(label for _, _, label, _, _ in calls) == sorted(label for _, label in labels)  # each once
    for user in {u for u, _ in labels}:
        stream_order = [label for u, label in labels if u == user]
        handled = sorted((c for c in calls if c[1] == user), key=lambda c: c[3])
        assert [c[2] for c in handled] == stream_order
        # one after the other, or together in one batch (in stream order there)
        assert all(prev[4] <= nxt[3] or (prev[0], prev[3]) == (nxt[0], nxt[3])
                   for prev, nxt in zip(handled, handled[1:], strict=False)), handled
    assert {replica for replica, *_ in calls} == {"c1", "c2"}
    assert max(sizes) <= 2  # parked entries released together still go in batches of batch_size
    # the replicas did overlap: some call of one ran while a call of the other was in its transaction
    assert any(a[3] < b[4] and b[3] < a[4] for a in calls if a[0] == "c1" for b in calls if b[0] == "c2")


async def test_an_entry_a_dead_replica_holds_keeps_its_users_later_entries_back_only_until_it_is_idle(
        bus: EventBus, db: Database, redis_client) -> None:
    """a1 is pending with a consumer that died: ann's a2 waits until a1 has been idle min_idle_ms, then a1 is
    reclaimed and handled first; bob's entry never waits."""
    key = bus.stream_name(MEMORY_ACCESS)
    await redis_client.xgroup_create(key, "g", id="0", mkstream=True)
    await bus.publish(_access("ann", "a1"))
    await redis_client.xreadgroup("g", "dead-consumer", {key: ">"})
    for user, label in (("ann", "a2"), ("bob", "b1")):
        await bus.publish(_access(user, label))
    handled: list[tuple[str, float]] = []

    async def handler(tenant_id: str, envelopes: list[Envelope], conn) -> list[None]:
        handled.extend((e.peek().memory_ids[0], time.monotonic()) for e in envelopes)
        return [None] * len(envelopes)

    start = time.monotonic()
    await _until_handled(bus, db, handler, handled, 3, batch_size=10)
    at = dict(handled)
    assert at["b1"] - start < 0.5  # not held back
    assert at["a2"] - start >= 0.9  # held back by a1 until a1 looked abandoned
    assert at["a1"] <= at["a2"]  # reclaimed at once, and handled first


async def test_a_batch_slower_than_the_idle_time_is_not_taken_by_another_replica(
        redis_url: str, redis_client, streams: str, db: Database) -> None:
    """c1 holds a1 in a 2 s transaction, beyond min_idle_ms, and a2 (same user) waits for it to start; c2
    reclaims every 200 ms, yet takes neither: c1 keeps what it holds fresh in the pending list (were they
    taken, the processed-event rows would keep a second handling from having an effect, but the deliveries
    would count towards dead-lettering)."""
    namespace = streams.replace(".", "_") + "_held"
    buses = [EventBus(redis_url, consumer_name=name, namespace=namespace, min_idle_ms=400) for name in ("c1", "c2")]
    handled: list[tuple[str, str]] = []

    def handler_of(replica: str):
        async def handler(tenant_id: str, envelopes: list[Envelope], conn) -> list[None]:
            if replica == "c1" and not handled:
                await conn.execute("SELECT pg_sleep(2)")
            handled.extend((replica, e.peek().memory_ids[0]) for e in envelopes)
            return [None] * len(envelopes)
        return handler

    for label in ("a1", "a2"):
        await buses[0].publish(_access("ann", label))
    first = BatchConsumer(buses[0], db, MEMORY_ACCESS, "g", handler_of("c1"), None, batch_size=1, block_ms=20,
                          order_key=_user)
    tasks = [asyncio.create_task(first.run())]
    try:
        async with asyncio.timeout(20):
            while len(first._entry_ids) < 2:  # a1 in its transaction, a2 waiting to start
                await asyncio.sleep(0.01)
            tasks.append(asyncio.create_task(BatchConsumer(buses[1], db, MEMORY_ACCESS, "g", handler_of("c2"), None,
                                                           batch_size=10, block_ms=20, order_key=_user).run()))
            await asyncio.sleep(1.2)  # c2 has looked for abandoned entries several times
            pending = await redis_client.xpending_range(buses[0].stream_name(MEMORY_ACCESS), "g", "-", "+", 10)
            assert [(p["consumer"], p["times_delivered"]) for p in pending] == [(b"c1", 1)] * 2
            assert not handled
            while len(handled) < 2 or (await redis_client.xpending(buses[0].stream_name(MEMORY_ACCESS), "g"))["pending"]:
                assert not any(t.done() for t in tasks)
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)  # time for a wrong second handling to show
    finally:
        for task in tasks:
            await _stop(task)
        for b in buses:
            await b.stop()
        await redis_client.delete(buses[0].stream_name(MEMORY_ACCESS))
    assert handled == [("c1", "a1"), ("c1", "a2")]


@pytest.mark.parametrize("case", ["read_meanwhile", "read_after", "fails_twice"])
async def test_an_entry_that_failed_keeps_its_users_later_entries_back_on_its_own_consumer_until_retried(
        bus: EventBus, db: Database, case: str) -> None:
    """a1 fails (retryable) and waits to be retried: ann's a2 is handled only after a1 is, on the same consumer
    too; bob's b1 never waits. a2 is read while a1's batch is still in its transaction (read_meanwhile), or
    once a1 has failed (read_after), or a1 fails twice and is retried in batches of ten (fails_twice)."""
    failures = 2 if case == "fails_twice" else 1
    handled: list[tuple[str, float]] = []
    failed: list[float] = []

    async def handler(tenant_id: str, envelopes: list[Envelope], conn) -> list:
        if case == "read_meanwhile":
            await asyncio.sleep(0.2)
        outcomes = []
        for e in envelopes:
            label = e.peek().memory_ids[0]
            if label == "a1" and len(failed) < failures:
                failed.append(time.monotonic())
                outcomes.append(RuntimeError("a1 fails"))
                continue
            handled.append((label, time.monotonic()))
            outcomes.append(None)
        return outcomes

    async def publish_a2_once_a1_failed() -> None:
        while not failed:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # a1's batch has ended: a2 is read after it, not while it runs
        await bus.publish(_access("ann", "a2"))

    await bus.publish(_access("ann", "a1"))
    if case == "read_meanwhile":
        await bus.publish(_access("ann", "a2"))
    await bus.publish(_access("bob", "b1"))
    later = asyncio.create_task(publish_a2_once_a1_failed()) if case != "read_meanwhile" else None
    start = time.monotonic()
    await _until_handled(bus, db, handler, handled, 3, batch_size=10 if case == "fails_twice" else 1)
    if later is not None:
        await later
    at = dict(handled)
    assert len(failed) == failures and sorted(at) == ["a1", "a2", "b1"]
    assert at["a1"] <= at["a2"]  # retried first: ann's order kept
    assert at["a2"] - start >= 0.9 * failures  # held back until a1 was retried (idle for min_idle_ms each time)
    assert at["b1"] - start < 0.9  # bob does not wait


class _KeysAwayAtFirst:
    """A TokenVerifier whose signing keys cannot be fetched for its first `away` calls."""

    fetches_keys = False

    def __init__(self, away: int) -> None:
        self.away, self.calls = away, 0

    def verify(self, token: str | None) -> Principal:
        self.calls += 1
        if self.calls <= self.away:
            raise Unavailable("the signing keys cannot be fetched: connection refused", field="authorization")
        return Principal("producer", TENANT, frozenset({f"produce:{MEMORY_COMMANDS}"}))


async def test_entries_that_cannot_be_admitted_yet_wait_pending_and_are_handled_in_order_once_they_can(
        bus: EventBus, db: Database, redis_client) -> None:
    """The producer tokens cannot be checked (the signing keys are away): the entries are neither refused nor
    dead-lettered; the consumer waits and handles them, in stream order, once the keys are back."""
    handled: list[str] = []

    async def handler(tenant_id: str, envelopes: list[Envelope], conn) -> list[None]:
        handled.extend(e.peek().content for e in envelopes)
        return [None] * len(envelopes)

    for i in range(3):
        request = memory_pb2.WriteMemoryRequest(tenant=common_pb2.TenantContext(tenant_id=TENANT, user_id="ann"),
                                                content=f"fact {i}")
        await bus.publish(Envelope.wrap(request, event_type="memory.write_requested", tenant_id=TENANT,
                                        credential="a-token"))
    verifier = _KeysAwayAtFirst(away=2)
    consumer = BatchConsumer(bus, db, MEMORY_COMMANDS, "g", handler, verifier, batch_size=2, block_ms=20,
                             in_flight=2, order_key=_user)
    task = asyncio.create_task(consumer.run())
    try:
        async with asyncio.timeout(20):
            while len(handled) < 3 or (await redis_client.xpending(bus.stream_name(MEMORY_COMMANDS), "g"))["pending"]:
                assert not task.done(), task.exception()
                await asyncio.sleep(0.02)
    finally:
        await _stop(task)
    assert handled == ["fact 0", "fact 1", "fact 2"] and verifier.calls > 2
    assert await redis_client.xrange(dead_letter_stream(bus.stream_name(MEMORY_COMMANDS))) == []

"""BatchConsumer lanes against real Redis and PostgreSQL: batches overlap, a key's entries never do.

Two lanes handle batches at once; every entry of one partition key goes to one lane, so no two
transactions ever hold entries of the same key at once, and a key's entries are handled in stream order.
"""

from __future__ import annotations

import asyncio

import anyio
import pytest

from libs.db import Database
from libs.events import Envelope
from libs.events.batches import BatchConsumer
from libs.events.bus import EventBus
from libs.events.schema import MEMORY_COMMANDS
from libs.protogen.mnemesh.v1 import common_pb2, memory_pb2

pytestmark = pytest.mark.integration


def command(user: str, n: int) -> Envelope:
    return Envelope.wrap(memory_pb2.WriteMemoryRequest(
        tenant=common_pb2.TenantContext(tenant_id="acme", user_id=user), layer=common_pb2.MEMORY_LAYER_LONG_TERM,
        source=common_pb2.SOURCE_KIND_USER_STATEMENT, content=f"{user} fact {n}"),
        event_type="memory.write_requested", tenant_id="acme")


def user_of(envelope: Envelope) -> str:
    return envelope.message().tenant.user_id


async def test_lanes_overlap_batches_but_never_two_of_one_key_and_keep_each_keys_order(
        db: Database, redis_url: str, streams: str) -> None:
    bus = EventBus(redis_url, consumer_name="c1", namespace=streams)
    active: dict[str, int] = {}  # key -> handlers holding it now
    seen: dict[str, list[str]] = {}
    overlaps = 0  # handler calls that began while another was running
    running = 0
    clashes: list[str] = []

    async def handler(tenant_id: str, envelopes: list[Envelope], conn) -> list[None]:
        nonlocal overlaps, running
        keys = {user_of(e) for e in envelopes}
        clashes.extend(k for k in keys if active.get(k))
        overlaps += running > 0
        running += 1
        for k in keys:
            active[k] = active.get(k, 0) + 1
        try:
            await conn.execute("SELECT pg_sleep(0.03)")  # a transaction's database time, as a real batch has
            for e in envelopes:
                seen.setdefault(user_of(e), []).append(e.message().content)
            return [None] * len(envelopes)
        finally:
            running -= 1
            for k in keys:
                active[k] -= 1

    consumer = BatchConsumer(bus, db, MEMORY_COMMANDS, "writer", handler, None, batch_size=10, block_ms=50,
                             lanes=2, partition=user_of)
    sent = [command(f"u{i % 7}", i) for i in range(300)]
    client = await bus.redis()
    pipe = client.pipeline(transaction=False)
    for e in sent:
        pipe.xadd(bus.stream_name(MEMORY_COMMANDS), e.to_fields())
    await pipe.execute()
    task = asyncio.create_task(consumer.run())
    try:
        with anyio.fail_after(60):
            while sum(map(len, seen.values())) < len(sent):
                await anyio.sleep(0.05)
            while (await client.xpending(bus.stream_name(MEMORY_COMMANDS), "writer"))["pending"]:
                await anyio.sleep(0.05)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await bus.stop()
    assert not clashes, f"two transactions held entries of the same key at once: {sorted(set(clashes))}"
    assert overlaps > 0, "the lanes never handled two batches at once"
    for user, contents in seen.items():
        assert contents == [e.message().content for e in sent if user_of(e) == user], f"{user}: out of order"


async def test_lanes_without_a_partition_key_are_refused(db: Database, redis_url: str) -> None:
    bus = EventBus(redis_url, consumer_name="c1")
    with pytest.raises(ValueError, match="partition"):
        BatchConsumer(bus, db, MEMORY_COMMANDS, "writer", None, None, lanes=2)  # type: ignore[arg-type]
    await bus.stop()

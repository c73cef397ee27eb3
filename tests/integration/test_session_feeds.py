"""Followers of one session share one reader of the real event store, each from its own version."""

from __future__ import annotations

import asyncio
import contextlib

import anyio
import pytest

from libs.db import Database
from libs.eventstore import EventStore
from libs.outbox import Outbox
from services.orchestrator.adapters.repository import EventSourcedSessions
from services.orchestrator.service_layer.handlers import SendMessage, send_message

pytestmark = pytest.mark.integration


async def collect(sessions: EventSourcedSessions, after: int, until: int, *, slow: bool = False) -> list[int]:
    seen = []
    async with contextlib.aclosing(sessions.follow("acme", "s1", after)) as items:
        async for item in items:
            seen.append(item.version)
            if slow:
                await asyncio.sleep(0.002)  # a slow device: the others must not wait for it
            if item.version >= until:
                return seen
    return seen


async def send(sessions: EventSourcedSessions, n: int) -> None:
    for i in range(n):
        await send_message(SendMessage("acme", "u1", "s1", "web", f"m{i}"), sessions)


async def test_followers_from_any_version_see_every_event_once_in_order_through_one_reader(db: Database) -> None:
    store = EventStore(db, stream_poll_seconds=1.0)
    sessions = EventSourcedSessions(db, store, Outbox(db))
    sessions.feeds.buffer = 16  # small: a follower that falls behind must catch up from the store
    await send(sessions, 10)  # versions 1-12 (a task starts with the first message)
    reads = 0
    subscribe = store.subscribe_stream

    def counted(*args, **kwargs):
        nonlocal reads
        reads += 1
        return subscribe(*args, **kwargs)
    store.subscribe_stream = counted
    with anyio.fail_after(60):
        followers = [asyncio.create_task(collect(sessions, after, 72, slow=after == 3)) for after in (0, 3, 12, 12)]
        await asyncio.sleep(0.1)
        late = asyncio.create_task(collect(sessions, 0, 72))  # joins while the others follow live
        await send(sessions, 60)
        results = await asyncio.gather(*followers, late)
    for after, seen in zip((0, 3, 12, 12, 0), results, strict=True):
        assert seen == list(range(after + 1, 73)), after
    assert reads == 1  # one reader of the stream for all five followers
    assert sessions.feeds.feeds == {}  # the reader stopped with its last follower

"""One reader per session stream in this process, however many follow it (devices, in-flight tool calls).

Each wake of a stream (a NOTIFY, a poll) then costs one read of the store, not one per follower. The
reader keeps the stream's recent events in a bounded buffer; each follower keeps its own cursor and
reads from the buffer, or from the store when the buffer no longer (or does not yet) holds what it
needs: a slow follower falls behind without holding anything up, and catches up from the store.
Events are decoded once, by the reader (`decode`), not once a follower.
"""

from __future__ import annotations

import asyncio
from collections import deque
from itertools import islice
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from libs.eventstore import EventStore, StoredEvent

__all__ = ["StreamFeeds"]


@dataclass
class _Feed:
    events: deque[Any]  # decoded events, each with a `version`
    cursor: int                       # the last version the reader has buffered
    followers: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    error: BaseException | None = None
    task: asyncio.Task | None = None

    def since(self, version: int) -> list[Any] | None:
        """The buffered events after `version`; None when the buffer does not reach back to it."""
        if version >= self.cursor:
            return []
        if not self.events or self.events[0].version > version + 1:
            return None
        return list(islice(self.events, version + 1 - self.events[0].version, None))

    def wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


class StreamFeeds:
    def __init__(self, store: EventStore, decode: Callable[[StoredEvent], Any], buffer: int = 4096) -> None:
        self.store, self.decode, self.buffer = store, decode, buffer
        self.feeds: dict[str, _Feed] = {}

    async def follow(self, stream: str, after_version: int, tenant_id: str) -> AsyncIterator[Any]:
        feed = self.feeds.get(stream)
        if feed is None:
            feed = self.feeds[stream] = _Feed(deque(maxlen=self.buffer), after_version)
            feed.task = asyncio.ensure_future(self._read(stream, tenant_id, feed))
        feed.followers += 1
        last = after_version
        try:
            while True:
                batch = feed.since(last)
                if batch is None:  # behind the buffer: catch up from the store
                    batch = [self.decode(e) for e in await self.store.read_stream(stream, last, tenant_id=tenant_id)]
                if batch:
                    for event in batch:
                        last = event.version
                        yield event
                    continue
                if feed.error is not None:
                    raise feed.error
                await feed.changed.wait()
        finally:
            feed.followers -= 1
            if feed.followers == 0:
                feed.task.cancel()
                if self.feeds.get(stream) is feed:
                    del self.feeds[stream]

    async def _read(self, stream: str, tenant_id: str, feed: _Feed) -> None:
        try:
            async for event in self.store.subscribe_stream(stream, feed.cursor, tenant_id=tenant_id):
                feed.events.append(self.decode(event))
                feed.cursor = event.version
                feed.wake()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - every follower of the stream gets the reader's failure
            feed.error = exc
            if self.feeds.get(stream) is feed:
                del self.feeds[stream]  # the next follower starts a new reader
            feed.wake()

"""The copies of memory.written events in the memory events stream, and their removal on Forget.

The published copy of a memory.written carries the content the read side indexes; the stream keeps
it until trimmed. Forget removes the forgotten user's (or memories') entries at once, by one pass
over the stream (XRANGE in pages, XDEL of the matches): forgetting is rare, the stream is bounded.
"""

from __future__ import annotations

import json

from libs.events.bus import EventBus
from libs.events.schema import MEMORY_EVENTS

__all__ = ["RedisStreamCopies"]

PAGE = 1000


def _text(value: bytes | str | None) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else (value or "")


class RedisStreamCopies:
    def __init__(self, bus: EventBus, stream: str = MEMORY_EVENTS) -> None:
        self.bus, self.key = bus, bus.stream_name(stream)

    async def purge(self, tenant_id: str, user_id: str, memory_ids: list[str]) -> int:
        redis, wanted, removed, start = await self.bus.redis(), set(memory_ids), 0, "-"
        while entries := await redis.xrange(self.key, min=start, count=PAGE):
            doomed = []
            for entry_id, raw in entries:
                fields = {_text(k): _text(v) for k, v in raw.items()}
                if fields.get("event_type") != "memory.written" or fields.get("tenant_id") != tenant_id:
                    continue
                try:
                    memory = json.loads(fields.get("payload", "")).get("memory", {})
                except (ValueError, AttributeError):
                    continue
                if (user_id and memory.get("tenant", {}).get("userId") == user_id) or memory.get("memoryId") in wanted:
                    doomed.append(entry_id)
            if doomed:
                removed += await redis.xdel(self.key, *doomed)
            if len(entries) < PAGE:
                break
            start = "(" + _text(entries[-1][0])
        return removed

"""Copies of a user's memories in Redis streams, and their removal on Forget.

The published copy of a memory.written carries the content the read side indexes (and a merge its
tags), and the stream keeps it until trimmed; a consumer of the events (the retriever) that could not
handle one dead-letters it, content and all, in the events' dead-letter stream; a write command that was
dead-lettered keeps its content (sensitive values redacted) in the commands' dead-letter stream. Dead
letters are never trimmed. Forget removes the forgotten user's (or memories') entries from all three at
once, by one pass over each stream (XRANGE in pages, XDEL of the matches): forgetting is rare, the
streams are bounded.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from libs.events.bus import EventBus
from libs.events.schema import MEMORY_COMMANDS, MEMORY_EVENTS, dead_letter_stream
from services.memory_writer.adapters.event_json import PERSONAL_EVENTS, SUBJECT_EVENTS

__all__ = ["RedisStreamCopies"]

PAGE = 1000


def _text(value: bytes | str | None) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else (value or "")


def _payload(fields: dict[str, str], name: str) -> dict:
    try:
        payload = json.loads(fields.get(name, ""))
    except ValueError:
        return {}
    return payload if isinstance(payload, dict) else {}


class RedisStreamCopies:
    def __init__(self, bus: EventBus) -> None:
        self.bus = bus
        self.events = bus.stream_name(MEMORY_EVENTS)
        self.dead_events = dead_letter_stream(self.events)
        self.dead_commands = dead_letter_stream(bus.stream_name(MEMORY_COMMANDS))

    async def purge(self, tenant_id: str, user_id: str, memory_ids: list[str], *, whole_tenant: bool = False) -> int:
        wanted = set(memory_ids)

        def personal(fields: dict[str, str], prefix: str = "") -> bool:
            """An event (`prefix`: "original." for a dead letter's copy) of the user, or about a wanted memory."""
            event_type = fields.get(prefix + "event_type")
            if event_type not in PERSONAL_EVENTS or fields.get(prefix + "tenant_id") != tenant_id:
                return False
            payload = _payload(fields, prefix + "payload")
            memory = payload.get("memory") or {}
            owner = (memory.get("tenant") or payload.get("tenant") or {}).get("userId")
            subject = memory.get("memoryId") or payload.get("memoryId")
            return (whole_tenant or bool(user_id and owner == user_id)
                    or (event_type in SUBJECT_EVENTS and subject in wanted))

        def dead_command(fields: dict[str, str]) -> bool:
            if fields.get("original.tenant_id") != tenant_id:
                return False
            return whole_tenant or (bool(user_id) and
                                    (_payload(fields, "original.payload").get("tenant") or {}).get("userId") == user_id)

        return (await self._purge(self.events, personal)
                + await self._purge(self.dead_events, lambda fields: personal(fields, "original."))
                + await self._purge(self.dead_commands, dead_command))

    async def _purge(self, key: str, doomed: Callable[[dict[str, str]], bool]) -> int:
        redis, removed, start = await self.bus.redis(), 0, "-"
        while entries := await redis.xrange(key, min=start, count=PAGE):
            ids = [entry_id for entry_id, raw in entries if doomed({_text(k): _text(v) for k, v in raw.items()})]
            if ids:
                removed += await redis.xdel(key, *ids)
            if len(entries) < PAGE:
                break
            start = "(" + _text(entries[-1][0])
        return removed

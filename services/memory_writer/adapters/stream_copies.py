"""Copies of a user's memories in Redis streams, and their removal on Forget.

The published copy of a memory.written carries the content the read side indexes (and a merge its
tags), and the stream keeps it until trimmed; a consumer of the events (the retriever) that could not
handle one dead-letters it, content and all, in the events' dead-letter stream; a write command waiting
in the commands stream holds its content until a writer takes it, and one that was dead-lettered keeps
it (sensitive values redacted) in the commands' dead-letter stream. Dead letters are never trimmed.
Forget removes the forgotten user's (or memories', or tenant's) entries from all four, each up to the
last entry it held at the forget's commit (`mark`), so what comes after, a new start, stays: one pass
over each stream (XRANGE in pages, XDEL of the matches): forgetting is rare, the streams are bounded.
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
        self.commands = bus.stream_name(MEMORY_COMMANDS)
        self.dead_commands = dead_letter_stream(self.commands)

    async def mark(self) -> dict[str, str]:
        redis = await self.bus.redis()
        marks = {}
        for key in (self.events, self.dead_events, self.commands, self.dead_commands):
            last = await redis.xrevrange(key, count=1)
            marks[key] = _text(last[0][0]) if last else "0-0"
        return marks

    async def purge(self, tenant_id: str, user_id: str, memory_ids: list[str], *, whole_tenant: bool = False,
                    until: dict[str, str] | None = None) -> int:
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

        def command(fields: dict[str, str], prefix: str = "") -> bool:
            """A write command (`prefix`: "original." for a dead letter) of the user."""
            if fields.get(prefix + "tenant_id") != tenant_id:
                return False
            return whole_tenant or (bool(user_id) and
                                    (_payload(fields, prefix + "payload").get("tenant") or {}).get("userId") == user_id)

        until = until or {}
        return (await self._purge(self.events, personal, until.get(self.events, "+"))
                + await self._purge(self.dead_events, lambda fields: personal(fields, "original."),
                                    until.get(self.dead_events, "+"))
                + await self._purge(self.commands, command, until.get(self.commands, "+"))
                + await self._purge(self.dead_commands, lambda fields: command(fields, "original."),
                                    until.get(self.dead_commands, "+")))

    async def _purge(self, key: str, doomed: Callable[[dict[str, str]], bool], until: str) -> int:
        redis, removed, start = await self.bus.redis(), 0, "-"
        while entries := await redis.xrange(key, min=start, max=until, count=PAGE):
            ids = [entry_id for entry_id, raw in entries if doomed({_text(k): _text(v) for k, v in raw.items()})]
            if ids:
                removed += await redis.xdel(key, *ids)
            if len(entries) < PAGE:
                break
            start = "(" + _text(entries[-1][0])
        return removed

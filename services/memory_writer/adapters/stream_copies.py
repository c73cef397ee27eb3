"""Copies of a user's memories in Redis streams, and their removal on Forget.

The published copy of a memory.written carries the content the read side indexes (and a merge its
tags), and the stream keeps it until trimmed; a consumer of the events (the retriever) that could not
handle one dead-letters it, content and all, in the events' dead-letter stream; a write command waiting
in the commands stream holds its content until a writer takes it, and one that was dead-lettered keeps
it (sensitive values redacted) in the commands' dead-letter stream. Dead letters are never trimmed.
Forget removes the forgotten user's (or memories', or tenant's) entries from all four, up to the last
entry the events and commands streams held at the forget's commit (`mark`; a dead letter by the id of
the entry it copies, however late it was written), so what comes after, a new start, stays: one pass
over each stream (XRANGE in pages, XDEL of the matches): forgetting is rare, the streams are bounded.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from redis.exceptions import ResponseError

from libs.events.bus import EventBus
from libs.events.schema import MEMORY_COMMANDS, MEMORY_EVENTS, dead_letter_stream
from services.memory_writer.adapters.event_json import PERSONAL_EVENTS, SUBJECT_EVENTS

__all__ = ["RedisStreamCopies"]

PAGE = 1000


def _text(value: bytes | str | None) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else (value or "")


def _entry_id(entry_id: str) -> tuple[int, int]:
    """A stream entry id, comparable ((0, 0) when empty or malformed: from before any mark)."""
    ms, _, seq = entry_id.partition("-")
    return (int(ms), int(seq or 0)) if ms.isdigit() and (seq or "0").isdigit() else (0, 0)


def _payload(fields: dict[str, str], name: str) -> dict:
    try:
        payload = json.loads(fields.get(name, ""))
    except (ValueError, RecursionError):  # not JSON, or nested too deep to read: nobody's
        return {}
    return payload if isinstance(payload, dict) else {}


def _at(value: object, *path: str) -> object:
    """`value[path[0]][path[1]]...`; None where a step is missing or not an object (a payload is as sent)."""
    for name in path:
        if not isinstance(value, dict):
            return None
        value = value.get(name)
    return value


class RedisStreamCopies:
    def __init__(self, bus: EventBus) -> None:
        self.bus = bus
        self.events = bus.stream_name(MEMORY_EVENTS)
        self.dead_events = dead_letter_stream(self.events)
        self.commands = bus.stream_name(MEMORY_COMMANDS)
        self.dead_commands = dead_letter_stream(self.commands)

    async def mark(self) -> dict[str, str]:
        # The last id each stream generated (its entries may be trimmed or deleted since; a stream not
        # created yet answers an error, and nothing of it can be before the mark).
        pipe = (await self.bus.redis()).pipeline(transaction=False)
        for key in (self.events, self.commands):
            pipe.xinfo_stream(key)
        marks = {}
        for key, info in zip((self.events, self.commands), await pipe.execute(raise_on_error=False), strict=True):
            if isinstance(info, ResponseError) and "no such key" in str(info).lower():
                marks[key] = "0-0"
            elif isinstance(info, Exception):  # (NOPERM, say) a purge without its mark would remove a new start
                raise info
            else:
                marks[key] = _text(info["last-generated-id"])
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
            owner = _at(payload, "memory", "tenant", "userId") or _at(payload, "tenant", "userId")
            subject = _at(payload, "memory", "memoryId") or _at(payload, "memoryId")
            return (whole_tenant or bool(user_id and owner == user_id)
                    or (event_type in SUBJECT_EVENTS and isinstance(subject, str) and subject in wanted))

        def command(fields: dict[str, str], prefix: str = "") -> bool:
            """A write command (`prefix`: "original." for a dead letter) of the user."""
            if fields.get(prefix + "tenant_id") != tenant_id:
                return False
            return whole_tenant or (bool(user_id) and
                                    _at(_payload(fields, prefix + "payload"), "tenant", "userId") == user_id)

        def before(mark: str, fields: dict[str, str]) -> bool:
            """A dead letter of an entry up to `mark` of its stream (the dead-lettering may come later)."""
            return not mark or _entry_id(fields.get("dead.entry_id", "")) <= _entry_id(mark)

        until = until or {}
        events, commands = until.get(self.events, ""), until.get(self.commands, "")
        return (await self._purge(self.events, personal, events or "+")
                + await self._purge(self.dead_events,
                                    lambda fields: personal(fields, "original.") and before(events, fields))
                + await self._purge(self.commands, command, commands or "+")
                + await self._purge(self.dead_commands,
                                    lambda fields: command(fields, "original.") and before(commands, fields)))

    async def _purge(self, key: str, doomed: Callable[[dict[str, str]], bool], until: str = "+") -> int:
        redis, removed, start = await self.bus.redis(), 0, "-"
        while entries := await redis.xrange(key, min=start, max=until, count=PAGE):
            ids = [entry_id for entry_id, raw in entries if doomed({_text(k): _text(v) for k, v in raw.items()})]
            if ids:
                removed += await redis.xdel(key, *ids)
            if len(entries) < PAGE:
                break
            start = "(" + _text(entries[-1][0])
        return removed

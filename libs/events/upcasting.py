"""Schema evolution of events: upcasters turn old payloads into the current version.

An event's payload is proto3 JSON of its message at `schema_version`. When a message
changes in a way old payloads do not parse into (a renamed or restructured field),
its version in EVENT_TYPES goes up and an upcaster is registered here for the old
version: a function from the old payload (a dict) to the next version's payload.
Stream consumers and event-store readers apply the chain, so a handler only ever
sees the current version, whether the event was published a minute ago or is
replayed from a year-old event store.

The rule for *newer* versions than a consumer knows (a producer upgraded first):
tolerant read. The fields the consumer knows are read and the rest are ignored,
so a version may only add fields or change things an upcaster can undo; a change
that old consumers must not read tolerantly needs a new event type instead.
"""

from __future__ import annotations

import json
from collections.abc import Callable

__all__ = ["UPCASTERS", "UpcastError", "register_upcaster", "upcast_payload"]

Upcaster = Callable[[dict], dict]
# (event type, version it reads) -> function producing version + 1
UPCASTERS: dict[tuple[str, int], Upcaster] = {}


class UpcastError(Exception):
    """No way from the payload's version to the current one."""


def register_upcaster(event_type: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
    """Decorator: `fn(payload_v) -> payload_v+1` for `event_type` at `from_version`."""

    def register(fn: Upcaster) -> Upcaster:
        key = (event_type, from_version)
        if key in UPCASTERS:
            raise ValueError(f"{event_type} v{from_version} already has an upcaster")
        UPCASTERS[key] = fn
        return fn

    return register


def upcast_payload(event_type: str, version: int, current: int, payload: str) -> str:
    """The payload of `event_type` at `version`, brought to `current` (unchanged when already there)."""
    if version >= current:
        return payload
    try:
        data = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise UpcastError(f"the payload is not JSON that can be read ({type(exc).__name__})") from None
    for step in range(version, current):
        fn = UPCASTERS.get((event_type, step))
        if fn is None:
            raise UpcastError(f"no upcaster from version {step} of {event_type}")
        data = fn(data)
    return json.dumps(data, ensure_ascii=False)

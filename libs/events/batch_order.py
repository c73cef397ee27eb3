"""Which earlier entries of an order key are still unsettled, for a BatchConsumer keeping each key in stream
order (batches.py): the entries other consumers of the group hold, and this consumer's own that failed and
wait to be retried.

Other consumers' entries come from the group's pending list (XPENDING: one call when nobody else holds
anything), their keys read once each (XRANGE) and remembered while they stay pending. This consumer's own
failures are noted when their batch ends (`note`) and stay noted until settled; before each use they are
checked against its pending list, so one another consumer took, or a replay settled, no longer holds its key
back. An unsettled entry pending for `min_idle_ms` or more (its consumer dead, or a failure whose retry is
due) sets `reclaim_now`, for the consumer to reclaim it at once and handle it before the entries it holds back.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterable
from typing import Protocol

from libs.events.bus import EventBus
from libs.events.envelope import Envelope

__all__ = ["KeyOrder", "position", "readable", "text"]


def position(entry_id: str) -> tuple[int, int]:
    """A stream entry id ("<ms>-<seq>") as something that sorts in stream order."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def readable(value: bytes | str) -> str:
    """`value` as text even where it is not valid UTF-8 (bad bytes replaced): for a dead letter's copy."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class _Ordered(Protocol):
    entry_id: str
    order: Hashable


def _firsts(ordered: Iterable[tuple[str, Hashable]]) -> dict[Hashable, tuple[int, int]]:
    """Order key -> position of its first entry."""
    first: dict[Hashable, tuple[int, int]] = {}
    for entry_id, order in ordered:
        if order is not None:
            at = position(entry_id)
            if order not in first or at < first[order]:
                first[order] = at
    return first


class KeyOrder:
    def __init__(self, bus: EventBus, key: str, group: str, consumer: str,
                 order_key: Callable[[Envelope], Hashable]) -> None:
        self.bus, self.key, self.group, self.consumer, self.order_key = bus, key, group, consumer, order_key
        self.foreign: dict[str, Hashable] = {}  # other consumers' pending entries: id -> order (None: unknown)
        self.retrying: dict[str, Hashable] = {}  # ours that failed and wait to be retried: id -> order
        self.reclaim_now = False

    def note(self, entries: Iterable[_Ordered], settled: set[str]) -> None:
        """A batch of ours ended: what it settled is done; the rest waits to be retried."""
        for entry in entries:
            if entry.entry_id in settled:
                self.retrying.pop(entry.entry_id, None)
            else:
                self.retrying[entry.entry_id] = entry.order

    def first_retrying(self) -> dict[Hashable, tuple[int, int]]:
        """Order key -> position of the first entry of ours waiting to be retried."""
        return _firsts(self.retrying.items())

    async def first_unsettled(self, entries: list[_Ordered], held: set[str]) -> dict[Hashable, tuple[int, int]]:
        """Order key -> position of the first unsettled entry up to the last of `entries`: another consumer's, or
        ours waiting to be retried. `held`: the entries this consumer handles now or has parked."""
        redis = await self.bus.redis()
        # Ours first: one another consumer takes meanwhile is in its pending list, read next.
        if self.retrying:  # every pending entry of ours they span can be read back: what we hold, and they
            await self._still_retrying(len(self.retrying) + len(held) + len(entries))
        summary = await redis.xpending(self.key, self.group)
        others = [(text(c["name"]), c["pending"]) for c in summary["consumers"]
                  if text(c["name"]) != self.consumer and c["pending"]]
        if not others:
            self.foreign.clear()
            return self.first_retrying()
        last = max((e.entry_id for e in entries), key=position)
        foreign, idle = [], set()
        for name, count in others:  # each consumer's whole pending list up to `last`
            for p in await redis.xpending_range(self.key, self.group, min="-", max=last, count=count,
                                                consumername=name):
                foreign.append(text(p["message_id"]))
                if p["time_since_delivered"] >= self.bus.min_idle_ms:
                    idle.add(foreign[-1])
        unknown = [i for i in foreign if i not in self.foreign]
        self.foreign = {i: self.foreign[i] for i in foreign if i in self.foreign}
        if unknown:
            pipe = redis.pipeline(transaction=False)
            for entry_id in unknown:
                pipe.xrange(self.key, entry_id, entry_id, count=1)
            for entry_id, found in zip(unknown, await pipe.execute(), strict=True):
                self.foreign[entry_id] = self._order_of(found[0][1]) if found else None
        if any(self.foreign.get(entry_id) is not None for entry_id in idle):
            self.reclaim_now = True
        return _firsts(itertools.chain(self.foreign.items(), self.retrying.items()))

    async def _still_retrying(self, most: int) -> None:
        """Keep noted only the entries still pending here; one XPENDING over the range of ids they span, for at
        most `most` entries (what else this consumer holds there counts too)."""
        ids = sorted(self.retrying, key=position)
        pending = {text(p["message_id"]): p["time_since_delivered"] for p in await (await self.bus.redis())
                   .xpending_range(self.key, self.group, min=ids[0], max=ids[-1], count=most,
                                   consumername=self.consumer)}
        for entry_id in ids:
            if entry_id not in pending:  # (a batch that ended meanwhile may have settled it already)
                self.retrying.pop(entry_id, None)
            elif pending[entry_id] >= self.bus.min_idle_ms:
                self.reclaim_now = True

    def reset(self) -> None:
        """Reading starts over (Redis was away): what is pending here is read back from the stream."""
        self.retrying.clear()

    def _order_of(self, fields: dict) -> Hashable:
        """The order of another consumer's entry, read without admitting it (None: it has none; its own
        consumer dead-letters it)."""
        try:
            envelope = Envelope.from_fields({text(k): text(v) for k, v in fields.items()})
            return envelope.tenant_id, self.order_key(envelope)
        except Exception:  # noqa: BLE001 - whatever it is, its own consumer admits or dead-letters it
            return None

"""KeyOrder (libs/events/batch_order.py) between its awaits: a batch that ends while the consumer reads back its
pending entries may settle one of the entries being checked, and nothing may fail for it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from libs.events.batch_order import KeyOrder


class _PendingWhileABatchEnds:
    """A bus whose XPENDING answers after `during` ran (a batch of the consumer ending at that moment)."""

    min_idle_ms = 1_000

    def __init__(self, during) -> None:
        self.during = during

    async def redis(self):
        return self

    async def xpending_range(self, key, group, *, min, max, count, consumername):
        await asyncio.sleep(0)
        self.during()
        return []  # neither entry is pending here any more


async def test_an_entry_settled_while_its_pending_state_is_read_back_is_simply_forgotten() -> None:
    order: KeyOrder | None = None

    def batch_ends() -> None:
        assert order is not None
        order.note([SimpleNamespace(entry_id="1-0", order=("t", "ann"))], settled={"1-0"})

    order = KeyOrder(_PendingWhileABatchEnds(batch_ends), "stream", "g", "c1", lambda envelope: "")
    order.note([SimpleNamespace(entry_id="1-0", order=("t", "ann")), SimpleNamespace(entry_id="2-0", order=("t", "bob"))],
               settled=set())
    await order._still_retrying(10)
    assert order.retrying == {}

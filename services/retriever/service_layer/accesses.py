"""Accesses: memories returned by searches, reported in batches on `mnemesh.memory.access` so the write
side can raise their engagement. At most one event per (tenant, user) per flush; a failed publish keeps
the batch for the next flush (engagement is a soft signal: a crash may lose one interval's accesses)."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

__all__ = ["AccessBatcher"]

log = logging.getLogger("mnemesh.retriever.accesses")

Publish = Callable[[str, str, list[str], datetime], Awaitable[None]]


class AccessBatcher:
    def __init__(self, publish: Publish, *, max_ids: int = 500) -> None:
        self.publish, self.max_ids = publish, max_ids
        self._pending: defaultdict[tuple[str, str], dict[str, None]] = defaultdict(dict)

    def record(self, tenant_id: str, hits) -> None:
        for h in hits:
            self._pending[(tenant_id, h.document.user_id)][h.document.memory_id] = None

    async def flush(self) -> int:
        batches, self._pending = self._pending, defaultdict(dict)
        sent = 0
        for (tenant_id, user_id), ids in batches.items():
            memory_ids = list(ids)
            for start in range(0, len(memory_ids), self.max_ids):
                chunk = memory_ids[start:start + self.max_ids]
                try:
                    await self.publish(tenant_id, user_id, chunk, datetime.now(UTC))
                except Exception as exc:  # noqa: BLE001 - classified: transient kept, permanent dropped
                    from libs.transient import is_transient

                    if not is_transient(exc):
                        log.exception("access batch dropped: it can never be published")
                        continue
                    for m in chunk:  # kept for the next flush
                        self._pending[(tenant_id, user_id)][m] = None
                    continue
                sent += len(chunk)
        return sent

    async def run(self, every_seconds: float = 5.0) -> None:
        """Flush every `every_seconds`, and once more when cancelled (the service stopping): background
        tasks stop before the bus does, so the last accesses still go out."""
        try:
            while True:
                await asyncio.sleep(every_seconds)
                await self.flush()
        finally:
            await asyncio.shield(self.flush())

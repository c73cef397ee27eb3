"""One LISTEN connection per channel and process, fanned out to every waiter.

Subscribers (one per device following a session, say) must not each hold a
PostgreSQL connection: they wait here, woken by NOTIFY or by their own timeout.
A waiter takes a mark *before* it reads, and a notification that arrives
between its read and its wait still wakes it. The listener reconnects after a
lost connection; waiters fall back to their timeouts meanwhile, so nothing is
missed, only seen later.
"""

from __future__ import annotations

import asyncio
import contextlib

import psycopg
from psycopg import sql

from libs.logs import get_logger

__all__ = ["Notifier"]

log = get_logger(__name__)


class Notifier:
    def __init__(self, connect, channel: str) -> None:
        self._connect, self.channel = connect, channel
        self._generation = 0
        self._changed = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.listening = asyncio.Event()

    def mark(self) -> int:
        """Take before reading; pass to wait()."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._listen(), name=f"listen {self.channel}")
        return self._generation

    async def wait(self, mark: int, timeout: float) -> None:
        """Return once a notification came after `mark`, or after `timeout` seconds."""
        if self._generation != mark:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._changed.wait()

    def _notified(self) -> None:
        self._generation += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _listen(self) -> None:
        backoff = 0.5
        while True:
            try:
                conn = await self._connect()
                try:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    self.listening.set()
                    self._notified()  # anything may have happened while we were not listening
                    backoff = 0.5
                    async for _ in conn.notifies():
                        self._notified()
                finally:
                    self.listening.clear()
                    await asyncio.shield(conn.close())
            except (psycopg.OperationalError, OSError) as exc:
                log.warning("lost the LISTEN connection; reconnecting", channel=self.channel, error=str(exc))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

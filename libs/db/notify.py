"""One LISTEN connection per channel and process, fanned out to the waiters of each key.

Subscribers (one per device following a session, say) must not each hold a
PostgreSQL connection: they wait here, woken by NOTIFY or by their own timeout.
The payload of a notification is a key (the event store sends the stream id):
a waiter on that key, and every waiter on no key, wakes; the others sleep on.
A waiter takes a mark *before* it reads, and a notification that arrives
between its read and its wait still wakes it. The listener reconnects after a
lost connection and then wakes everyone (anything may have happened meanwhile);
waiters fall back to their timeouts until then, so nothing is missed, only seen later.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import asyncpg

from libs.logs import get_logger

__all__ = ["Notifier"]

log = get_logger(__name__)
_HEARTBEAT_SECONDS = 5.0  # a silent dead connection is noticed within this
_MAX_IDLE_KEYS = 10_000


class _Key:
    __slots__ = ("changed", "generation", "waiters")

    def __init__(self) -> None:
        self.generation, self.waiters, self.changed = 0, 0, asyncio.Event()

    def bump(self) -> None:
        self.generation += 1
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()


class Notifier:
    def __init__(self, connect: Callable[[], Awaitable[asyncpg.Connection]], channel: str) -> None:
        self._connect, self.channel = connect, channel
        self._any = _Key()  # waiters on every notification
        self._keys: dict[str, _Key] = {}
        self._task: asyncio.Task | None = None
        self.listening = asyncio.Event()
        self.received = 0  # notifications seen, for tests and metrics

    def mark(self, key: str | None = None) -> int:
        """Take before reading; pass to wait() with the same key."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._listen(), name=f"listen {self.channel}")
        if key is None:
            return self._any.generation
        return self._keys.setdefault(key, _Key()).generation

    async def wait(self, mark: int, timeout: float, key: str | None = None) -> None:
        """Return once a notification for `key` (any, when None) came after `mark`, or after `timeout` s."""
        state = self._any if key is None else self._keys.setdefault(key, _Key())
        if state.generation != mark:
            return
        state.waiters += 1
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await state.changed.wait()
        finally:
            state.waiters -= 1
        if len(self._keys) > _MAX_IDLE_KEYS:
            # Forget keys nobody waits on. A reader that marked one of them and waits later may
            # miss one wake-up and sleep out its timeout: late, never lost.
            self._keys = {k: v for k, v in self._keys.items() if v.waiters}

    def _notified(self, payload: str | None) -> None:
        self.received += 1
        self._any.bump()
        if payload is None:  # reconnected: wake everyone
            for state in self._keys.values():
                state.bump()
        elif (state := self._keys.get(payload)) is not None:
            state.bump()

    async def _listen(self) -> None:
        backoff = 0.5
        while True:
            try:
                conn = await self._connect()
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _conn, lost=lost: lost.set())
                try:
                    await conn.add_listener(self.channel, lambda _c, _pid, _ch, payload: self._notified(payload))
                    self.listening.set()
                    self._notified(None)  # anything may have happened while we were not listening
                    backoff = 0.5
                    while not lost.is_set():
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(_HEARTBEAT_SECONDS):
                                await lost.wait()
                        if not lost.is_set():
                            await conn.execute("SELECT 1")
                    raise ConnectionError("the LISTEN connection was closed")
                finally:
                    self.listening.clear()
                    await asyncio.shield(self._close(conn))
            except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError) as exc:
                log.warning("lost the LISTEN connection; reconnecting", channel=self.channel, error=str(exc))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    @staticmethod
    async def _close(conn: asyncpg.Connection) -> None:
        if not conn.is_closed():
            try:
                await asyncio.wait_for(conn.close(), 2)
            except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError):
                conn.terminate()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

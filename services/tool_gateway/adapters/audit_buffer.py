"""The call log off the call's path: audit rows and tool.called events written in batches.

Writing each call's row and event in a transaction of its own costs about six PostgreSQL round
trips per call, on the call's path. Here `record` only builds the row and its event (in the
call's trace) and queues them; a flusher writes what is queued every `flush_seconds` or as soon
as `batch` rows wait, one transaction per tenant and batch (PostgresCallLog.write).

Nothing is lost on the way:
- rows leave the queue only once their transaction committed; a failed flush keeps them and is
  retried with backoff (PostgreSQL away for a moment costs latency of the audit, not rows);
- the queue is bounded (`capacity`): when it is full a call waits for room, and after
  `full_wait_seconds` fails with a TimeoutError (transient: the entry points answer `unavailable`), as a
  call did when its own audit write failed;
- `close` (a service closer, run after the entry points have drained) writes what is left;
- `find` (GetCall) flushes first, so a caller sees its own call at once on this replica; another
  replica sees it within a flush interval.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

from libs.logs import get_logger
from libs.transient import is_transient
from services.tool_gateway.adapters.postgres import Prepared
from services.tool_gateway.domain import CallRecord

__all__ = ["BatchWriter", "BufferedCallLog"]

log = get_logger(__name__)


class BatchWriter(Protocol):
    def prepare(self, record: CallRecord) -> Prepared:
        ...

    async def write(self, prepared: list[Prepared]) -> None:
        ...

    async def find(self, tenant_id: str, call_id: str) -> CallRecord | None:
        ...


class BufferedCallLog:
    def __init__(self, writer: BatchWriter, *, flush_seconds: float = 0.005, batch: int = 256,
                 capacity: int = 20_000, full_wait_seconds: float = 5.0, retry_cap_seconds: float = 2.0) -> None:
        self.writer = writer
        self.flush_seconds, self.batch, self.capacity = flush_seconds, batch, capacity
        self.full_wait_seconds, self.retry_cap_seconds = full_wait_seconds, retry_cap_seconds
        self._queue: list[Prepared] = []
        self._waiting = asyncio.Event()  # something is queued
        self._full_batch = asyncio.Event()  # a whole batch is queued: flush now
        self._room = asyncio.Event()  # the queue has room again
        self._lock = asyncio.Lock()  # one flush at a time, so rows go out in the order they came
        self._task: asyncio.Task | None = None
        self._closed = False
        self.written = 0  # rows committed, for tests and the benchmark

    @property
    def queued(self) -> int:
        return len(self._queue)

    async def record(self, record: CallRecord) -> None:
        prepared = self.writer.prepare(record)
        if self._closed:  # stopping: nothing flushes any more, so write it now
            await self.writer.write([prepared])
            return
        while len(self._queue) >= self.capacity:
            self._room.clear()
            try:
                async with asyncio.timeout(self.full_wait_seconds):
                    await self._room.wait()
            except TimeoutError:
                # Transient, as a failed write of its own was: the entry points answer `unavailable`.
                raise TimeoutError(f"the audit log is {len(self._queue)} calls behind") from None
        self._queue.append(prepared)
        self._waiting.set()
        if len(self._queue) >= self.batch:
            self._full_batch.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="audit flusher")

    async def find(self, tenant_id: str, call_id: str) -> CallRecord | None:
        await self.flush()
        return await self.writer.find(tenant_id, call_id)

    async def flush(self) -> None:
        """Write everything queued until now; raises (keeping the rows) when a write fails."""
        async with self._lock:
            while self._queue:
                chunk = self._queue[:self.batch]
                await self.writer.write(chunk)
                del self._queue[:len(chunk)]  # only ever appended to at the end meanwhile
                self.written += len(chunk)
                self._room.set()
            self._waiting.clear()
            self._full_batch.clear()

    async def _run(self) -> None:
        delay = 0.05
        while True:
            await self._waiting.wait()
            with contextlib.suppress(TimeoutError):  # gather a batch for at most flush_seconds
                async with asyncio.timeout(self.flush_seconds):
                    await self._full_batch.wait()
            try:
                await self.flush()
                delay = 0.05
                continue
            except Exception as exc:  # noqa: BLE001 - transient: keep the rows and retry; otherwise see below
                error = exc
            if not is_transient(error) and await self._write_one_by_one():
                continue
            log.warning("audit rows not written yet; retrying", queued=len(self._queue), error=str(error)[:200],
                        retry_in_s=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.retry_cap_seconds)

    async def _write_one_by_one(self) -> bool:
        """A batch failed for a reason other than the database being away: find the row that cannot be
        written, log it (it would block every row behind it for ever) and write the others.
        False when the database went away meanwhile (the rows left are retried)."""
        async with self._lock:
            while self._queue:
                record = self._queue[0][0]
                try:
                    await self.writer.write(self._queue[:1])
                    self.written += 1
                except Exception as exc:  # noqa: BLE001 - transient ones go back to the retry loop
                    if is_transient(exc):
                        return False
                    log.exception("an audit row cannot be written; dropped", call_id=record.call_id,
                                  tool=record.tool, tenant=record.tenant_id)
                del self._queue[0]
                self._room.set()
            self._waiting.clear()
            self._full_batch.clear()
        return True

    async def close(self) -> None:
        """Stop the flusher and write what is left (the service's entry points have stopped by now)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            await self.flush()
        except Exception:  # noqa: BLE001 - at shutdown there is no later: say what is lost
            log.exception("audit rows could not be written at shutdown", lost=len(self._queue))

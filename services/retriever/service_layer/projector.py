"""The projector: writes the vectors of recorded documents, in batches, as soon as they commit.

Stream handlers only record a memory.written (one short transaction per event, idempotent by event id);
the expensive part, embedding and the index upsert, runs here over every document recorded meanwhile,
so under load the model sees full batches and the index one upsert per batch. The queue is the
`projected` flag in PostgreSQL: a crash loses nothing (the next process takes the rest), and a
forget holds the memory's lock, so a projector never brings a forgotten memory back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from libs.transient import is_transient
from services.retriever.service_layer.handlers import PROJECTION_BATCH, Retrieval, project_pending
from services.retriever.service_layer.ports import DocumentStore

__all__ = ["Projector"]

log = logging.getLogger("mnemesh.retriever.projector")

# mark() -> a token taken before reading; wait(token, timeout) returns once something was recorded after it.
Mark = Callable[[], int]
Wait = Callable[[int, float], Awaitable[None]]


class Projector:
    def __init__(self, store: DocumentStore, retrieval: Retrieval, mark: Mark, wait: Wait, *,
                 batch: int = PROJECTION_BATCH, poll_seconds: float = 2.0) -> None:
        self.store, self.retrieval, self.batch = store, retrieval, batch
        self.mark, self.wait, self.poll_seconds = mark, wait, poll_seconds
        self.projected = 0
        self._limit = batch

    async def drain(self) -> int:
        """Project until nothing recorded is left (or what is left is locked by someone else); how many."""
        total = 0
        while n := await project_pending(self.store, self.retrieval, self._limit):
            total += n
            self.projected += n
        self._limit = self.batch
        return total

    async def run(self) -> None:
        """Forever: drain, then sleep until a document is recorded (or `poll_seconds`: another replica's
        leftovers, a lost notification). A transient failure (the index or the database away) backs off
        and retries; the documents stay recorded meanwhile."""
        backoff = 0.1
        while True:
            mark = self.mark()
            try:
                await self.drain()
                backoff = 0.1
            except Exception as exc:  # the projector's top level: classified, logged, retried
                if not is_transient(exc):  # isolate the culprit: one document at a time until a drain succeeds
                    log.exception("projection batch failed; retrying one document at a time")
                    self._limit = 1
                else:
                    log.warning("projection waits for its infrastructure: %s", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            await self.wait(mark, self.poll_seconds)

"""Coalesce concurrent embedding requests into model-sized batches, run on the model's own thread.

Each caller awaits its own vectors. One thread per model takes whatever is pending (up to the model's
batch size), runs one forward pass, hands the vectors back to the callers' event loops and takes the
next batch at once: the model never waits for an event loop that is busy with something else (a
segmentation, a database reply, a search) to be handed its next batch, and the loop never blocks on it.
A new request wakes the thread on the loop's next turn, so the requests made in one turn (concurrent
callers) coalesce into one batch. The thread ends after a few idle seconds and starts again on demand.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque

from services.retriever.service_layer.ports import Embedder

__all__ = ["BatchingEmbedder"]

_Item = tuple[str, asyncio.Future, asyncio.AbstractEventLoop]


def _settle(results: list[tuple[asyncio.Future, object, BaseException | None]]) -> None:
    """On the caller's loop: hand each caller its vector (or the batch's error); a cancelled caller is skipped."""
    for future, vector, error in results:
        if future.done():
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(vector)


class BatchingEmbedder:
    idle_seconds = 2.0  # the model's thread ends after this long with nothing to embed

    def __init__(self, embedder: Embedder, max_batch: int | None = None) -> None:
        self.embedder = embedder
        self.name, self.dim = embedder.name, embedder.dim
        self.max_batch = max_batch or embedder.batch
        self._pending: deque[_Item] = deque()
        self._ready = threading.Condition()
        self._thread: threading.Thread | None = None
        self._wake_scheduled = False

    async def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in texts]
        with self._ready:
            self._pending.extend((t, f, loop) for t, f in zip(texts, futures, strict=True))
            if not self._wake_scheduled:  # on the loop's next turn: this turn's other callers join the batch
                self._wake_scheduled = True
                loop.call_soon(self._wake)
        return list(await asyncio.gather(*futures))

    def _wake(self) -> None:
        with self._ready:
            self._wake_scheduled = False
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=f"embedder {self.name}", daemon=True)
                self._thread.start()
            else:
                self._ready.notify()

    def _take(self, wait: bool = True) -> list[_Item] | None:
        """The next batch (None: idle long enough, the thread ends; []: nothing now and `wait` is false)."""
        with self._ready:
            if not self._pending:
                if not wait:
                    return []
                self._ready.wait(self.idle_seconds)
            if not self._pending:
                self._thread = None
                return None
            return [self._pending.popleft() for _ in range(min(self.max_batch, len(self._pending)))]

    def _work(self) -> None:
        if hasattr(self.embedder, "submit"):
            return self._work_pipelined()
        while (batch := self._take()) is not None:
            live = [item for item in batch if not item[1].done()]  # a cancelled caller's texts are skipped
            if not live:
                continue
            try:
                self._hand(live, self.embedder.embed([t for t, _, _ in live]), None)
            except Exception as exc:  # noqa: BLE001 - handed to every caller of this batch, who decides
                self._hand(live, None, exc)

    def _work_pipelined(self) -> None:
        """A model in another process (embed_worker.py): the next batch is sent before the answer to the
        one running is read, so the model finds it waiting when it finishes instead of waiting for this
        thread to get the interpreter lock, read the answer and send the next one."""
        inflight: deque[list[_Item]] = deque()
        while True:
            batch = self._take(wait=not inflight)
            if batch is None:
                return
            live = [item for item in batch if not item[1].done()]
            if live:
                try:
                    self.embedder.submit([t for t, _, _ in live])
                    inflight.append(live)
                except Exception as exc:  # noqa: BLE001 - this batch's callers get it
                    self._hand(live, None, exc)
            if inflight and (len(inflight) > 1 or not batch):  # one batch queued behind the running one
                done = inflight.popleft()
                try:
                    self._hand(done, self.embedder.collect(), None)
                except Exception as exc:  # noqa: BLE001 - handed to every caller of this batch, who decides
                    self._hand(done, None, exc)

    def _hand(self, live: list[_Item], vectors, error: BaseException | None) -> None:
        """Each caller's vector (or the batch's error), settled on the caller's own loop."""
        if error is None and len(vectors) != len(live):
            error = RuntimeError(f"embedder {self.name} returned {len(vectors)} vectors for {len(live)} texts")
        if error is None:
            results = [(future, vector, None) for (_, future, _), vector in zip(live, vectors, strict=True)]
        else:
            results = [(future, None, error) for _, future, _ in live]
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for (_, _, loop), result in zip(live, results, strict=True):
            by_loop.setdefault(loop, []).append(result)
        for loop, results in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle, results)
            except RuntimeError:  # that loop is closed: nobody awaits these vectors any more
                pass

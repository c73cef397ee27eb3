"""Coalesce concurrent embedding requests into model-sized batches, run off the event loop.

Each caller awaits its own vectors; one worker takes whatever is pending (up to the model's
batch size) and runs one forward pass in a thread, so under load the model sees full batches
and the event loop never blocks.
"""

from __future__ import annotations

import asyncio

from services.retriever.service_layer.ports import Embedder

__all__ = ["BatchingEmbedder"]


class BatchingEmbedder:
    def __init__(self, embedder: Embedder, max_batch: int | None = None) -> None:
        self.embedder = embedder
        self.name, self.dim = embedder.name, embedder.dim
        self.max_batch = max_batch or embedder.batch
        self._pending: list[tuple[str, asyncio.Future]] = []
        self._worker: asyncio.Task | None = None

    async def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in texts]
        self._pending.extend(zip(texts, futures, strict=True))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        return list(await asyncio.gather(*futures))

    async def _drain(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch:]
            live = [(t, f) for t, f in batch if not f.done()]  # a cancelled caller's texts are skipped
            if not live:
                continue
            try:
                vectors = await asyncio.to_thread(self.embedder.embed, [t for t, _ in live])
            except Exception as exc:  # noqa: BLE001 - handed to every caller of this batch, who decides
                for _, f in live:
                    if not f.done():
                        f.set_exception(exc)
                continue
            for (_, f), v in zip(live, vectors, strict=True):
                if not f.done():
                    f.set_result(v)

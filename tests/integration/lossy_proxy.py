"""A TCP proxy that can hold back the bytes of one direction: an answer lost (late) on the network.

Bytes are forwarded in order. While a hold window is open, each chunk read from the held direction is
released `delay` seconds after it arrived; chunks read after the window wait only behind the held ones
(order is kept, so HTTP/2 framing stays intact). Nothing is dropped or rewritten.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

__all__ = ["LossyProxy", "lossy_proxy"]


class LossyProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._hold_until = {"responses": 0.0, "requests": 0.0}
        self._delay = {"responses": 0.0, "requests": 0.0}
        self._tasks: set[asyncio.Task] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def hold(self, direction: str, delay: float, window: float) -> None:
        """For the next `window` seconds, deliver what flows in `direction` `delay` seconds late."""
        self._hold_until[direction] = time.monotonic() + window
        self._delay[direction] = delay

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):  # the pumps see the end of their streams and return
            writer.close()
        _done, stuck = await asyncio.wait(set(self._tasks), timeout=5) if self._tasks else (set(), set())
        for task in stuck:
            task.cancel()
        await asyncio.gather(*stuck, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        self._writers.add(client_w)
        try:
            upstream_r, upstream_w = await asyncio.open_connection(*self.target)
            self._writers.add(upstream_w)
            try:
                await asyncio.gather(self._pump(client_r, upstream_w, "requests"),
                                     self._pump(upstream_r, client_w, "responses"))
            finally:
                upstream_w.close()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            client_w.close()
            self._tasks.discard(task)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, direction: str) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                release_at, data = await queue.get()
                if not data:
                    return
                await asyncio.sleep(max(0.0, release_at - time.monotonic()))
                sink.write(data)
                await sink.drain()

        delivering = asyncio.create_task(deliver())
        last = 0.0
        try:
            while data := await source.read(65536):
                now = time.monotonic()
                delay = self._delay[direction] if now < self._hold_until[direction] else 0.0
                last = max(last, now + delay)
                queue.put_nowait((last, data))
            queue.put_nowait((last, b""))
            await delivering
        finally:
            delivering.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await delivering
            with contextlib.suppress(OSError, RuntimeError):
                sink.write_eof()


@contextlib.asynccontextmanager
async def lossy_proxy(target: str) -> AsyncIterator[LossyProxy]:
    host, port = target.rsplit(":", 1)
    proxy = LossyProxy(host, int(port))
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()

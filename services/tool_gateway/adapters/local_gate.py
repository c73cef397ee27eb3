"""Rate limit and breaker of a call answered mostly from this replica's memory, still bounded across replicas.

The shared gate (redis_state.RedisGate) costs one Redis round trip per call. Here:

- rate limit: each bucket's tokens are still taken from the shared bucket in Redis, never made up
  locally, but a replica takes up to `batch_seconds` worth of the bucket's rate at once (at least
  one, at most `max_batch`) and spends the spare ones on its next calls. A token kept is one
  another replica cannot take, so the shared bound holds up to what replicas hold: calls admitted
  over any interval are at most the bucket's burst plus its refill, plus the spare tokens replicas
  held when the interval began — at most one batch per bucket and replica. A bucket whose rate
  gives a batch of one (below 1 / `batch_seconds` calls/s, 20/s by default) behaves exactly as
  before: a token per call, taken in the call's round trip. Spare tokens are dropped after
  `hold_seconds`; one round trip per bucket takes a batch at a time (other calls meanwhile take one
  token each), so concurrency does not multiply what a replica holds;
- breaker: a "closed" answer from Redis is trusted for `RedisBreakers.cache_seconds`; within it a
  call whose buckets all have a spare token is admitted without a round trip. A breaker that another
  replica opens is seen here within that interval (this replica's own failures ask Redis at once);
  an open or half-open breaker is never cached: every call asks, so the single half-open probe
  stays single across replicas;
- top-up: a call admitted locally that finds a bucket under half its batch, or the breaker's trust
  past half its time, starts one background round trip (`TOP_UP`: whole tokens up to the batch, no
  wait, the breaker's state read without taking a probe), so calls rarely wait for Redis.

Refusals are those of the shared gate, word for word: the wait from Redis, the breaker's state.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from libs.logs import get_logger
from services.tool_gateway.adapters.redis_state import GATE_N, TOP_UP, RedisBreakers, RedisRateLimiter

__all__ = ["LocalGate"]

log = get_logger(__name__)
_MAX_BUCKETS = 16_384  # buckets a replica holds spare tokens of; past it, expired ones are dropped


class LocalGate:
    def __init__(self, limiter: RedisRateLimiter, breakers: RedisBreakers, *, batch_seconds: float = 0.05,
                 max_batch: int = 64, hold_seconds: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limiter, self.breakers = limiter, breakers
        self.batch_seconds, self.max_batch, self.hold_seconds, self.clock = (batch_seconds, max_batch,
                                                                             hold_seconds, clock)
        self._spare: dict[str, list[float]] = {}  # bucket -> [tokens, dropped at]
        self._refilling: set[str] = set()  # buckets a round trip is taking a batch of now
        self._topping: set[tuple] = set()  # (breaker, buckets...) a top-up is under way for
        self._tasks: set[asyncio.Task] = set()
        self._asking: dict[str, asyncio.Future] = {}  # breaker -> the call asking Redis for it now

    def batch(self, rate: float) -> int:
        """How many tokens of a bucket of `rate` calls/s one round trip takes."""
        return max(1, min(self.max_batch, int(rate * self.batch_seconds)))

    def held(self, bucket: str) -> int:
        """Spare tokens of `bucket` this replica holds now (tests, the README's bound)."""
        spare = self._spare.get(bucket)
        return int(spare[0]) if spare is not None and spare[1] > self.clock() else 0

    def _take_local(self, key: str, now: float) -> bool:
        spare = self._spare.get(key)
        if spare is None or spare[0] < 1 or spare[1] <= now:
            return False
        spare[0] -= 1
        return True

    def _give_back(self, key: str) -> None:
        spare = self._spare.get(key)
        if spare is not None:
            spare[0] += 1

    def _keep(self, key: str, tokens: int, now: float) -> None:
        if len(self._spare) >= _MAX_BUCKETS:
            self._spare = {k: v for k, v in self._spare.items() if v[1] > now and v[0] >= 1}
        spare = self._spare.get(key)
        if spare is None or spare[1] <= now:
            self._spare[key] = [float(tokens), now + self.hold_seconds]
        else:
            spare[0] += tokens

    def _maybe_top_up(self, keys: list[tuple[str, float]], tool: str) -> None:
        """Start one background round trip when a bucket runs low (under half its batch) or the breaker's
        trust is past half its time, so that calls rarely wait for Redis themselves."""
        now = self.clock()
        wants = []
        for key, rate in keys:
            batch = self.batch(rate)
            spare = self._spare.get(key)
            held = int(spare[0]) if spare is not None and spare[1] > now else 0
            wants.append(batch - held if batch > 1 and held < batch / 2 and key not in self._refilling else 0)
        if not any(wants) and not self.breakers.stale_soon(tool):
            return
        flight = (tool, *(key for key, _ in keys))
        if flight in self._topping:
            return
        for (key, _), want in zip(keys, wants, strict=True):
            if want:
                self._refilling.add(key)
        self._topping.add(flight)
        task = asyncio.create_task(self._top_up(keys, wants, tool, flight), name="gate top-up")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _top_up(self, keys: list[tuple[str, float]], wants: list[int], tool: str, flight: tuple) -> None:
        try:
            answer = await self.limiter.run_script(
                TOP_UP, [*(key for key, _ in keys), self.breakers.key(tool)],
                [*(repr(float(rate)) for _, rate in keys), *wants])
        except Exception as exc:  # noqa: BLE001 - the next call asks Redis itself; nothing is lost
            log.debug("gate top-up failed", error=str(exc)[:200])
            return
        finally:
            self._topping.discard(flight)
            self._refilling.difference_update(key for (key, _), want in zip(keys, wants, strict=True) if want)
        now = self.clock()
        for (key, _), granted in zip(keys, answer[:-1], strict=True):
            if int(granted) > 0:
                self._keep(key, int(granted), now)
        self.breakers.renew(tool, _decoded(answer[-1]))

    async def close(self) -> None:
        """Stop the top-ups under way (their tokens are only dropped, as at any replica's end)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def admit(self, buckets: list[tuple[str, float]], tool: str,
                    probe_seconds: float) -> tuple[float, bool, str, float]:
        now = self.clock()
        keys = [(self.limiter.key(name), rate) for name, rate in buckets]
        local = [key for key, _ in keys if self._take_local(key, now)]  # spent now: no other call gets them
        remote = [(key, rate) for key, rate in keys if key not in local]
        if not remote and self.breakers.trusted_closed(tool):
            self._maybe_top_up(keys, tool)
            return 0.0, True, "closed", 0.0
        asking = self._asking.get(tool) if not remote else None
        if asking is not None:  # another call is asking for this breaker: its answer serves this one too
            try:
                await asyncio.shield(asking)
            except BaseException:
                for key in local:
                    self._give_back(key)
                raise
            if self.breakers.trusted_closed(tool):
                return 0.0, True, "closed", 0.0
        wants, refills = [], []
        for key, rate in remote:
            want = self.batch(rate)
            if want > 1 and key not in self._refilling:
                self._refilling.add(key)
                refills.append(key)
            else:
                want = 1
            wants.append(want)
        if not remote and tool not in self._asking:
            self._asking[tool] = asking = asyncio.get_running_loop().create_future()
        try:
            answer = await self.limiter.run_script(
                GATE_N, [*(key for key, _ in remote), self.breakers.key(tool)],
                [*(repr(float(rate)) for _, rate in remote), *wants, repr(self.breakers.settings.open_seconds),
                 repr(float(probe_seconds))])
        except BaseException:
            for key in local:
                self._give_back(key)
            raise
        finally:
            self._refilling.difference_update(refills)
            if asking is not None and self._asking.get(tool) is asking:
                del self._asking[tool]
                asking.set_result(None)  # after observe() below has run: the waiters resume later
        wait, admitted, state, retry_after = float(answer[0]), bool(answer[1]), _decoded(answer[2]), float(answer[3])
        if wait > 0:  # none taken, as the shared gate: the tokens spent above go back
            for key in local:
                self._give_back(key)
            return wait, False, "", 0.0
        now = self.clock()
        for (key, _), granted in zip(remote, answer[4:], strict=True):
            if int(granted) > 1:
                self._keep(key, int(granted) - 1, now)
        self.breakers.observe(tool, state)
        return 0.0, admitted, state, retry_after


def _decoded(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

"""Call-pipeline state shared by every gateway replica, in Redis: rate limits, breakers, full results.

Each decision is one Lua script (atomic on the server, one round trip) that reads the server's
clock, so replicas agree without synchronised clocks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from libs.logs import get_logger
from libs.validation import TENANT_ID_RULE, is_tenant_id
from services.tool_gateway.domain.rollout import ArmCounts

__all__ = ["GATE_N", "TOP_UP", "BreakerSettings", "KeyedStore", "RedisBreakers", "RedisCanaryCounters", "RedisGate", "RedisRateLimiter", "RedisResultStore"]

RedisFactory = Callable[[], Awaitable[Redis]]
_MAX_TRUSTED = 4_096  # breakers whose "closed" a replica remembers at most
log = get_logger(__name__)

# The scripts are built from Lua functions so that the call path runs one script (rate limit, then
# breaker: `_GATE`) and the pieces stay written once.
# Token buckets (rate per second, burst = 2 × rate, at least 1): from each bucket, one token and up to
# `want` in all (as many whole tokens as it holds), or none when any is empty; answer the wait until all
# have one, and what each bucket granted. `take` is `take_n` wanting one token of each.
_TAKE_FN = """
local function take_n(now, keys, rates, wants)
  local wait, state, grants = 0, {}, {}
  for i, key in ipairs(keys) do
    local rate = tonumber(rates[i])
    local burst = math.max(1, rate * 2)
    local b = redis.call('HMGET', key, 'tokens', 'ts')
    local tokens = tonumber(b[1]) or burst
    local ts = tonumber(b[2]) or now
    tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
    if tokens < 1 then wait = math.max(wait, (1 - tokens) / rate) end
    state[i] = {tokens, burst / rate}
  end
  for i, key in ipairs(keys) do
    local tokens, grant = state[i][1], 0
    if wait == 0 then
      grant = math.max(1, math.min(tonumber(wants[i]), math.floor(tokens)))
      tokens = tokens - grant
    end
    grants[i] = grant
    redis.call('HSET', key, 'tokens', tokens, 'ts', now)
    redis.call('PEXPIRE', key, math.ceil(state[i][2] * 1000) + 1000)
  end
  return wait, grants
end

local function take(now, keys, rates)
  local ones = {}
  for i = 1, #keys do ones[i] = 1 end
  local wait = take_n(now, keys, rates, ones)
  return wait
end
"""

# Breaker: one hash {state, failures, opened_at, probe_until, win_start, calls, errors}.
_ADMIT_FN = """
local function admit(now, key, open_s, probe_s)
  local b = redis.call('HMGET', key, 'state', 'opened_at', 'probe_until')
  local state = b[1] or 'closed'
  if state == 'closed' then return {1, state, '0'} end
  if state == 'open' then
    local left = tonumber(b[2]) + open_s - now
    if left > 0 then return {0, state, tostring(left)} end
    redis.call('HSET', key, 'state', 'half_open', 'probe_until', now + probe_s)
    return {1, 'half_open', '0'}
  end
  local busy = tonumber(b[3]) - now
  if busy > 0 then return {0, state, tostring(busy)} end
  redis.call('HSET', key, 'probe_until', now + probe_s)
  return {1, state, '0'}
end
"""

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
"""

_TAKE = _TAKE_FN + _NOW + "return tostring(take(now, KEYS, ARGV))"
_ADMIT = _ADMIT_FN + _NOW + "return admit(now, KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]))"
# KEYS: the buckets, then the breaker; ARGV: their rates, then open and probe seconds. A call the rate
# limit refuses takes no probe of a half-open breaker.
_GATE = _TAKE_FN + _ADMIT_FN + _NOW + """
local n = #KEYS - 1
local keys, rates = {}, {}
for i = 1, n do keys[i], rates[i] = KEYS[i], ARGV[i] end
local wait = take(now, keys, rates)
if wait > 0 then return {tostring(wait), 0, '', '0'} end
local a = admit(now, KEYS[n + 1], tonumber(ARGV[n + 1]), tonumber(ARGV[n + 2]))
return {'0', a[1], a[2], a[3]}
"""

# The gate of a replica that keeps a local allowance (adapters/local_gate.py): from each bucket named, one
# token and up to `want` in all (as many whole tokens as it holds), or none when any is empty. KEYS: the
# buckets, then the breaker; ARGV: their rates, then their wants, then open and probe seconds. Answers
# {wait, admitted, state, retry_after, grant of each bucket...}; no bucket named: the breaker alone.
GATE_N = _TAKE_FN + _ADMIT_FN + _NOW + """
local n = #KEYS - 1
local keys, rates, wants = {}, {}, {}
for i = 1, n do keys[i], rates[i], wants[i] = KEYS[i], ARGV[i], ARGV[n + i] end
local wait, grants = take_n(now, keys, rates, wants)
if wait > 0 then return {tostring(wait), 0, '', '0'} end
local a = admit(now, KEYS[n + 1], tonumber(ARGV[2 * n + 1]), tonumber(ARGV[2 * n + 2]))
local answer = {'0', a[1], a[2], a[3]}
for i = 1, n do answer[4 + i] = grants[i] end
return answer
"""

# A replica's top-up, off any call's path: up to `want` whole tokens of each bucket (none taken from an
# empty one, no wait), and the breaker's state as stored (read only: no probe is taken). KEYS: the buckets,
# then the breaker; ARGV: their rates, then their wants. Answers {grant of each bucket..., state}.
TOP_UP = _NOW + """
local n = #KEYS - 1
local answer = {}
for i = 1, n do
  local rate, want = tonumber(ARGV[i]), tonumber(ARGV[n + i])
  local burst = math.max(1, rate * 2)
  local b = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
  local tokens = tonumber(b[1]) or burst
  local ts = tonumber(b[2]) or now
  tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
  local grant = math.max(0, math.min(want, math.floor(tokens)))
  if grant > 0 then
    redis.call('HSET', KEYS[i], 'tokens', tokens - grant, 'ts', now)
    redis.call('PEXPIRE', KEYS[i], math.ceil(burst / rate * 1000) + 1000)
  end
  answer[i] = grant
end
answer[n + 1] = redis.call('HGET', KEYS[n + 1], 'state') or 'closed'
return answer
"""

# ARGV: successes (applied first, as that many successful calls), then '1' for one failure after them.
_RECORD = _NOW + """
local successes, failed = tonumber(ARGV[1]), ARGV[2] == '1'
local max_failures, max_rate = tonumber(ARGV[3]), tonumber(ARGV[4])
local min_calls, window = tonumber(ARGV[5]), tonumber(ARGV[6])
local b = redis.call('HMGET', KEYS[1], 'state', 'failures', 'win_start', 'calls', 'errors')
local state = b[1] or 'closed'
if state == 'half_open' then
  if not failed then
    redis.call('DEL', KEYS[1])
    return 'closed'
  end
  redis.call('HSET', KEYS[1], 'state', 'open', 'opened_at', now)
  return 'open'
end
if state == 'open' then return 'open' end
local failures, calls, errors = tonumber(b[2]) or 0, tonumber(b[4]) or 0, tonumber(b[5]) or 0
local win_start = tonumber(b[3]) or now
if now - win_start >= window then win_start, calls, errors = now, 0, 0 end
calls = calls + successes
if successes > 0 then failures = 0 end
if failed then failures, errors, calls = failures + 1, errors + 1, calls + 1 end
if failures >= max_failures or (calls >= min_calls and errors / calls >= max_rate) then
  redis.call('HSET', KEYS[1], 'state', 'open', 'opened_at', now, 'failures', 0, 'win_start', now,
             'calls', 0, 'errors', 0)
  return 'open'
end
redis.call('HSET', KEYS[1], 'state', 'closed', 'failures', failures, 'win_start', win_start, 'calls', calls,
           'errors', errors)
return 'closed'
"""


class KeyedStore:
    """A Redis-backed store whose keys follow the gateway's naming: `<namespace>.tool-gateway.<kind>.<name>`."""

    def __init__(self, redis: RedisFactory, namespace: str, kind: str) -> None:
        self._redis, self._prefix = redis, f"{namespace}.tool-gateway.{kind}." if namespace else \
            f"tool-gateway.{kind}."
        self._scripts: dict[str, tuple[Redis, AsyncScript]] = {}

    def key(self, name: str) -> str:
        return self._prefix + name

    def tenant_key(self, tenant_id: str, *parts: str) -> str:
        """The key of a tenant's `parts`, built here only: `<prefix><tenant>:<part>:<part>...`. A tenant id holds
        no ':' (TENANT_ID) and each part is percent-encoded (':' and '%' included), so two different (tenant,
        parts) never share a key: tenant "acme" chain "eu.trip-1" is not tenant "acme.eu" chain "trip-1"."""
        if not is_tenant_id(tenant_id):
            raise ValueError(f"tenant {tenant_id[:64]!r} must be {TENANT_ID_RULE}")
        return self._prefix + ":".join([tenant_id, *(quote(part, safe="") for part in parts)])

    async def _script(self, source: str) -> AsyncScript:
        """`source` as a script of the current client: run by EVALSHA, its body sent once, not every call."""
        client = await self._redis()
        held = self._scripts.get(source)
        if held is None or held[0] is not client:
            held = self._scripts[source] = (client, client.register_script(source))
        return held[1]

    async def run_script(self, source: str, keys: list[str], args: list) -> Any:
        return await (await self._script(source))(keys=keys, args=args)


class RedisRateLimiter(KeyedStore):
    def __init__(self, redis: RedisFactory, namespace: str = "") -> None:
        super().__init__(redis, namespace, "rate")

    async def acquire(self, buckets: list[tuple[str, float]]) -> float:
        return float(await self.run_script(_TAKE, [self.key(k) for k, _ in buckets],
                                     [repr(float(rate)) for _, rate in buckets]))


@dataclass(frozen=True)
class BreakerSettings:
    failures: int = 5
    error_rate: float = 0.5
    min_calls: int = 20
    window_seconds: float = 30.0
    open_seconds: float = 10.0


class RedisBreakers(KeyedStore):
    """Breakers shared in Redis. Successes are counted in batches (`succeeded`): every few ms one round
    trip for every breaker's successes, instead of one per call; a failure first applies the successes
    of its breaker still waiting, so the order of one replica's outcomes is kept."""

    def __init__(self, redis: RedisFactory, namespace: str = "", settings: BreakerSettings | None = None,
                 flush_seconds: float = 0.005, cache_seconds: float = 0.0) -> None:
        super().__init__(redis, namespace, "breaker")
        self.settings = settings or BreakerSettings()
        self.flush_seconds, self.cache_seconds = flush_seconds, cache_seconds
        self._successes: dict[str, int] = {}
        self._flusher: asyncio.Task | None = None
        self._closed_until: dict[str, float] = {}  # breaker -> until when its last seen "closed" is trusted

    def trusted_closed(self, tool: str) -> bool:
        """Whether this replica saw `tool`'s breaker closed in Redis less than `cache_seconds` ago (and has not
        seen it otherwise since): the local gate then admits without asking (adapters/local_gate.py)."""
        return self._closed_until.get(tool, 0.0) > time.monotonic()

    def observe(self, tool: str, state: str) -> None:
        """Remember the state Redis answered: "closed" is trusted for `cache_seconds`, any other is not kept."""
        if state == "closed" and self.cache_seconds > 0:
            if len(self._closed_until) >= _MAX_TRUSTED:
                self._closed_until.clear()  # that many breakers churn: asking Redis again is correct, only slower
            self._closed_until[tool] = time.monotonic() + self.cache_seconds
        else:
            self._closed_until.pop(tool, None)

    def stale_soon(self, tool: str) -> bool:
        """Whether `tool`'s trusted "closed" is past half its time (a top-up may renew it meanwhile)."""
        until = self._closed_until.get(tool)
        return until is not None and until - time.monotonic() < self.cache_seconds / 2

    def renew(self, tool: str, state: str) -> None:
        """A top-up's reading of the state: renews a trust still held (one a failure dropped meanwhile stays
        dropped), drops it when the breaker is no longer closed."""
        if tool in self._closed_until:
            self.observe(tool, state)

    async def admit(self, tool: str, probe_seconds: float) -> tuple[bool, str, float]:
        admitted, state, retry_after = await self.run_script(_ADMIT, [self.key(tool)],
                                                       [repr(self.settings.open_seconds), repr(float(probe_seconds))])
        self.observe(tool, _text(state))
        return bool(admitted), _text(state), float(retry_after)

    def _args(self, successes: int, failed: bool) -> list:
        s = self.settings
        return [successes, "1" if failed else "0", s.failures, repr(s.error_rate), s.min_calls, repr(s.window_seconds)]

    async def record(self, tool: str, ok: bool) -> str:
        successes = self._successes.pop(tool, 0) + (1 if ok else 0)
        if not ok:
            self._closed_until.pop(tool, None)  # a failure: ask Redis again from now on, whatever it answers
        state = _text(await self.run_script(_RECORD, [self.key(tool)], self._args(successes, not ok)))
        if ok:
            self.observe(tool, state)
        return state

    def succeeded(self, tool: str) -> None:
        self._successes[tool] = self._successes.get(tool, 0) + 1
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_later(), name="breaker successes")

    async def _flush_later(self) -> None:
        await asyncio.sleep(self.flush_seconds)
        try:
            await self.flush()
        except Exception as exc:  # noqa: BLE001 - success counts only lower a breaker's error rate; logged
            log.warning("breaker successes not counted", error=str(exc)[:200])

    async def flush(self) -> None:
        """Apply the successes still waiting, every breaker's in one round trip."""
        pending, self._successes = self._successes, {}
        if not pending:
            return
        script = await self._script(_RECORD)
        async with (await self._redis()).pipeline(transaction=False) as pipe:
            for tool, count in pending.items():
                await script(keys=[self.key(tool)], args=self._args(count, False), client=pipe)
            await pipe.execute()

    async def close(self) -> None:
        """Stop counting. Successes still waiting are dropped, not sent: this runs after the event bus (whose
        Redis connections these are) has stopped, and a lost success only leaves a breaker's error rate a
        hair higher for the rest of its window."""
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)
        self._successes.clear()

    async def state(self, tool: str) -> str:
        client = await self._redis()
        return _text(await client.hget(self.key(tool), "state") or b"closed")


class RedisGate:
    """Rate limit and breaker of a call in one script, so the call path costs one round trip for both."""

    def __init__(self, limiter: RedisRateLimiter, breakers: RedisBreakers) -> None:
        self.limiter, self.breakers = limiter, breakers

    async def admit(self, buckets: list[tuple[str, float]], tool: str,
                    probe_seconds: float) -> tuple[float, bool, str, float]:
        wait, admitted, state, retry_after = await self.limiter.run_script(
            _GATE, [*(self.limiter.key(k) for k, _ in buckets), self.breakers.key(tool)],
            [*(repr(float(rate)) for _, rate in buckets), repr(self.breakers.settings.open_seconds),
             repr(float(probe_seconds))])
        return float(wait), bool(admitted), _text(state), float(retry_after)


# A canary's counters: one hash per (tool, epoch), {stable_calls, stable_errors, canary_calls, canary_errors}.
_ARM = """
redis.call('HINCRBY', KEYS[1], ARGV[1] .. '_calls', 1)
if ARGV[2] == '0' then redis.call('HINCRBY', KEYS[1], ARGV[1] .. '_errors', 1) end
redis.call('PEXPIRE', KEYS[1], 604800000)
return redis.call('HMGET', KEYS[1], 'stable_calls', 'stable_errors', 'canary_calls', 'canary_errors')
"""


class RedisCanaryCounters(KeyedStore):
    def __init__(self, redis: RedisFactory, namespace: str = "") -> None:
        super().__init__(redis, namespace, "canary")

    async def record(self, tool: str, epoch: str, arm: str, ok: bool) -> ArmCounts:
        client = await self._redis()
        values = await client.eval(_ARM, 1, self.key(f"{tool}.{epoch}"), arm, "1" if ok else "0")
        return ArmCounts(*(int(v or 0) for v in values))


class RedisResultStore(KeyedStore):
    """Full results of truncated calls, per tenant, readable as mem://step/<id> until they expire."""

    def __init__(self, redis: RedisFactory, namespace: str = "", ttl_seconds: float = 86_400) -> None:
        super().__init__(redis, namespace, "step")
        self.ttl_ms = int(ttl_seconds * 1000)

    async def put(self, tenant_id: str, step_id: str, text: str) -> None:
        client = await self._redis()
        await client.set(self.tenant_key(tenant_id, "result", step_id), text.encode(), px=self.ttl_ms)

    async def mark_running(self, tenant_id: str, chain_id: str, seconds: float) -> None:
        client = await self._redis()
        await client.set(self.tenant_key(tenant_id, "running", chain_id), b"1", px=max(1, int(seconds * 1000)))

    async def running(self, tenant_id: str, chain_id: str) -> bool:
        client = await self._redis()
        return bool(await client.exists(self.tenant_key(tenant_id, "running", chain_id)))

    async def get(self, tenant_id: str, step_id: str) -> str | None:
        client = await self._redis()
        value = await client.get(self.tenant_key(tenant_id, "result", step_id))
        return None if value is None else _text(value)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

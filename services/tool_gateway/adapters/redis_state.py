"""Call-pipeline state shared by every gateway replica, in Redis: rate limits, breakers, full results.

Each decision is one Lua script (atomic on the server, one round trip) that reads the server's
clock, so replicas agree without synchronised clocks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from redis.asyncio import Redis

from services.tool_gateway.domain.rollout import ArmCounts

__all__ = ["BreakerSettings", "RedisBreakers", "RedisCanaryCounters", "RedisRateLimiter", "RedisResultStore"]

RedisFactory = Callable[[], Awaitable[Redis]]

# Token buckets (rate per second, burst = 2 × rate, at least 1): take one token from each bucket,
# or none when any is empty; answer the wait until all have one.
_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local wait, state = 0, {}
for i, key in ipairs(KEYS) do
  local rate = tonumber(ARGV[i])
  local burst = math.max(1, rate * 2)
  local b = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens = tonumber(b[1]) or burst
  local ts = tonumber(b[2]) or now
  tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
  if tokens < 1 then wait = math.max(wait, (1 - tokens) / rate) end
  state[i] = {tokens, burst / rate}
end
for i, key in ipairs(KEYS) do
  local tokens = state[i][1]
  if wait == 0 then tokens = tokens - 1 end
  redis.call('HSET', key, 'tokens', tokens, 'ts', now)
  redis.call('PEXPIRE', key, math.ceil(state[i][2] * 1000) + 1000)
end
return tostring(wait)
"""

# Breaker: KEYS[1] hash {state, failures, opened_at, probe_until, win_start, calls, errors}.
_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local open_s, probe_s = tonumber(ARGV[1]), tonumber(ARGV[2])
local b = redis.call('HMGET', KEYS[1], 'state', 'opened_at', 'probe_until')
local state = b[1] or 'closed'
if state == 'closed' then return {1, state, '0'} end
if state == 'open' then
  local left = tonumber(b[2]) + open_s - now
  if left > 0 then return {0, state, tostring(left)} end
  redis.call('HSET', KEYS[1], 'state', 'half_open', 'probe_until', now + probe_s)
  return {1, 'half_open', '0'}
end
local busy = tonumber(b[3]) - now
if busy > 0 then return {0, state, tostring(busy)} end
redis.call('HSET', KEYS[1], 'probe_until', now + probe_s)
return {1, state, '0'}
"""

_RECORD = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local ok = ARGV[1] == '1'
local max_failures, max_rate = tonumber(ARGV[2]), tonumber(ARGV[3])
local min_calls, window = tonumber(ARGV[4]), tonumber(ARGV[5])
local b = redis.call('HMGET', KEYS[1], 'state', 'failures', 'win_start', 'calls', 'errors')
local state = b[1] or 'closed'
if state == 'half_open' then
  if ok then
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
calls = calls + 1
if ok then failures = 0 else failures, errors = failures + 1, errors + 1 end
if failures >= max_failures or (calls >= min_calls and errors / calls >= max_rate) then
  redis.call('HSET', KEYS[1], 'state', 'open', 'opened_at', now, 'failures', 0, 'win_start', now,
             'calls', 0, 'errors', 0)
  return 'open'
end
redis.call('HSET', KEYS[1], 'state', 'closed', 'failures', failures, 'win_start', win_start, 'calls', calls,
           'errors', errors)
return 'closed'
"""


class _Keys:
    def __init__(self, redis: RedisFactory, namespace: str, kind: str) -> None:
        self._redis, self._prefix = redis, f"{namespace}.tool-gateway.{kind}." if namespace else \
            f"tool-gateway.{kind}."

    def key(self, name: str) -> str:
        return self._prefix + name


class RedisRateLimiter(_Keys):
    def __init__(self, redis: RedisFactory, namespace: str = "") -> None:
        super().__init__(redis, namespace, "rate")

    async def acquire(self, buckets: list[tuple[str, float]]) -> float:
        client = await self._redis()
        wait = await client.eval(_TAKE, len(buckets), *[self.key(k) for k, _ in buckets],
                                 *[repr(float(rate)) for _, rate in buckets])
        return float(wait)


@dataclass(frozen=True)
class BreakerSettings:
    failures: int = 5
    error_rate: float = 0.5
    min_calls: int = 20
    window_seconds: float = 30.0
    open_seconds: float = 10.0


class RedisBreakers(_Keys):
    def __init__(self, redis: RedisFactory, namespace: str = "", settings: BreakerSettings | None = None) -> None:
        super().__init__(redis, namespace, "breaker")
        self.settings = settings or BreakerSettings()

    async def admit(self, tool: str, probe_seconds: float) -> tuple[bool, str, float]:
        client = await self._redis()
        admitted, state, retry_after = await client.eval(_ADMIT, 1, self.key(tool), repr(self.settings.open_seconds),
                                                         repr(float(probe_seconds)))
        return bool(admitted), _text(state), float(retry_after)

    async def record(self, tool: str, ok: bool) -> str:
        s = self.settings
        client = await self._redis()
        state = await client.eval(_RECORD, 1, self.key(tool), "1" if ok else "0", s.failures, repr(s.error_rate),
                                  s.min_calls, repr(s.window_seconds))
        return _text(state)

    async def state(self, tool: str) -> str:
        client = await self._redis()
        return _text(await client.hget(self.key(tool), "state") or b"closed")


# A canary's counters: one hash per (tool, epoch), {stable_calls, stable_errors, canary_calls, canary_errors}.
_ARM = """
redis.call('HINCRBY', KEYS[1], ARGV[1] .. '_calls', 1)
if ARGV[2] == '0' then redis.call('HINCRBY', KEYS[1], ARGV[1] .. '_errors', 1) end
redis.call('PEXPIRE', KEYS[1], 604800000)
return redis.call('HMGET', KEYS[1], 'stable_calls', 'stable_errors', 'canary_calls', 'canary_errors')
"""


class RedisCanaryCounters(_Keys):
    def __init__(self, redis: RedisFactory, namespace: str = "") -> None:
        super().__init__(redis, namespace, "canary")

    async def record(self, tool: str, epoch: str, arm: str, ok: bool) -> ArmCounts:
        client = await self._redis()
        values = await client.eval(_ARM, 1, self.key(f"{tool}.{epoch}"), arm, "1" if ok else "0")
        return ArmCounts(*(int(v or 0) for v in values))


class RedisResultStore(_Keys):
    """Full results of truncated calls, per tenant, readable as mem://step/<id> until they expire."""

    def __init__(self, redis: RedisFactory, namespace: str = "", ttl_seconds: float = 86_400) -> None:
        super().__init__(redis, namespace, "step")
        self.ttl_ms = int(ttl_seconds * 1000)

    async def put(self, tenant_id: str, step_id: str, text: str) -> None:
        client = await self._redis()
        await client.set(self.key(f"{tenant_id}.{step_id}"), text.encode(), px=self.ttl_ms)

    async def mark_running(self, tenant_id: str, chain_id: str, seconds: float) -> None:
        client = await self._redis()
        await client.set(self.key(f"{tenant_id}.running.{chain_id}"), b"1", px=max(1, int(seconds * 1000)))

    async def running(self, tenant_id: str, chain_id: str) -> bool:
        client = await self._redis()
        return bool(await client.exists(self.key(f"{tenant_id}.running.{chain_id}")))

    async def get(self, tenant_id: str, step_id: str) -> str | None:
        client = await self._redis()
        value = await client.get(self.key(f"{tenant_id}.{step_id}"))
        return None if value is None else _text(value)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

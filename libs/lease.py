"""A leader lease in Redis: one holder at a time, renewed while it works, taken over when it stops.

`acquire()` takes the lease when it is free or already ours (renewing it), atomically; a holder that
stops renewing loses it after `ttl_ms`. Work done under the lease must fit well inside the TTL
between renewals (the sweeper renews before each step); the store's own atomicity (DELETE ...
RETURNING) backs it up, so even an overlap at a takeover cannot act twice on one row.
"""

from __future__ import annotations

import uuid

from redis.asyncio import Redis

__all__ = ["RedisLease"]

_ACQUIRE = """
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisLease:
    def __init__(self, redis: Redis, key: str, ttl_ms: int, holder: str | None = None) -> None:
        self.redis, self.key, self.ttl_ms = redis, key, ttl_ms
        self.holder = holder or uuid.uuid4().hex

    async def acquire(self) -> bool:
        """Take or renew the lease; False while another holder has it."""
        return bool(await self.redis.eval(_ACQUIRE, 1, self.key, self.holder, self.ttl_ms))

    async def release(self) -> None:
        await self.redis.eval(_RELEASE, 1, self.key, self.holder)

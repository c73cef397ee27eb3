"""The logging level each MCP session set (`logging/setLevel`) and the resources it subscribed to
(`resources/subscribe`), in Redis so that every replica reads them.

Keyed by (tenant, subject, session id), hashed: a client sets only its own sessions' levels. The
keys follow the gateway's naming (`<namespace>.tool-gateway.<kind>.<hash>`, redis_state.KeyedStore), so
the namespace's cleanup and the ACL's key pattern cover them. A level lives `ttl_seconds` after it
was set (a day by default); a session that never set one, or whose level expired, gets every level
relayed (mcp_relay.ClientRelay).
"""

from __future__ import annotations

import hashlib

from services.tool_gateway.adapters.redis_state import RedisFactory, KeyedStore

__all__ = ["RedisLogLevels", "RedisSubscribed"]


def _hashed(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:32]


class RedisLogLevels(KeyedStore):
    def __init__(self, client: RedisFactory, namespace: str, *, ttl_seconds: int = 86_400) -> None:
        super().__init__(client, namespace, "loglevel")
        self.ttl_seconds = ttl_seconds

    async def get(self, key: str) -> str | None:
        value = await (await self._redis()).get(self.key(_hashed(key)))
        return value.decode() if isinstance(value, bytes) else value

    async def set(self, key: str, level: str) -> None:
        await (await self._redis()).set(self.key(_hashed(key)), level, ex=self.ttl_seconds)


# Add a URI to a session's set unless the set is full (KEYS[1]; ARGV: uri, limit, ttl): 1 added or there, 0 full.
_ADD = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 and redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""


class RedisSubscribed(KeyedStore):
    """A set of URIs per session, living `ttl_seconds` after its last change."""

    def __init__(self, client: RedisFactory, namespace: str, *, ttl_seconds: int = 86_400) -> None:
        super().__init__(client, namespace, "subscribed")
        self.ttl_seconds = ttl_seconds

    async def add(self, key: str, uri: str, limit: int) -> bool:
        return bool(await self.run_script(_ADD, [self.key(_hashed(key))], [uri, limit, self.ttl_seconds]))

    async def remove(self, key: str, uri: str) -> None:
        await (await self._redis()).srem(self.key(_hashed(key)), uri)

    async def has(self, key: str, uri: str) -> bool:
        return bool(await (await self._redis()).sismember(self.key(_hashed(key)), uri))

"""The logging level each MCP session set (`logging/setLevel`) and the resources it subscribed to
(`resources/subscribe`), in Redis so that every replica reads them.

Keyed by (tenant, subject, session id): a client sets only its own sessions' levels. A level
lives `ttl_seconds` after it was set (a day by default); a session that never set one, or whose
level expired, gets every level relayed (mcp_relay.ClientRelay).
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable

import redis.asyncio

__all__ = ["RedisLogLevels", "RedisSubscribed"]


class RedisLogLevels:
    def __init__(self, client: Callable[[], Awaitable[redis.asyncio.Redis]], namespace: str, *,
                 ttl_seconds: int = 86_400) -> None:
        self.client, self.namespace, self.ttl_seconds = client, namespace, ttl_seconds

    def _key(self, key: str) -> str:
        return f"{self.namespace}:tool:loglevel:{hashlib.sha256(key.encode()).hexdigest()[:32]}"

    async def get(self, key: str) -> str | None:
        value = await (await self.client()).get(self._key(key))
        return value.decode() if isinstance(value, bytes) else value

    async def set(self, key: str, level: str) -> None:
        await (await self.client()).set(self._key(key), level, ex=self.ttl_seconds)


class RedisSubscribed:
    """A set of URIs per session, living `ttl_seconds` after its last change."""

    def __init__(self, client: Callable[[], Awaitable[redis.asyncio.Redis]], namespace: str, *,
                 ttl_seconds: int = 86_400) -> None:
        self.client, self.namespace, self.ttl_seconds = client, namespace, ttl_seconds

    def _key(self, key: str) -> str:
        return f"{self.namespace}:tool:subscribed:{hashlib.sha256(key.encode()).hexdigest()[:32]}"

    async def add(self, key: str, uri: str) -> None:
        redis_client = await self.client()
        async with redis_client.pipeline(transaction=True) as pipe:
            pipe.sadd(self._key(key), uri)
            pipe.expire(self._key(key), self.ttl_seconds)
            await pipe.execute()

    async def remove(self, key: str, uri: str) -> None:
        await (await self.client()).srem(self._key(key), uri)

    async def has(self, key: str, uri: str) -> bool:
        return bool(await (await self.client()).sismember(self._key(key), uri))

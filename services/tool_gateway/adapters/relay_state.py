"""The logging level each MCP session set (`logging/setLevel`), in Redis so that every replica reads it.

Keyed by (tenant, subject, session id): a client sets only its own sessions' levels. A level
lives `ttl_seconds` after it was set (a day by default); a session that never set one, or whose
level expired, gets every level relayed (mcp_relay.ClientRelay).
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable

import redis.asyncio

__all__ = ["RedisLogLevels"]


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

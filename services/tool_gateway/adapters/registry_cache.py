"""The registry's per-call reads (`lookup`, `versions`) from memory, kept right by PostgreSQL NOTIFY.

Every change of the registry (a tool registered or removed, a rollout saved, whichever replica
made it) sends a notification on the registry's channel in the transaction of the change
(PostgresRegistry). A cached answer is used only while this process listens on that channel and
no notification, and no change through this process, came since the read it holds began:
an entry remembers the notifier's generation and the local one taken *before* its read, so a
change that commits during the read still invalidates it. While the LISTEN connection is down,
nothing is cached (every call reads PostgreSQL, as without the cache).
"""

from __future__ import annotations

from libs.db.notify import Notifier
from services.tool_gateway.domain import ToolSpec
from services.tool_gateway.domain.rollout import Rollout
from services.tool_gateway.service_layer.ports import Registry

__all__ = ["CachedRegistry"]

_MAX_ENTRIES = 10_000  # names callers asked for, unknown ones included


class CachedRegistry:
    def __init__(self, registry: Registry, notifier: Notifier) -> None:
        self.registry, self.notifier = registry, notifier
        self._local = 0  # changes made through this process
        self._lookups: dict[str, tuple[tuple[int, int], tuple[list[ToolSpec], Rollout | None]]] = {}
        self.hits = self.misses = 0

    def _stamp(self) -> tuple[int, int]:
        return self.notifier.mark(), self._local

    def _fresh(self, stamp: tuple[int, int]) -> bool:
        return self.notifier.listening.is_set() and stamp == self._stamp()

    def _changed(self) -> None:
        self._local += 1
        self._lookups.clear()

    async def lookup(self, name: str) -> tuple[list[ToolSpec], Rollout | None]:
        held = self._lookups.get(name)
        if held is not None and self._fresh(held[0]):
            self.hits += 1
            return held[1]
        self.misses += 1
        stamp = self._stamp()  # before the read: a change committed during it invalidates the entry
        found = await self.registry.lookup(name)
        if len(self._lookups) >= _MAX_ENTRIES:
            self._lookups.clear()
        self._lookups[name] = (stamp, found)
        return found

    async def versions(self, name: str) -> list[ToolSpec]:
        return (await self.lookup(name))[0]

    async def list(self) -> list[ToolSpec]:
        return await self.registry.list()

    async def rollouts(self) -> dict[str, Rollout]:
        return await self.registry.rollouts()

    async def register(self, spec: ToolSpec) -> bool:
        try:
            return await self.registry.register(spec)
        finally:
            self._changed()

    async def remove(self, name: str, version: str = "") -> list[str]:
        try:
            return await self.registry.remove(name, version)
        finally:
            self._changed()

    async def save_rollout(self, rollout: Rollout, expect_canary: str | None = None) -> bool:
        try:
            return await self.registry.save_rollout(rollout, expect_canary)
        finally:
            self._changed()

    async def close(self) -> None:
        await self.notifier.close()

"""The registry agents see: registered tools (PostgreSQL) plus the tools of connected upstreams.

`on_change` runs after every change of what tools/list shows (a tool registered or removed, a rollout
saved: it can change the listed version); the gateway announces it to every replica's MCP clients.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from services.tool_gateway.adapters.upstreams import UpstreamManager
from services.tool_gateway.domain import ToolSpec
from services.tool_gateway.domain.rollout import Rollout
from services.tool_gateway.service_layer.ports import Registry

__all__ = ["FederatedRegistry"]


class FederatedRegistry:
    def __init__(self, registered: Registry, upstreams: UpstreamManager,
                 on_change: Callable[[], Awaitable[None]] | None = None) -> None:
        self.registered, self.upstreams, self.on_change = registered, upstreams, on_change

    async def _changed(self) -> None:
        if self.on_change is not None:
            await self.on_change()

    async def register(self, spec: ToolSpec) -> bool:
        registered = await self.registered.register(spec)
        if registered:
            await self._changed()
        return registered

    async def list(self) -> list[ToolSpec]:
        return [*await self.registered.list(), *self.upstreams.specs()]

    async def versions(self, name: str) -> list[ToolSpec]:
        federated = self.upstreams.spec(name)
        return [federated] if federated is not None else await self.registered.versions(name)

    async def lookup(self, name: str) -> tuple[list[ToolSpec], Rollout | None]:
        federated = self.upstreams.spec(name)
        return ([federated], None) if federated is not None else await self.registered.lookup(name)

    async def remove(self, name: str, version: str = "") -> list[str]:
        removed = await self.registered.remove(name, version)
        if removed:
            await self._changed()
        return removed

    async def rollouts(self) -> dict[str, Rollout]:
        return await self.registered.rollouts()

    async def save_rollout(self, rollout: Rollout, expect_canary: str | None = None) -> bool:
        saved = await self.registered.save_rollout(rollout, expect_canary)
        if saved:
            await self._changed()
        return saved

"""The registry agents see: registered tools (PostgreSQL) plus the tools of connected upstreams."""

from __future__ import annotations

from services.tool_gateway.adapters.upstreams import UpstreamManager
from services.tool_gateway.domain import ToolSpec
from services.tool_gateway.domain.rollout import Rollout
from services.tool_gateway.service_layer.ports import Registry

__all__ = ["FederatedRegistry"]


class FederatedRegistry:
    def __init__(self, registered: Registry, upstreams: UpstreamManager) -> None:
        self.registered, self.upstreams = registered, upstreams

    async def register(self, spec: ToolSpec) -> bool:
        return await self.registered.register(spec)

    async def list(self) -> list[ToolSpec]:
        return [*await self.registered.list(), *self.upstreams.specs()]

    async def versions(self, name: str) -> list[ToolSpec]:
        federated = self.upstreams.spec(name)
        return [federated] if federated is not None else await self.registered.versions(name)

    async def lookup(self, name: str) -> tuple[list[ToolSpec], Rollout | None]:
        federated = self.upstreams.spec(name)
        return ([federated], None) if federated is not None else await self.registered.lookup(name)

    async def remove(self, name: str, version: str = "") -> list[str]:
        return await self.registered.remove(name, version)

    async def rollouts(self) -> dict[str, Rollout]:
        return await self.registered.rollouts()

    async def save_rollout(self, rollout: Rollout, expect_canary: str | None = None) -> bool:
        return await self.registered.save_rollout(rollout, expect_canary)

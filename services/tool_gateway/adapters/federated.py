"""The registry agents see: registered tools (PostgreSQL) plus the tools of connected upstreams."""

from __future__ import annotations

from services.tool_gateway.adapters.upstreams import UpstreamManager
from services.tool_gateway.domain import ToolSpec
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

"""Tool-gateway handlers."""

from __future__ import annotations

from libs.errors import Conflict
from services.tool_gateway.domain import ToolSpec, validate_spec
from services.tool_gateway.service_layer.ports import Registry

__all__ = ["list_tools", "register_tool"]


async def register_tool(spec: ToolSpec, registry: Registry) -> ToolSpec:
    validate_spec(spec)
    if not await registry.register(spec):
        raise Conflict(f"{spec.name} {spec.version} is already registered", field="version", retryable=False,
                       hint="register a new version; versions are immutable")
    return spec


async def list_tools(registry: Registry) -> list[ToolSpec]:
    return await registry.list()

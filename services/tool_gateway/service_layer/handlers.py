"""Tool-gateway handlers."""

from __future__ import annotations

import asyncio

from libs.auth import Principal
from libs.errors import Conflict
from services.tool_gateway.domain import ToolSpec, current_versions, validate_spec
from services.tool_gateway.service_layer.ports import Registry

__all__ = ["list_current_tools", "list_tools", "register_tool", "visible_to"]


async def register_tool(spec: ToolSpec, registry: Registry) -> ToolSpec:
    # Schema validation is linear in its input (patterns run on RE2), but a big schema still
    # takes CPU: off the event loop, health checks and other calls keep being answered.
    await asyncio.to_thread(validate_spec, spec)
    if not await registry.register(spec):
        raise Conflict(f"{spec.name} {spec.version} is already registered", field="version", retryable=False,
                       hint="register a new version; versions are immutable")
    return spec


async def list_tools(registry: Registry) -> list[ToolSpec]:
    return await registry.list()


def visible_to(spec: ToolSpec, principal: Principal | None) -> bool:
    """A tool is shown only to callers holding every scope it declares (None: no caller to filter by)."""
    return principal is None or all(principal.has_scope(s) for s in spec.scopes)


async def list_current_tools(registry: Registry, principal: Principal | None = None) -> list[ToolSpec]:
    """What an agent is offered: each tool it may call once, at its current version."""
    return [s for s in current_versions(await list_tools(registry)) if visible_to(s, principal)]

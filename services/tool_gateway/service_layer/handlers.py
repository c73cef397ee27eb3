"""Tool-gateway handlers."""

from __future__ import annotations

from typing import NoReturn

from libs.errors import Conflict, NotFound, Unimplemented
from services.tool_gateway.domain import CallTool, ToolSpec, current_versions, validate_spec
from services.tool_gateway.service_layer.ports import Registry

__all__ = ["call_tool", "list_current_tools", "list_tools", "register_tool"]


async def register_tool(spec: ToolSpec, registry: Registry) -> ToolSpec:
    validate_spec(spec)
    if not await registry.register(spec):
        raise Conflict(f"{spec.name} {spec.version} is already registered", field="version", retryable=False,
                       hint="register a new version; versions are immutable")
    return spec


async def list_tools(registry: Registry) -> list[ToolSpec]:
    return await registry.list()


async def list_current_tools(registry: Registry) -> list[ToolSpec]:
    """What an agent is offered: each tool once, at its current version."""
    return current_versions(await list_tools(registry))


async def call_tool(command: CallTool, registry: Registry) -> NoReturn:
    """Refuse every call, saying why: the call pipeline (policy, validation, backends) is not built yet.

    An unknown name is still told apart, so an agent can correct a typo today.
    """
    if not any(spec.name == command.name for spec in await registry.list()):
        raise NotFound(f"no tool named {command.name!r} is registered", field="name",
                       hint="list the tools (MCP tools/list, gRPC ListTools) and use one of their names")
    raise Unimplemented("tool calls are not available yet",
                        hint="do not retry: the gateway lists tools but cannot run them until its call "
                             "pipeline is built (README, section MCP)")

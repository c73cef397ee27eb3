"""Tool-gateway handlers."""

from __future__ import annotations

import asyncio
from typing import NoReturn

from libs.errors import Conflict, NotFound, Unimplemented
from services.tool_gateway.domain import (
    CallTool,
    ToolSpec,
    current_versions,
    validate_arguments,
    validate_spec,
)
from services.tool_gateway.service_layer.ports import Registry

__all__ = ["call_tool", "list_current_tools", "list_tools", "register_tool"]


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


async def list_current_tools(registry: Registry) -> list[ToolSpec]:
    """What an agent is offered: each tool once, at its current version."""
    return current_versions(await list_tools(registry))


async def call_tool(command: CallTool, registry: Registry) -> NoReturn:
    """Refuse every call, saying why: the call pipeline (policy, backends) is not built yet.

    An unknown name and invalid arguments are still told apart, so an agent can correct them today.
    """
    spec = next((s for s in current_versions(await registry.list()) if s.name == command.name), None)
    if spec is None:
        raise NotFound(f"no tool named {command.name!r} is registered", field="name",
                       hint="list the tools (MCP tools/list, gRPC ListTools) and use one of their names")
    await asyncio.to_thread(validate_arguments, spec, command.arguments)
    raise Unimplemented("tool calls are not available yet",
                        hint="do not retry: the gateway lists tools but cannot run them until its call "
                             "pipeline is built (README, section MCP)")

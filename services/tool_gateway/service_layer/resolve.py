"""A tool's spec by name and version: a direct lookup in the registry, no scan."""

from __future__ import annotations

from libs.errors import NotFound
from services.tool_gateway.domain import ToolSpec
from services.tool_gateway.domain.registry import pick_version
from services.tool_gateway.service_layer.ports import Registry

__all__ = ["not_found", "resolve"]


def not_found(name: str, version: str, known: bool) -> NotFound:
    what = f"{name!r} version {version}" if version else repr(name)
    return NotFound(f"no tool {what} is registered", field="version" if version and known else "name",
                    hint="list the tools (MCP tools/list, gRPC ListTools) and use one of their names")


async def resolve(name: str, version: str, registry: Registry) -> ToolSpec:
    versions = await registry.versions(name)
    spec = pick_version(versions, version)
    if spec is None:
        raise not_found(name, version, bool(versions))
    return spec

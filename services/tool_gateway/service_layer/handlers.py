"""Tool-gateway handlers: the registry, versions and canaries, call status."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from libs.auth import Principal
from libs.errors import Conflict, NotFound, ValidationFailed
from services.tool_gateway.domain import ToolSpec, current_versions, validate_spec
from services.tool_gateway.domain.calls import CallState, call_state
from services.tool_gateway.domain.registry import pick_version
from services.tool_gateway.domain.rollout import Rollout, promote, roll_back, start_canary
from services.tool_gateway.service_layer.ports import CallLog, Registry, ResultStore

__all__ = ["get_call", "list_current_tools", "list_tools", "listed_schema", "promote_canary", "register_tool",
           "remove_tool", "roll_back_tool", "set_canary", "shows_output_schema", "visible_to"]


async def register_tool(spec: ToolSpec, registry: Registry) -> ToolSpec:
    # Schema validation is linear in its input (patterns run on RE2), but a big schema still
    # takes CPU: off the event loop, health checks and other calls keep being answered.
    await asyncio.to_thread(validate_spec, spec)
    if spec.status_tool and not (await registry.lookup(spec.status_tool))[0]:
        raise ValidationFailed(f"names {spec.status_tool!r}, which is not a registered tool", field="status_tool",
                               hint=f"register {spec.status_tool} first (the tool that answers whether an operation "
                                    f"of {spec.name} happened), then {spec.name}")
    if not await registry.register(spec):
        raise Conflict(f"{spec.name} {spec.version} is already registered", field="version", retryable=False,
                       hint="register a new version; versions are immutable")
    return spec


async def remove_tool(name: str, version: str, registry: Registry) -> list[str]:
    removed = await registry.remove(name, version)
    if not removed:
        what = f"{name} {version}" if version else name
        raise NotFound(f"no tool {what} is registered", field="version" if version else "name",
                       hint="list the tools (ListTools) for their names and versions")
    return removed


async def list_tools(registry: Registry) -> list[ToolSpec]:
    return await registry.list()


def visible_to(spec: ToolSpec, principal: Principal | None) -> bool:
    """A tool is shown only to callers holding every scope it declares (None: no caller to filter by)."""
    return principal is None or all(principal.has_scope(s) for s in spec.scopes)


async def list_current_tools(registry: Registry, principal: Principal | None = None) -> list[ToolSpec]:
    """What an agent is offered: each tool it may call once, at its current (stable) version."""
    specs, rollouts = await asyncio.gather(list_tools(registry), registry.rollouts())
    pins = {name: r.stable for name, r in rollouts.items() if r.stable}
    return [s for s in current_versions(specs, pins) if visible_to(s, principal)]


async def listed_schema(principal: Principal, name: str, registry: Registry) -> dict[str, Any] | None:
    """The input schema tools/list shows `principal` for `name` (its current, stable version; a canary caller is
    shown it too), which a 2026-07-28 client mirrors `Mcp-Param-*` headers from; None when the tool is not
    listed to it (unknown, or not its to call: the call is refused as such, in the pipeline)."""
    versions, rollout = await registry.lookup(name)
    shown = current_versions(versions, {name: rollout.stable} if rollout is not None and rollout.stable else None)
    return shown[0].input_schema if shown and visible_to(shown[0], principal) else None


async def shows_output_schema(name: str, registry: Registry) -> bool:
    """Whether the tool tools/list shows by `name` (its current, stable version) declares an output schema;
    False when none is registered by that name."""
    versions, rollout = await registry.lookup(name)
    shown = current_versions(versions, {name: rollout.stable} if rollout is not None and rollout.stable else None)
    return bool(shown and shown[0].output_schema)


async def _versions(name: str, registry: Registry) -> tuple[list[ToolSpec], Rollout | None]:
    versions, rollout = await registry.lookup(name)
    if not versions:
        raise NotFound(f"no tool {name!r} is registered", field="name", hint="list the tools (ListTools)")
    return versions, rollout


async def set_canary(name: str, version: str, registry: Registry, *, percent: float, callers: tuple[str, ...] = (),
                     max_error_rate_delta: float = 0.0, min_calls: int = 0) -> Rollout:
    versions, rollout = await _versions(name, registry)
    if pick_version(versions, version) is None:
        raise NotFound(f"{name} has no version {version!r}", field="version", hint="register it first")
    stable = (rollout.stable if rollout and rollout.stable else
              max((s for s in versions if s.version != version),
                  key=lambda s: tuple(int(p) for p in s.version.split(".")), default=versions[0]).version)
    new = start_canary(rollout, name, version, stable=stable, percent=percent, callers=callers,
                       max_error_rate_delta=max_error_rate_delta, min_calls=min_calls, epoch=uuid.uuid4().hex[:12])
    await registry.save_rollout(new)
    return new


async def promote_canary(name: str, registry: Registry) -> Rollout:
    _, rollout = await _versions(name, registry)
    new = promote(rollout, name)
    if not await registry.save_rollout(new, expect_canary=rollout.canary if rollout else ""):
        raise Conflict(f"the canary of {name} changed meanwhile (rolled back?)", field="name",
                       hint="look at the rollout again (mnemesh tools canary --show)")
    return new


async def roll_back_tool(name: str, version: str, registry: Registry) -> Rollout:
    versions, rollout = await _versions(name, registry)
    if version and pick_version(versions, version) is None:
        raise NotFound(f"{name} has no version {version!r}", field="version", hint="name a registered version")
    new = roll_back(rollout, name, version=version, reason="rolled back by an operator")
    await registry.save_rollout(new)
    return new


async def get_call(tenant_id: str, call_id: str, call_log: CallLog, results: ResultStore) -> CallState:
    record = await call_log.find(tenant_id, call_id)
    if record is None:
        return call_state(None, await results.running(tenant_id, call_id), None)
    text = await results.get(tenant_id, record.call_id) if record.outcome in ("ok", "fallback", "replayed") else None
    return call_state(record, False, text)

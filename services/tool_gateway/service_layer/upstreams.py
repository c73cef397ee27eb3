"""Upstream MCP servers added and removed at run time; each replica reconciles with the stored list."""

from __future__ import annotations

from typing import Protocol

from libs.errors import Conflict, NotFound
from libs.logs import get_logger
from services.tool_gateway.domain.upstream import UpstreamConfig, UpstreamStatus, check_upstream

__all__ = ["UpstreamRuntime", "UpstreamStore", "add_upstream", "list_upstreams", "reconcile", "remove_upstream"]

log = get_logger(__name__)


class UpstreamStore(Protocol):
    async def add(self, config: UpstreamConfig) -> bool: ...

    async def remove(self, name: str) -> bool: ...

    async def list(self) -> list[UpstreamConfig]: ...


class UpstreamRuntime(Protocol):
    """The connections of this process (adapters/upstreams.UpstreamManager)."""

    connections: dict
    status: dict[str, UpstreamStatus]

    def add(self, config: UpstreamConfig) -> None: ...

    async def remove(self, name: str) -> bool: ...


async def add_upstream(config: UpstreamConfig, store: UpstreamStore, runtime: UpstreamRuntime,
                       allowed_commands: frozenset[str]) -> UpstreamConfig:
    check_upstream(config, allowed_commands)
    if config.name in runtime.connections and config.name not in {c.name for c in await store.list()}:
        raise Conflict(f"the upstream {config.name!r} comes from the gateway's config file", field="upstream.name",
                       retryable=False, hint="choose another name")
    if not await store.add(config):
        raise Conflict(f"an upstream named {config.name!r} exists already", field="upstream.name",
                       retryable=False, hint="remove it first, or choose another name")
    if config.name not in runtime.connections:
        runtime.add(config)  # this replica at once; the others at their next reconcile
    return config


async def remove_upstream(name: str, store: UpstreamStore, runtime: UpstreamRuntime) -> None:
    if not await store.remove(name):
        raise NotFound(f"no upstream {name!r} was added at run time", field="name",
                       hint="list them (mnemesh tools upstream list); config-file ones are removed there")
    await runtime.remove(name)


def list_upstreams(runtime: UpstreamRuntime) -> list[tuple[UpstreamConfig, UpstreamStatus]]:
    return [(conn.config, runtime.status[name]) for name, conn in sorted(runtime.connections.items())]


async def reconcile(store: UpstreamStore, runtime: UpstreamRuntime, fixed: frozenset[str]) -> None:
    """Connect what the store lists and this process lacks; drop what it no longer lists (`fixed`: the
    config file's upstreams, never dropped)."""
    wanted = {c.name: c for c in await store.list() if c.name not in fixed}
    for name in [n for n in runtime.connections if n not in fixed and n not in wanted]:
        await runtime.remove(name)
        log.info("upstream removed", upstream=name)
    for name, config in wanted.items():
        if name not in runtime.connections:
            runtime.add(config)
            log.info("upstream added", upstream=name)

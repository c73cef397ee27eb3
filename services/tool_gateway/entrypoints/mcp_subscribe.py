"""`logging/setLevel` and `resources/subscribe` / `resources/unsubscribe` (2025-era methods) on the gateway.

- `logging/setLevel` records the level for the caller's session (mcp_relay.LogLevels: Redis, so any
  replica relaying a call of that session reads it). It is not forwarded to upstreams: the gateway
  holds one connection per upstream for every caller, so one caller's level would silence the
  others; upstreams are asked for every level and the relay filters per session;
- `resources/subscribe` is forwarded to the upstream that serves the URI (found in the catalogs the
  caller may see, as for `resources/read`) when that upstream declares subscriptions, and answered
  `{}`; `resources/unsubscribe` answers `{}` and ends the session's subscription only: the upstream
  connection serves every caller, so its subscription stays (updates are filtered per session). The gateway's own resources (guides, step results) have no
  updates to send, so subscribing to them is accepted and does nothing. The session's subscriptions
  are kept (`Subscribed`: Redis) for its GET stream, on whichever replica, to pass on
  `notifications/resources/updated` for those URIs only; 2026-07-28 clients name the URIs in their
  `subscriptions/listen` request instead (the SDK's ListenHandler over the same change bus).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from libs.auth import Principal
from libs.errors import DomainError
from libs.transient import TRANSIENT_ERRORS
from services.tool_gateway.domain.guide import GUIDE_PREFIX
from services.tool_gateway.entrypoints.mcp_guides import STEP_PREFIX, _allowed, _not_found, _relayed
from services.tool_gateway.entrypoints.mcp_relay import LogLevels, level_key
from services.tool_gateway.entrypoints.mcp_sessions import SESSION_HEADER

__all__ = ["LocalSubscribed", "Subscribed", "UpstreamSubscriptions", "session_handlers"]

CallerOf = Callable[[ServerRequestContext], Principal | None]


class UpstreamSubscriptions(Protocol):
    """adapters/upstreams.UpstreamManager."""

    def catalogs(self) -> list[tuple[str, Any, tuple[str, ...]]]: ...

    async def subscribe(self, upstream: str, uri: str) -> None: ...


class Subscribed(Protocol):
    """What each session subscribed to, read by its GET stream (mcp_sessions); Redis: adapters/relay_state.py."""

    async def add(self, key: str, uri: str) -> None: ...

    async def remove(self, key: str, uri: str) -> None: ...

    async def has(self, key: str, uri: str) -> bool: ...


class LocalSubscribed:
    """In one process (stdio, tests)."""

    def __init__(self) -> None:
        self._uris: dict[str, set[str]] = {}

    async def add(self, key: str, uri: str) -> None:
        self._uris.setdefault(key, set()).add(uri)

    async def remove(self, key: str, uri: str) -> None:
        self._uris.get(key, set()).discard(uri)

    async def has(self, key: str, uri: str) -> bool:
        return uri in self._uris.get(key, ())


def _session(ctx: ServerRequestContext) -> str:
    return ctx.request.headers.get(SESSION_HEADER, "") if ctx.request is not None else "local"


def session_handlers(caller_of: CallerOf, levels: LogLevels, upstreams: UpstreamSubscriptions | None,
                     subscribed: Subscribed | None = None) -> dict[str, tuple[type, Callable]]:
    """method -> (params type, handler), for Server.add_request_handler."""

    async def set_level(ctx: ServerRequestContext, params: types.SetLevelRequestParams) -> types.EmptyResult:
        caller = caller_of(ctx)
        if caller is None:
            raise MCPError(types.INVALID_REQUEST, "the request carries no authenticated caller")
        try:
            await levels.set(level_key(caller, _session(ctx)), params.level)
        except TRANSIENT_ERRORS as exc:
            raise MCPError(types.INTERNAL_ERROR, f"unavailable: the level could not be kept ({type(exc).__name__})",
                           {"error_type": "unavailable", "retryable": True, "hint": "retry with backoff"}) from None
        return types.EmptyResult()

    def owner(ctx: ServerRequestContext, uri: str) -> str | None:
        """The upstream serving `uri` for this caller; None for the gateway's own resources."""
        caller = caller_of(ctx)
        if uri.startswith((GUIDE_PREFIX, STEP_PREFIX)):
            return None
        for name, catalog, scopes in (upstreams.catalogs() if upstreams is not None else []):
            if _allowed(caller, scopes) and catalog.serves(uri):
                return name
        raise _not_found(f"resource {uri[:200]}", "list the resources and templates for the URIs served")

    def handler(on: bool):
        async def toggle(ctx: ServerRequestContext, params: Any) -> types.EmptyResult:
            uri = str(params.uri)
            name = owner(ctx, uri)
            if on and name is not None and upstreams is not None:
                try:
                    await upstreams.subscribe(name, uri)
                except (MCPError, DomainError, OSError) as exc:
                    raise _relayed(exc, name) from None
            caller = caller_of(ctx)
            if subscribed is not None and caller is not None:
                try:
                    key = level_key(caller, _session(ctx))
                    await (subscribed.add(key, uri) if on else subscribed.remove(key, uri))
                except TRANSIENT_ERRORS as exc:
                    raise MCPError(types.INTERNAL_ERROR, f"unavailable: the subscription could not be kept "
                                   f"({type(exc).__name__})", {"error_type": "unavailable", "retryable": True,
                                                               "hint": "retry with backoff"}) from None
            return types.EmptyResult()
        return toggle

    handlers: dict[str, tuple[type, Callable]] = {"logging/setLevel": (types.SetLevelRequestParams, set_level)}
    if upstreams is not None:
        handlers["resources/subscribe"] = (types.SubscribeRequestParams, handler(True))
        handlers["resources/unsubscribe"] = (types.UnsubscribeRequestParams, handler(False))
    return handlers

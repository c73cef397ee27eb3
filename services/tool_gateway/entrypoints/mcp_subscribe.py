"""`logging/setLevel` and `resources/subscribe` / `resources/unsubscribe` (2025-era methods) on the gateway.

- `logging/setLevel` records the level for the caller's session (mcp_relay.LogLevels: Redis, so any
  replica relaying a call of that session reads it). It is not forwarded to upstreams: the gateway
  holds one connection per upstream for every caller, so one caller's level would silence the
  others; upstreams are asked for every level and the relay filters per session;
- `resources/subscribe` is forwarded to the upstream that serves the URI (found in the catalogs the
  caller may see, as for `resources/read`) when that upstream declares subscriptions, and answered
  `{}`; `resources/unsubscribe` answers `{}` and ends the session's subscription only (the upstream is not
  asked, so it works while that upstream is down): the upstream connection serves every caller, so its
  subscription stays (updates are filtered per session). A session holds at most MAX_PER_SESSION
  subscriptions (one more is -32602). The gateway's own resources (guides, step results) have no
  updates to send, so subscribing to them is accepted and does nothing. The session's subscriptions
  are kept (`Subscribed`: Redis) for its GET stream, on whichever replica, to pass on
  `notifications/resources/updated` for those URIs only; 2026-07-28 clients name the URIs in their
  `subscriptions/listen` request instead (the SDK's ListenHandler over the same change bus), cut to those
  the caller may read (`scoped_listen`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from libs.auth import Principal
from libs.errors import DomainError
from services.tool_gateway.domain.guide import GUIDE_PREFIX
from services.tool_gateway.entrypoints.mcp_guides import STEP_PREFIX, _allowed, _not_found, _relayed
from services.tool_gateway.entrypoints.mcp_relay import LogLevels, level_key
from services.tool_gateway.entrypoints.mcp_sessions import SESSION_HEADER, STATE_ERRORS

__all__ = ["MAX_PER_SESSION", "LocalSubscribed", "Subscribed", "UpstreamSubscriptions", "scoped_listen",
           "session_handlers"]

MAX_PER_SESSION = 100  # resources one session may subscribe to

CallerOf = Callable[[ServerRequestContext], Principal | None]


class UpstreamSubscriptions(Protocol):
    """adapters/upstreams.UpstreamManager."""

    def catalogs(self) -> list[tuple[str, Any, tuple[str, ...]]]: ...

    async def subscribe(self, upstream: str, uri: str) -> None: ...


class Subscribed(Protocol):
    """What each session subscribed to, read by its GET stream (mcp_sessions); Redis: adapters/relay_state.py."""

    async def add(self, key: str, uri: str, limit: int) -> bool:
        """Add `uri` to the session's set unless that would make it hold more than `limit`: False then."""
        ...

    async def remove(self, key: str, uri: str) -> None: ...

    async def has(self, key: str, uri: str) -> bool: ...


class LocalSubscribed:
    """In one process (stdio, tests)."""

    def __init__(self) -> None:
        self._uris: dict[str, set[str]] = {}

    async def add(self, key: str, uri: str, limit: int) -> bool:
        uris = self._uris.setdefault(key, set())
        if uri not in uris and len(uris) >= limit:
            return False
        uris.add(uri)
        return True

    async def remove(self, key: str, uri: str) -> None:
        self._uris.get(key, set()).discard(uri)

    async def has(self, key: str, uri: str) -> bool:
        return uri in self._uris.get(key, ())


def _readable(caller: Principal | None, uri: str, upstreams: UpstreamSubscriptions | None) -> bool:
    """Whether `caller` may read `uri`: the gateway's own resources, or one an upstream it may see serves."""
    if uri.startswith((GUIDE_PREFIX, STEP_PREFIX)):
        return True
    return any(_allowed(caller, scopes) and catalog.serves(uri)
               for _, catalog, scopes in (upstreams.catalogs() if upstreams is not None else []))


def scoped_listen(listen: Callable, caller_of: CallerOf, upstreams: UpstreamSubscriptions | None) -> Callable:
    """`subscriptions/listen` (2026-07-28; the SDK's ListenHandler `listen`) with its resource URIs cut to those
    the caller may read when it listens (the acknowledgement names the URIs honored): an upstream's updates
    reach only callers allowed to see that upstream."""

    async def handle(ctx: ServerRequestContext, params: types.SubscriptionsListenRequestParams):
        wanted = params.notifications.resource_subscriptions
        if wanted:
            caller = caller_of(ctx)
            kept = [uri for uri in wanted if _readable(caller, uri, upstreams)]
            params = params.model_copy(update={"notifications": params.notifications.model_copy(
                update={"resource_subscriptions": kept or None})})
        return await listen(ctx, params)

    return handle


def _unavailable(what: str, exc: BaseException) -> MCPError:
    return MCPError(types.INTERNAL_ERROR, f"unavailable: {what} could not be kept ({type(exc).__name__})",
                    {"error_type": "unavailable", "retryable": True, "hint": "retry with backoff"})


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
        except STATE_ERRORS as exc:
            raise _unavailable("the level", exc) from None
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

    async def subscribe(ctx: ServerRequestContext, params: types.SubscribeRequestParams) -> types.EmptyResult:
        uri = str(params.uri)
        name = owner(ctx, uri)
        caller = caller_of(ctx)
        key = level_key(caller, _session(ctx)) if caller is not None else None
        if subscribed is not None and key is not None:  # the session's own cap first: no upstream call past it
            try:
                added = await subscribed.add(key, uri, MAX_PER_SESSION)
            except STATE_ERRORS as exc:
                raise _unavailable("the subscription", exc) from None
            if not added:
                reason = f"this session holds {MAX_PER_SESSION} subscriptions already"
                raise MCPError(types.INVALID_PARAMS, reason, {
                    "error_type": "validation", "field": "uri", "reason": reason, "retryable": False,
                    "hint": "unsubscribe from resources no longer needed, or open another session"})
        if name is not None and upstreams is not None:
            try:
                await upstreams.subscribe(name, uri)
            except (MCPError, DomainError, OSError) as exc:
                if subscribed is not None and key is not None:  # not subscribed after all
                    try:
                        await subscribed.remove(key, uri)
                    except STATE_ERRORS:
                        pass  # it lapses with the set's time to live
                if isinstance(exc, DomainError) and not exc.retryable:
                    raise MCPError(types.INVALID_PARAMS, exc.reason, exc.to_dict()) from None
                raise _relayed(exc, name) from None
        return types.EmptyResult()

    async def unsubscribe(ctx: ServerRequestContext, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        """The session's subscription ends; the upstream is not asked (its subscription serves every caller)."""
        caller = caller_of(ctx)
        if subscribed is not None and caller is not None:
            try:
                await subscribed.remove(level_key(caller, _session(ctx)), str(params.uri))
            except STATE_ERRORS as exc:
                raise _unavailable("the unsubscription", exc) from None
        return types.EmptyResult()

    handlers: dict[str, tuple[type, Callable]] = {"logging/setLevel": (types.SetLevelRequestParams, set_level)}
    if upstreams is not None:
        handlers["resources/subscribe"] = (types.SubscribeRequestParams, subscribe)
        handlers["resources/unsubscribe"] = (types.UnsubscribeRequestParams, unsubscribe)
    return handlers

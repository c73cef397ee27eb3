"""Sessions that live in no process, for the 2025-era Streamable HTTP wire.

The endpoint stays stateless (any replica answers any request), yet 2025-era clients get what a
session gives them. The answer to `initialize` carries an `Mcp-Session-Id`: a random id the
gateway keeps nowhere, so every replica accepts every id and no client ever hears "session not
found". The id is used for:

- cancellation: a 2025-era client cancels with a `notifications/cancelled` POST, which may reach
  another replica than the call. It is keyed by (tenant, subject, session id, request id), so a
  caller can only cancel its own calls, and sent to every replica (cancels.publish); the replica
  running the call cancels it, which cancels the upstream call in turn;
- the GET stream: server-initiated notifications (`notifications/tools/list_changed` and the
  prompts and resources ones, since prompts and guides follow the tools) from any replica, over
  the shared change bus, and `notifications/resources/updated` for the resources the session
  subscribed to (mcp_subscribe), whichever replica took the subscription. Nothing is replayed: a client that reconnects lists again;
- relaying: what the client declared at `initialize` that the gateway can relay to it (sampling,
  elicitation) rides in the id itself (`<hex>-<flags>`, session_for), read back by mcp_relay;
- DELETE: answered 204, there being nothing to drop.

On the 2026-07-28 wire none of this is needed: a request is cancelled by closing its stream,
and changes come on a `subscriptions/listen` stream (the SDK's ListenHandler over the same bus).
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import anyio
from mcp.shared.subscriptions import (
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)
from redis.exceptions import RedisError
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from libs.auth import Principal
from libs.logs import get_logger
from libs.transient import TRANSIENT_ERRORS

__all__ = ["NOTICE_METHODS", "SESSION_HEADER", "STATE_ERRORS", "CancelPublisher", "ChangeFeed", "InFlightCalls",
           "StatelessSessions", "SessionSubscriptions", "cancel_key", "capabilities_of_session", "issued_session",
           "session_for", "session_key"]

log = get_logger(__name__)
SESSION_HEADER = "mcp-session-id"
# What reading or writing the sessions' shared state (Redis) may raise, a refused command (an ACL, a full
# memory) included: answered as unavailable, or skipped where there is nobody to answer.
STATE_ERRORS: tuple[type[BaseException], ...] = (*TRANSIENT_ERRORS, RedisError)
PING_SECONDS = 15.0  # a comment line this often keeps proxies from closing an idle GET stream
NOTICE_METHODS: dict[type, str] = {ToolsListChanged: "notifications/tools/list_changed",
                             PromptsListChanged: "notifications/prompts/list_changed",
                             ResourcesListChanged: "notifications/resources/list_changed"}


_FLAGS = {"s": "sampling", "e": "elicitation"}
_ISSUED = re.compile(r"[0-9a-f]{32}(-(s|e|se))?")


def session_for(capabilities: Any) -> str:
    """A new session id carrying what the client declared that can be relayed (`<hex>` or `<hex>-<flags>`)."""
    declared = capabilities if isinstance(capabilities, dict) else {}
    flags = "".join(flag for flag, name in _FLAGS.items() if isinstance(declared.get(name), dict))
    return f"{uuid.uuid4().hex}-{flags}" if flags else uuid.uuid4().hex


def issued_session(session: str) -> bool:
    """Whether `session` is shaped like the ids `session_for` makes (this gateway's, or a forgery of one)."""
    return _ISSUED.fullmatch(session) is not None


def capabilities_of_session(session: str) -> dict[str, Any]:
    """What `session_for` put in the id, as MCP client capabilities (a forged id only misleads its own calls)."""
    _, _, flags = session.partition("-")
    caps: dict[str, Any] = {}
    if "s" in flags:
        caps["sampling"] = {}
    if "e" in flags:
        caps["elicitation"] = {"form": {}}
    return caps


def session_key(principal: Principal, session: str) -> str:
    """Whose session this is: what a session keeps (its logging level, its subscriptions) is keyed by it."""
    return "\x1f".join([principal.tenant_id, principal.subject, session])


class SessionSubscriptions(Protocol):
    """The resources each session subscribed to (mcp_subscribe; Redis: adapters/relay_state.py)."""

    async def has(self, key: str, uri: str) -> bool: ...


def cancel_key(principal: Principal, session_id: str, request_id: Any) -> str:
    """Whose call this is: a cancellation names the same caller, session and request id."""
    return "\x1f".join([principal.tenant_id, principal.subject, session_id, json.dumps(request_id)])


class InFlightCalls:
    """The calls running in this process that a 2025-era client may cancel, by cancel_key."""

    def __init__(self) -> None:
        self._scopes: dict[str, anyio.CancelScope] = {}

    @contextlib.contextmanager
    def track(self, key: str | None) -> Iterator[anyio.CancelScope]:
        scope = anyio.CancelScope()
        if key:
            self._scopes[key] = scope
        try:
            with scope:
                yield scope
        finally:
            if key and self._scopes.get(key) is scope:
                del self._scopes[key]

    def cancel(self, key: str) -> bool:
        scope = self._scopes.get(key)
        if scope is None:
            return False
        scope.cancel()
        return True


class CancelPublisher(Protocol):
    async def publish(self, message: dict[str, Any]) -> None:
        """Send `message` to every replica (this one included)."""
        ...


class ChangeFeed(Protocol):
    def subscribe(self, listener: Callable[[ServerEvent], None]) -> Callable[[], None]: ...


def _sse(payload: dict[str, Any]) -> bytes:
    return f"event: message\ndata: {json.dumps(payload)}\n\n".encode()


class StatelessSessions:
    """ASGI middleware after authentication and the JSON-RPC envelope check (which leaves the parsed
    message in `scope["mcp.message"]`), in front of the SDK's stateless transport."""

    def __init__(self, app: ASGIApp, *, in_flight: InFlightCalls, cancels: CancelPublisher | None,
                 changes: ChangeFeed | None, subscriptions: SessionSubscriptions | None = None) -> None:
        self.app, self.in_flight, self.cancels, self.changes = app, in_flight, cancels, changes
        self.subscriptions = subscriptions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        session = headers.get(SESSION_HEADER, "")
        method = scope["method"]
        if method == "POST":
            await self._post(scope, receive, send, session)
        elif method == "GET" and "text/event-stream" in headers.get("accept", ""):
            if not session:
                await _refuse(400, "a GET stream belongs to a session: send the Mcp-Session-Id that initialize "
                                   "answered (2026-07-28 clients use subscriptions/listen)", scope, receive, send)
            elif self.changes is None:
                await _refuse(405, "this endpoint sends no server-initiated messages", scope, receive, send)
            else:
                await self._stream(session, scope, receive, send)
        elif method == "DELETE" and session:
            await Response(status_code=204)(scope, receive, send)  # nothing is kept for a session
        else:
            await _refuse(405, "this MCP endpoint answers POST, GET (text/event-stream, with a session) and "
                               "DELETE (with a session)", scope, receive, send)

    async def _post(self, scope: Scope, receive: Receive, send: Send, session: str) -> None:
        message = scope.get("mcp.message")
        if not isinstance(message, dict):
            await self.app(scope, receive, send)
            return
        if message.get("method") == "notifications/cancelled" and "id" not in message and session:
            params = message.get("params")
            await self._cancel(scope, session, params if isinstance(params, dict) else {})
            await Response(status_code=202)(scope, receive, send)
            return
        if message.get("method") == "initialize" and "id" in message and not session:
            params = message.get("params")  # malformed params: the SDK answers -32602 (the id is not used)
            new_session = session_for(params.get("capabilities") if isinstance(params, dict) else None)

            async def send_with_session(msg: Message) -> None:
                if msg["type"] == "http.response.start" and msg["status"] == 200:
                    msg = {**msg, "headers": [*msg.get("headers", []),
                                              (SESSION_HEADER.encode(), new_session.encode())]}
                await send(msg)

            await self.app(scope, receive, send_with_session)
            return
        await self.app(scope, receive, send)

    async def _cancel(self, scope: Scope, session: str, params: dict[str, Any]) -> None:
        user = scope.get("user")
        principal = getattr(user, "principal", None)
        if principal is None or "requestId" not in params:
            return
        key = cancel_key(principal, session, params["requestId"])
        if self.in_flight.cancel(key):  # running here: no need to ask the others
            log.info("call cancelled", request_id=params["requestId"])
            return
        if self.cancels is not None:
            try:
                await self.cancels.publish({"key": key})
            except STATE_ERRORS as exc:  # a notification has nobody to answer: log, and the call runs on
                log.warning("cancellation not broadcast", error=type(exc).__name__)

    async def _stream(self, session: str, scope: Scope, receive: Receive, send: Send) -> None:
        assert self.changes is not None
        events: set[str] = set()
        updated: list[str] = []  # resources/updated: sent when this session subscribed to the URI
        principal = getattr(scope.get("user"), "principal", None)
        woken = anyio.Event()
        wake = [woken]

        def deliver(event: ServerEvent) -> None:
            if isinstance(event, ResourceUpdated):
                if self.subscriptions is not None and principal is not None and event.uri not in updated:
                    updated.append(event.uri)
                    wake[0].set()
                return
            # Change events are level triggers: a burst collapses to one notification of each kind.
            method = NOTICE_METHODS.get(type(event))
            if method is not None:
                events.add(method)
                wake[0].set()

        unsubscribe = self.changes.subscribe(deliver)
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
                                    (b"x-accel-buffering", b"no"), (SESSION_HEADER.encode(), session.encode())]})
            async with anyio.create_task_group() as tg:

                async def until_disconnect() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(until_disconnect)
                await send({"type": "http.response.body", "body": b": stream open\n\n", "more_body": True})
                while True:
                    with anyio.move_on_after(PING_SECONDS):
                        await wake[0].wait()
                    wake[0] = anyio.Event()
                    if not events and not updated:
                        await send({"type": "http.response.body", "body": b": ping\n\n", "more_body": True})
                        continue
                    uris = list(updated)
                    updated.clear()
                    for uri in uris:
                        await self._send_update(principal, session, uri, send)
                    pending = sorted(events)
                    events.clear()
                    for method in pending:
                        await send({"type": "http.response.body", "body": _sse({"jsonrpc": "2.0", "method": method}),
                                    "more_body": True})
        finally:
            unsubscribe()


    async def _send_update(self, principal: Principal, session: str, uri: str, send: Send) -> None:
        assert self.subscriptions is not None
        try:
            subscribed = await self.subscriptions.has(session_key(principal, session), uri)
        except STATE_ERRORS as exc:  # this update is lost; the stream stays
            log.warning("resource update not sent", error=type(exc).__name__)
            return
        if subscribed:
            await send({"type": "http.response.body", "more_body": True, "body": _sse(
                {"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": uri}})})


async def _refuse(status: int, reason: str, scope: Scope, receive: Receive, send: Send) -> None:
    headers = {"Allow": "POST, GET, DELETE"} if status == 405 else {}
    await Response(reason, status_code=status, headers=headers)(scope, receive, send)

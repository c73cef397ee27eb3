"""The lean path of the Streamable HTTP endpoint: a plain `tools/call` POST answered without the SDK's machinery.

A call is most of what the endpoint serves, and the SDK spends more CPU on one (a transport, a
dispatcher, a server runner, its middleware and memory streams per request) than the gateway's whole
pipeline. A POST whose JSON-RPC message is a `tools/call` request that needs nothing from that
machinery is answered here, with the same checks and the same bytes:

- what the SDK checks first is checked the same way (Content-Type, Host and Origin against the same
  settings, Accept naming JSON and SSE, the body's size, the 2026-07-28 envelope ladder and its
  routing headers, the params against the revision's schema) — but a request that fails any check
  is not refused here: it goes on to the SDK, which refuses it in its own words;
- what needs a stream from server to client goes to the SDK too: a progress token (its progress is
  relayed), a task-augmented call, a protocol version the lean path does not serve (not a known one;
  none outside a session this gateway issued: in one, a call without the header is a 2025-03-26 one, as
  the spec says to assume);
- `Mcp-Param-*` headers (2026-07-28): the input schema tools/list shows the caller for the tool (what
  its client mirrors headers from) is looked up first (`schema_of`), for every 2026-07-28
  `tools/call`, and kept for the request (`PARAM_SCHEMA`, which the SDK's `get_tool_input_schema` hook
  answers from). The lean path serves a call whose headers mirror the arguments that schema marks
  `x-mcp-header` exactly as the SDK checks them; a call with a header that disagrees, is missing, or
  names no marked argument goes to the SDK, which refuses a mismatch with its 400 (HEADER_MISMATCH) and
  ignores a header nothing marks. A tool not listed to the caller is not checked: its call is refused
  in the pipeline, audited;
- the call itself is `mcp_server.answer_call`, what the SDK's handler runs, inside the same
  OpenTelemetry span; its result is shaped for the wire by the SDK's own per-revision serialiser
  (`resultType` and the `serverInfo` stamp on 2026-07-28);
- the answer: 2026-07-28, `application/json` (the SDK's answer to a call that emitted nothing);
  2025-11-25, one SSE `message` event. A call still running after `DEFERRAL_SECONDS` commits the
  SSE stream and keeps it alive with comment pings, as the SDK does;
- cancellation: a client that closes the request's stream (2026-07-28) cancels the call, upstream
  too; a 2025-era `notifications/cancelled` finds it by its key (mcp_sessions), as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.runner import modern_error_data
from mcp.server.streamable_http import check_accept_headers
from mcp.server.transport_security import (
    DEFAULT_MAX_REQUEST_BODY_SIZE,
    TransportSecurityMiddleware,
    TransportSecuritySettings,
)
from mcp.shared._otel import extract_trace_context, otel_span
from mcp.shared.inbound import (
    MCP_PARAM_HEADER_PREFIX,
    classify_inbound_request,
    find_duplicated_routing_header,
    find_invalid_x_mcp_header,
    validate_mcp_param_headers,
    x_mcp_header_map,
)
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
from mcp_types import DEFAULT_NEGOTIATED_VERSION, methods
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from opentelemetry.trace import SpanKind, StatusCode
from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from libs.logs import get_logger
from services.tool_gateway.entrypoints.mcp_sessions import SESSION_HEADER, InFlightCalls, cancel_key, issued_session

__all__ = ["DEFERRAL_SECONDS", "BODY_BYTES", "PARAM_SCHEMA", "FastCalls", "param_schema"]

log = get_logger(__name__)
T = TypeVar("T")
DEFERRAL_SECONDS = 15.0  # the SDK's: how long a call may run before the SSE stream is committed
BODY_BYTES = "mcp.body_bytes"  # the body's size in the ASGI scope (JsonRpcGuard)
_PARAM_PREFIX = MCP_PARAM_HEADER_PREFIX.lower().encode()
_JSON_HEADERS = [(b"content-type", b"application/json")]
_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache, no-transform"),
                (b"connection", b"keep-alive"), (b"x-accel-buffering", b"no")]
_PING = b": ping\r\n\r\n"
_KNOWN_MIDDLEWARE = frozenset({"OpenTelemetryMiddleware", "TaskMiddleware"})
# The (tool name, input schema) of the 2026-07-28 tools/call being served, for the SDK's header check.
PARAM_SCHEMA: contextvars.ContextVar[tuple[str, dict[str, Any] | None] | None] = contextvars.ContextVar(
    "mcp_param_schema", default=None)


_MARKED: dict[int, tuple[dict[str, Any], frozenset[bytes]]] = {}  # by id(schema), the schema held so ids stay its


def _marked(schema: dict[str, Any]) -> frozenset[bytes]:
    """The `Mcp-Param-*` header names (lowercase) of the arguments `schema` marks `x-mcp-header`; none for a
    schema whose marks are invalid (the SDK checks nothing then, and clients drop the tool). Remembered per
    schema object: the registry's cache hands out the same ones while they are current."""
    held = _MARKED.get(id(schema))
    if held is not None and held[0] is schema:
        return held[1]
    names = frozenset() if find_invalid_x_mcp_header(schema) is not None else frozenset(
        f"{MCP_PARAM_HEADER_PREFIX}{token}".lower().encode() for token in x_mcp_header_map(schema).values())
    if len(_MARKED) >= 4_096:
        _MARKED.clear()
    _MARKED[id(schema)] = (schema, names)
    return names


def param_schema(name: str) -> dict[str, Any] | None:
    """The SDK's `get_tool_input_schema` hook: the schema FastCalls looked up for this request's call of `name`
    (None: none, and the SDK skips the `Mcp-Param-*` check, as for a tool it does not know)."""
    held = PARAM_SCHEMA.get()
    return held[1] if held is not None and held[0] == name else None


class _Plan:
    __slots__ = ("version", "params", "request_id", "session", "modern")

    def __init__(self, version: str, params: types.CallToolRequestParams, request_id: Any, session: str,
                 modern: bool) -> None:
        self.version, self.params, self.request_id, self.session, self.modern = (version, params, request_id,
                                                                                 session, modern)


async def while_connected(work: Coroutine[Any, Any, T], watch: Coroutine[Any, Any, None],
                          left: Callable[[], bool]) -> T | None:
    """Await `work` (a request's answer) while `watch` watches the client's stream, which cancels this task
    when the client leaves. None when the client left (`left()`): nobody to answer (the call is audited).
    A cancellation of the request itself (the server stops) goes on."""
    task = asyncio.current_task()
    assert task is not None
    watcher = asyncio.create_task(watch)
    try:
        reply = await work
    except asyncio.CancelledError:
        if left() and task.uncancel() == 0:
            return None
        raise
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher  # a ping it is sending ends before the answer goes out
    if task.cancelling():  # this task itself was cancelled meanwhile
        raise asyncio.CancelledError
    return reply


class FastCalls:
    """ASGI middleware in front of the SDK app (after authentication and the JSON-RPC guard)."""

    def __init__(self, app: ASGIApp, server: Server, answer, *, path: str, security: TransportSecuritySettings,
                 in_flight: InFlightCalls, max_body: int = DEFAULT_MAX_REQUEST_BODY_SIZE,
                 schema_of: Callable[[Any, str], Awaitable[dict[str, Any] | None]] | None = None) -> None:
        """`answer(caller, params, cancel=key, version=revision)`: the call (mcp_server.answer_call, bound to its
        ports); `schema_of(caller, name)`: the input schema tools/list shows the caller for `name`
        (handlers.listed_schema); without it `Mcp-Param-*` headers are not checked."""
        self.app, self.server, self.answer, self.path, self.schema_of = app, server, answer, path, schema_of
        self.security, self.in_flight, self.max_body = TransportSecurityMiddleware(security), in_flight, max_body
        # Cache hints for tools/call, or middleware besides the span (replayed here) and the task one (whose
        # calls go to the SDK), would shape calls in ways this path does not: then the SDK serves them all.
        self.enabled = server.cache_hints.get("tools/call") is None and all(
            type(m).__name__ in _KNOWN_MIDDLEWARE for m in server.middleware)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = scope.get("mcp.message") if scope["type"] == "http" else None
        if not (isinstance(message, dict) and message.get("method") == "tools/call" and "id" in message
                and scope["method"] == "POST" and scope["path"] == self.path):
            await self.app(scope, receive, send)
            return
        held = await self._schema(scope, message)
        kept = PARAM_SCHEMA.set(held)
        try:
            plan = self._plan(scope, message, held) if self.enabled else None
            if plan is None:
                await self.app(scope, receive, send)
                return
        finally:
            PARAM_SCHEMA.reset(kept)
        await self._serve(plan, scope, receive, send)

    async def _schema(self, scope: Scope, message: dict[str, Any]) -> tuple[str, dict[str, Any] | None] | None:
        """(name, the input schema its `Mcp-Param-*` headers are checked against) of a 2026-07-28 call by an
        authenticated caller; None otherwise (no check: the revision has no such headers, or the call is
        refused anyway)."""
        params = message.get("params")
        name = params.get("name") if isinstance(params, dict) else None
        caller = getattr(scope.get("user"), "principal", None)
        if self.schema_of is None or not isinstance(name, str) or caller is None:
            return None
        version = next((v for k, v in scope["headers"] if k == b"mcp-protocol-version"), b"").decode("latin-1")
        if version not in MODERN_PROTOCOL_VERSIONS:
            return None
        try:
            return name, await self.schema_of(caller, name)
        except Exception as exc:  # noqa: BLE001 - the registry is unreachable: the call fails on it, in its words
            log.warning("tool schema not looked up for the Mcp-Param check", tool=name[:128], error=repr(exc)[:200])
            return None

    def _plan(self, scope: Scope, message: dict[str, Any],
              held: tuple[str, dict[str, Any] | None] | None = None) -> _Plan | None:
        """What the call needs when this path may serve it; None sends it to the SDK."""
        if scope.get(BODY_BYTES, self.max_body + 1) > self.max_body:
            return None
        raw = scope["headers"]
        mirrored = {name for name, _ in raw if name.startswith(_PARAM_PREFIX)}
        schema = held[1] if held is not None else None
        marked = _marked(schema) if schema is not None else frozenset()
        if mirrored and not mirrored <= marked:
            return None  # headers no schema marks (or none to check them against): the SDK ignores them
        request = Request(scope)
        headers = request.headers
        if not self.security._validate_content_type(headers.get("content-type")):
            return None
        settings = self.security.settings
        if settings.enable_dns_rebinding_protection and not (
                self.security._validate_host(headers.get("host"))
                and self.security._validate_origin(headers.get("origin"))):
            return None
        has_json, has_sse = check_accept_headers(request)
        if not (has_json and has_sse):
            return None
        params = message.get("params")
        if not isinstance(params, dict) or "task" in params or progress_token_from_params(params) is not None:
            return None
        version = headers.get("mcp-protocol-version")
        if version is None and issued_session(headers.get(SESSION_HEADER, "")):
            version = DEFAULT_NEGOTIATED_VERSION  # a 2025-03-26 client sends no header (that revision has none)
        modern = version in MODERN_PROTOCOL_VERSIONS
        if modern:
            if find_duplicated_routing_header((k.decode("latin-1"), v) for k, v in raw) is not None:
                return None
            verdict = classify_inbound_request(message, headers=dict(headers))
            if not hasattr(verdict, "protocol_version"):  # a rejection: the SDK words it
                return None
            version = verdict.protocol_version
        elif version not in HANDSHAKE_PROTOCOL_VERSIONS:
            return None
        try:
            methods.validate_client_request("tools/call", version, params)
            typed = types.CallToolRequestParams.model_validate(params, by_name=False)
        except (ValidationError, KeyError):
            return None
        if modern and marked and validate_mcp_param_headers(schema, typed.arguments or {}, headers) is not None:
            return None  # a header missing or disagreeing: the SDK refuses it, in its words
        return _Plan(version, typed, message["id"], headers.get(SESSION_HEADER, ""), modern)

    async def _serve(self, plan: _Plan, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        committed = False  # the SSE stream's headers went out (a long call)
        gone = False

        async def watch() -> None:
            """The client closing its stream cancels the call; a long call gets the SSE stream and pings."""
            nonlocal committed, gone
            while True:
                try:
                    async with asyncio.timeout(DEFERRAL_SECONDS):
                        event = await receive()
                except TimeoutError:
                    if not committed:
                        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
                        committed = True
                    await send({"type": "http.response.body", "body": _PING, "more_body": True})
                    continue
                if event["type"] == "http.disconnect":
                    gone = True
                    task.cancel()
                    return

        reply = await while_connected(self._reply(plan, scope), watch(), lambda: gone)
        if reply is None:
            return
        body = json.dumps(reply, separators=(",", ":"))
        if committed or not plan.modern:
            frame = f"event: message\r\ndata: {body}\r\n\r\n".encode()
            if not committed:
                await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            await send({"type": "http.response.body", "body": frame, "more_body": False})
            return
        payload = body.encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*_JSON_HEADERS, (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload, "more_body": False})

    async def _reply(self, plan: _Plan, scope: Scope) -> dict[str, Any]:
        """The JSON-RPC answer: the call's result, or the SDK's error for a handler that raised."""
        user = scope.get("user")
        caller = getattr(user, "principal", None)
        cancel = cancel_key(caller, plan.session, plan.request_id) if plan.session and caller is not None else None
        name = plan.params.name
        attributes = {"mcp.method.name": "tools/call", "mcp.protocol.version": plan.version,
                      "jsonrpc.request.id": str(plan.request_id), "gen_ai.operation.name": "execute_tool",
                      "gen_ai.tool.name": name}
        with otel_span(name=f"tools/call {name}", kind=SpanKind.SERVER, attributes=attributes,
                       context=extract_trace_context(plan.params.meta), record_exception=False,
                       set_status_on_exception=False) as span:
            try:
                result = await self.answer(caller, plan.params, cancel=cancel, version=plan.version)
                if result.is_error:
                    span.set_attribute("error.type", "tool_error")
                    span.set_status(StatusCode.ERROR)
                dumped = methods.serialize_server_result(
                    "tools/call", plan.version, result.model_dump(by_alias=True, mode="json", exclude_none=True))
            except Exception as exc:  # noqa: BLE001 - the SDK's boundary: an error answer, never a crash
                span.set_attribute("error.type", type(exc).__qualname__)
                span.set_status(StatusCode.ERROR, str(exc))
                error = modern_error_data(exc)
                return {"jsonrpc": "2.0", "id": plan.request_id,
                        "error": error.model_dump(by_alias=True, mode="json", exclude_none=True)}
        if plan.modern:
            if dumped.get("resultType") is None:
                dumped["resultType"] = "complete"
            meta = dumped.get("_meta")
            if meta is None:
                dumped["_meta"] = {"io.modelcontextprotocol/serverInfo": self.server.server_info_stamp}
            elif isinstance(meta, dict) and meta.get("io.modelcontextprotocol/serverInfo") is None:
                dumped["_meta"] = {**meta, "io.modelcontextprotocol/serverInfo": self.server.server_info_stamp}
        return {"jsonrpc": "2.0", "id": plan.request_id, "result": dumped}

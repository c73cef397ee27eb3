"""Relaying an upstream's log messages and requests to the calling client, on the 2025-11-25 Streamable HTTP wire.

An upstream serving a call may log (`notifications/message`) and ask its client things
(`sampling/createMessage`, `elicitation/create`). The gateway is that client; it passes them on to
its own caller on the call's SSE response stream, and the caller's answer back (upstream_http.py
does the upstream side):

- which calls: a 2025-era `tools/call` POST that carries a session id this gateway issued
  (mcp_sessions) is served here, its SSE stream opened at once, instead of by the lean path (a
  2025-03-26 client, which sends no `MCP-Protocol-Version` header, included: mcp_fast); what
  the client declared at `initialize` (`sampling`, `elicitation`) rides in that session id, since no
  replica keeps sessions. A request is relayed only when the client declared its capability;
  otherwise the upstream is answered JSON-RPC error -32021 (missing required client capability);
- log messages: relayed at or above the level the client set with `logging/setLevel` for its
  session (kept in Redis, `LogLevels`; all levels until it sets one), read once per call, when the
  call's first message arrives;
- answers: the client POSTs its answer to a relayed request, and that POST may reach any replica.
  It is published to every replica (`AnswerPublisher`, a Redis channel) under a key of (tenant,
  subject, session, relayed request id), which the waiting call subscribed to before asking: an
  answer from another caller or session has another key and reaches nothing. A relayed request
  unanswered after `timeout` seconds, or by the call's deadline (less a margin for the upstream,
  upstream_http.CallerAsked), fails the upstream's request (-32001, request timeout) and is withdrawn
  from the client (`notifications/cancelled`); an answer POST passes the SDK's POST checks first;
- progress: a call with a progress token is served here too, its progress on the same stream.

On 2026-07-28 there is no server-to-client request mid-call (the revision's multi-round-trip
`input_required` results replace them); those calls are not relayed (README, tool-gateway).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from collections.abc import Iterator
from typing import Any, Protocol

from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from libs.auth import Principal
from libs.logs import get_logger
from services.tool_gateway.entrypoints.mcp_fast import BODY_BYTES, FastCalls, while_connected
from services.tool_gateway.entrypoints.mcp_sessions import (
    SESSION_HEADER,
    STATE_ERRORS,
    cancel_key,
    capabilities_of_session,
)
from services.tool_gateway.entrypoints.mcp_sessions import session_key as level_key
from services.tool_gateway.service_layer.call_context import RelayRefused, relaying, reporting_progress

__all__ = ["LOG_LEVELS", "AnswerPublisher", "ClientRelay", "LocalLogLevels", "LogLevels", "RelayAnswers",
           "RelayCalls", "level_key"]

log = get_logger(__name__)
RELAY_ID_PREFIX = "mnemesh-relay-"
_RELAY_ID = re.compile(re.escape(RELAY_ID_PREFIX) + "[0-9a-f]{32}")  # what ClientRelay.ask sends
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
MISSING_CAPABILITY = -32021
REQUEST_TIMEOUT = -32001
PING_SECONDS = 15.0
_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache, no-transform"),
                (b"connection", b"keep-alive"), (b"x-accel-buffering", b"no")]
_NEEDS = {"sampling/createMessage": "sampling", "elicitation/create": "elicitation"}


class LogLevels(Protocol):
    async def get(self, key: str) -> str | None: ...

    async def set(self, key: str, level: str) -> None: ...


class LocalLogLevels:
    """In one process (stdio, tests)."""

    def __init__(self) -> None:
        self._levels: dict[str, str] = {}

    async def get(self, key: str) -> str | None:
        return self._levels.get(key)

    async def set(self, key: str, level: str) -> None:
        self._levels[key] = level


class AnswerPublisher(Protocol):
    async def publish(self, message: dict[str, Any]) -> None:
        """Send `message` to every replica (this one included)."""
        ...


class RelayAnswers:
    """The relayed requests waiting in this process, by key; answers come from any replica (`deliver`)."""

    def __init__(self, publisher: AnswerPublisher | None = None) -> None:
        self.publisher = publisher
        self._waiting: dict[str, asyncio.Future] = {}

    @contextlib.contextmanager
    def waiting(self, key: str) -> Iterator[asyncio.Future]:
        future = asyncio.get_running_loop().create_future()
        self._waiting[key] = future
        try:
            yield future
        finally:
            if self._waiting.get(key) is future:
                del self._waiting[key]

    def deliver(self, message: dict[str, Any]) -> None:
        future = self._waiting.get(str(message.get("relay", "")))
        if future is not None and not future.done() and isinstance(message.get("answer"), dict):
            future.set_result(message["answer"])

    async def publish(self, key: str, answer: dict[str, Any]) -> None:
        message = {"relay": key, "answer": answer}
        if key in self._waiting or self.publisher is None:  # waiting here: no need to tell the others
            self.deliver(message)
        else:
            await self.publisher.publish(message)


class ClientRelay:
    """The calling client of one call (call_context.CallRelay), reached through `emit` (its SSE stream)."""

    def __init__(self, emit, answers: RelayAnswers, principal: Principal, session: str, levels: LogLevels,
                 timeout: float) -> None:
        self.emit, self.answers, self.principal, self.session = emit, answers, principal, session
        self.levels, self.timeout = levels, timeout
        self.capabilities = capabilities_of_session(session)
        self._minimum: int | None = None

    async def log(self, params: dict[str, Any]) -> None:
        if self._minimum is None:
            try:
                level = await self.levels.get(level_key(self.principal, self.session))
            except STATE_ERRORS as exc:  # the call goes on, with every level relayed
                log.warning("logging level not read", error=type(exc).__name__)
                level = None
            self._minimum = LOG_LEVELS.index(level) if level in LOG_LEVELS else 0
        level = params.get("level")
        if level in LOG_LEVELS and LOG_LEVELS.index(level) >= self._minimum:
            await self.emit({"jsonrpc": "2.0", "method": "notifications/message", "params": params})

    async def ask(self, method: str, params: dict[str, Any], *, within: float | None = None) -> dict[str, Any]:
        """`within`: what is left of the call's deadline for the answer (the wait is the shorter of it and
        `timeout`): a slow answer fails the upstream's request before the call itself runs out of time."""
        need = _NEEDS.get(method)
        if need is None or need not in self.capabilities:
            raise RelayRefused(MISSING_CAPABILITY, f"the calling client did not declare the {need or method} "
                                                   "capability to the gateway")
        wait = self.timeout if within is None else min(self.timeout, within)
        if wait <= 0:
            raise RelayRefused(REQUEST_TIMEOUT, f"no time is left in the call's deadline to ask the client {method}")
        relay_id = f"{RELAY_ID_PREFIX}{uuid.uuid4().hex}"
        with self.answers.waiting(cancel_key(self.principal, self.session, relay_id)) as answer:
            await self.emit({"jsonrpc": "2.0", "id": relay_id, "method": method, "params": params})
            reason, answered = "the call ended before the answer came", False
            try:
                async with asyncio.timeout(wait):
                    reply = await answer
                answered = True
            except TimeoutError:
                reason = f"the calling client did not answer {method} within {wait:.3g} s"
                raise RelayRefused(REQUEST_TIMEOUT, reason) from None
            finally:
                if not answered:  # a timeout, or the call ended: the client may stop asking its user
                    await self._withdraw(relay_id, reason)
        if "error" in reply:
            error = reply["error"] if isinstance(reply["error"], dict) else {}
            code = error.get("code")
            raise RelayRefused(code if isinstance(code, int) else -32603, str(error.get("message", "error"))[:500])
        result = reply.get("result")
        return result if isinstance(result, dict) else {}


    async def _withdraw(self, relay_id: str, reason: str) -> None:
        """`notifications/cancelled` for a relayed request, on the call's stream while it is open (best effort)."""
        try:
            await self.emit({"jsonrpc": "2.0", "method": "notifications/cancelled",
                             "params": {"requestId": relay_id, "reason": reason}})
        except Exception as exc:  # noqa: BLE001 - the stream is gone: nobody to tell
            log.debug("relayed request not withdrawn", error=type(exc).__name__)


def _frame(payload: dict[str, Any]) -> bytes:
    return f"event: message\r\ndata: {json.dumps(payload, separators=(',', ':'))}\r\n\r\n".encode()


class RelayCalls(FastCalls):
    """ASGI middleware in front of the lean path (FastCalls): 2025-11-25 calls with a session, and the
    clients' answers to relayed requests. `answer` reads the progress reporter from the call context."""

    def __init__(self, app, server, answer, *, path, security, in_flight, answers: RelayAnswers, levels: LogLevels,
                 timeout: float) -> None:
        super().__init__(app, server, answer, path=path, security=security, in_flight=in_flight)
        self.answers, self.levels, self.timeout = answers, levels, timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = scope.get("mcp.message") if scope["type"] == "http" else None
        if isinstance(message, dict) and scope["method"] == "POST" and scope["path"] == self.path:
            session = dict(scope["headers"]).get(SESSION_HEADER.encode(), b"").decode("latin-1")
            relay_id = message.get("id")
            if "method" not in message and isinstance(relay_id, str) and _RELAY_ID.fullmatch(relay_id):
                await self._take_answer(message, session, scope, receive, send)
                return
            if message.get("method") == "tools/call" and "id" in message and session and self.enabled:
                params = message.get("params")
                token = progress_token_from_params(params) if isinstance(params, dict) else None
                if token is not None:  # planned without it; its progress is relayed here
                    meta = {k: v for k, v in (params.get("_meta") or {}).items() if k != "progressToken"}
                    message = {**message, "params": {**params, "_meta": meta}}
                plan = self._plan(scope, message)
                if plan is not None and plan.version not in MODERN_PROTOCOL_VERSIONS:
                    await self._stream(plan, token, session, scope, receive, send)
                    return
        await self.app(scope, receive, send)

    async def _take_answer(self, message: dict[str, Any], session: str, scope: Scope, receive: Receive,
                           send: Send) -> None:
        """The client's answer to a relayed request, after the checks the SDK makes of any POST (Content-Type,
        Host and Origin, the body's size)."""
        refusal = await self.security.validate_request(Request(scope), is_post=True)
        if refusal is None and scope.get(BODY_BYTES, self.max_body + 1) > self.max_body:
            refusal = Response("Request body too large", status_code=413)  # as the SDK words it
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        principal = getattr(scope.get("user"), "principal", None)
        if principal is None or not session:
            await Response("an answer to a relayed request needs the session it was asked on", status_code=400)(
                scope, receive, send)
            return
        answer = {k: message[k] for k in ("result", "error") if k in message}
        try:
            await self.answers.publish(cancel_key(principal, session, message["id"]), answer)
        except STATE_ERRORS as exc:
            log.warning("relayed answer not published", error=type(exc).__name__)
            await Response("the answer could not be passed on; retry", status_code=503)(scope, receive, send)
            return
        await Response(status_code=202)(scope, receive, send)

    async def _stream(self, plan, token, session: str, scope: Scope, receive: Receive, send: Send) -> None:
        principal = getattr(scope.get("user"), "principal", None)
        task = asyncio.current_task()
        assert task is not None
        lock = asyncio.Lock()
        gone = closed = False

        async def emit(payload: dict[str, Any]) -> None:
            async with lock:
                if closed or gone:  # the answer went out, or the client left: nothing more on this stream
                    return
                await send({"type": "http.response.body", "body": _frame(payload), "more_body": True})

        async def report(progress: float, total: float | None, text: str | None) -> None:
            params = {"progressToken": token, "progress": progress, "total": total, "message": text}
            await emit({"jsonrpc": "2.0", "method": "notifications/progress",
                        "params": {k: v for k, v in params.items() if v is not None}})

        async def watch() -> None:
            """The client closing its stream cancels the call; pings keep proxies from closing it meanwhile."""
            nonlocal gone
            while True:
                try:
                    async with asyncio.timeout(PING_SECONDS):
                        event = await receive()
                except TimeoutError:
                    async with lock:
                        await send({"type": "http.response.body", "body": b": ping\r\n\r\n", "more_body": True})
                    continue
                if event["type"] == "http.disconnect":
                    gone = True
                    task.cancel()
                    return

        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        relay = ClientRelay(emit, self.answers, principal, session, self.levels, self.timeout) if principal else None
        async def answer() -> dict[str, Any]:
            with relaying(relay), reporting_progress(report if token is not None else None):
                return await self._reply(plan, scope)

        reply = await while_connected(answer(), watch(), lambda: gone)
        if reply is None:
            return
        async with lock:
            closed = True
            await send({"type": "http.response.body", "body": _frame(reply), "more_body": False})

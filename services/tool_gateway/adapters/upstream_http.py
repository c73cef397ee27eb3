"""A tools/call on a Streamable HTTP upstream as one JSON-RPC POST, on kept-alive HTTP/1.1 connections (http1.py).

The SDK client spends more CPU on a call (a session, a dispatcher, memory streams, a task per
request, a transport task per POST) than the gateway's whole pipeline. Once the SDK client has
connected the upstream (handshake or discovery, the tools listed), a plain call — no progress
asked for — is sent here instead, with what the SDK would send: the negotiated protocol version,
the session id on 2025-era upstreams, the routing headers (`Mcp-Method`, `Mcp-Name`, and the `Mcp-Param-*`
headers of the arguments the tool's schema marks `x-mcp-header`) and the `_meta` envelope on 2026-07-28.
The answer is read as JSON or as an SSE stream; the SDK path stays for everything else (progress,
resources, prompts, completions, listing, the liveness probe).

On the way:
- a `notifications/tools/list_changed` on the call's stream is passed on (`on_notice`); progress
  goes to the caller's reporter and `notifications/message` to the caller's relay when it has them
  (call_context), other notifications are dropped;
- a request from the upstream on the call's stream (`sampling/createMessage`, `elicitation/create`)
  is asked of the calling client through its relay and the answer (or the relay's JSON-RPC error)
  POSTed back; without a relay -32021 (missing client capability); anything else (roots): "method
  not found";
- a 2026-07-28 upstream that answers `input_required` has its input requests asked of the client
  the same way and the call retried with `inputResponses` and the echoed `requestState`;
- a cancelled call (the caller went away, its deadline passed) closes the request's stream, which
  is how a 2026-07-28 upstream hears of it; a 2025-era upstream is also sent `notifications/cancelled`;
- a JSON-RPC error answers `UpstreamRefused` (the manager maps it, as it maps the SDK's MCPError);
  a broken transport or a lost session raises `UpstreamBroken`, for the manager to reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import Callable
from typing import Any

import httpx2
from mcp.shared.inbound import encode_header_value
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from libs.logs import get_logger
from services.tool_gateway.adapters.http1 import Http1Pool, Http1Response
from services.tool_gateway.service_layer.call_context import CallRelay, ProgressFn, RelayRefused

__all__ = ["CallerAsked", "LeanHttpCaller", "SessionTracker", "UpstreamBroken", "UpstreamRefused"]

log = get_logger(__name__)
_METHOD_NOT_FOUND = -32601
_MISSING_CAPABILITY = -32021
_INTERNAL_ERROR = -32603
_LIST_CHANGED = "notifications/tools/list_changed"
LOG_LEVEL_META = "io.modelcontextprotocol/logLevel"  # 2026-07-28: a request's opt-in to log messages
RELAYED_REQUESTS = frozenset({"sampling/createMessage", "elicitation/create"})
MAX_ROUNDS = 8  # input_required rounds of one call (2026-07-28)
UPSTREAM_MARGIN = 2.0  # seconds of the call's deadline left to the upstream after a relayed request (at most)


class CallerAsked:
    """What the calling client made of the upstream's requests during one call: `refused` when it could not
    be asked (-32021), did not answer in time, answered an error, or declined or cancelled an elicitation.
    The call's failure is then the caller's doing, not the upstream's (it does not count against its breaker).
    `deadline`: the loop time by which the call must end; a relayed request waits no longer (less a margin)."""

    __slots__ = ("refused", "deadline")

    def __init__(self, deadline: float | None = None) -> None:
        self.refused, self.deadline = False, deadline

    def within(self) -> float | None:
        """How long a relayed request may wait for the client: what is left of the deadline, less the time the
        upstream needs to answer the call after it (UPSTREAM_MARGIN, or a quarter of what is left)."""
        if self.deadline is None:
            return None
        left = self.deadline - asyncio.get_running_loop().time()
        return max(0.0, left - min(UPSTREAM_MARGIN, left / 4))

    async def ask(self, relay: CallRelay, method: str, params: dict[str, Any]) -> dict[str, Any]:
        try:
            result = await relay.ask(method, params, within=self.within())
        except RelayRefused:
            self.refused = True
            raise
        if method == "elicitation/create" and result.get("action") in ("decline", "cancel"):
            self.refused = True
        return result


class _OneCall:
    """One tools/call POST: its id, and where what the upstream sends beside the answer goes."""

    __slots__ = ("request_id", "relay", "report", "asking", "asked")

    def __init__(self, request_id: str, relay: CallRelay | None, report: ProgressFn | None,
                 asked: CallerAsked | None = None) -> None:
        self.request_id, self.relay, self.report = request_id, relay, report
        self.asking: set[asyncio.Task] = set()  # the upstream's requests being asked of the client
        self.asked = asked or CallerAsked()


class UpstreamRefused(Exception):
    """The upstream answered the call with a JSON-RPC error."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UpstreamBroken(Exception):
    """The transport failed under the call, or the upstream lost the session: reconnect."""


class SessionTracker:
    """The `Mcp-Session-Id` the upstream gave the SDK client, read off its responses (an httpx event hook)."""

    def __init__(self) -> None:
        self.session_id: str | None = None

    async def __call__(self, response: httpx2.Response) -> None:
        value = response.headers.get("mcp-session-id")
        if value:
            self.session_id = value


class LeanHttpCaller:
    def __init__(self, http: Http1Pool, protocol_version: str, session: SessionTracker, *,
                 client_info: dict[str, Any], on_notice: Callable[[str], None] | None = None) -> None:
        self.http, self.protocol_version, self.session = http, protocol_version, session
        self.modern = protocol_version in MODERN_PROTOCOL_VERSIONS
        self.client_info, self.on_notice = client_info, on_notice
        self._ids = itertools.count(1)
        self._background: set[asyncio.Task] = set()

    def _headers(self) -> dict[str, str]:
        headers = {"accept": "application/json, text/event-stream", "content-type": "application/json",
                   "mcp-protocol-version": self.protocol_version}
        if self.session.session_id:
            headers["mcp-session-id"] = self.session.session_id
        return headers

    async def call(self, tool: str, arguments: dict[str, Any], *, relay: CallRelay | None = None,
                   report: ProgressFn | None = None, asked: CallerAsked | None = None,
                   headers: dict[str, str] | None = None) -> dict[str, Any]:
        """The call's JSON-RPC `result` (a CallToolResult as the upstream sent it).

        `relay`: the calling client, to which the upstream's log messages and requests go (and whose
        answers come back); `report`: where its progress goes. A 2026-07-28 upstream that answers
        `input_required` has its input requests asked of the client and the call retried with the
        answers (one with only its `requestState` is retried with it, relay or not), up to MAX_ROUNDS times. `asked`: where what the client made of those requests is noted, and
        the call's deadline they must fit in. `headers`: the `Mcp-Param-*` headers mirroring the arguments the
        tool's input schema marks `x-mcp-header` (2026-07-28), sent with every round."""
        asked = asked or CallerAsked()
        params: dict[str, Any] = {"name": tool, "arguments": arguments}
        delay = 0.05
        for _ in range(MAX_ROUNDS):
            result = await self._call_once(tool, params, relay, report, asked, headers)
            requests = result.get("inputRequests") or {}
            if result.get("resultType") != "input_required" or (relay is None and requests):
                return result
            if not requests:  # only its state: the upstream is still working, and is asked again with it
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.25)
            answers: dict[str, Any] = {}
            for key, request in (requests.items() if isinstance(requests, dict) else ()):
                if not isinstance(request, dict) or not isinstance(request.get("method"), str):
                    continue
                try:
                    answers[key] = await asked.ask(relay, request["method"], request.get("params") or {})
                except RelayRefused as exc:
                    raise UpstreamRefused(f"the client could not answer {request['method']}: {exc.message}") from None
            params = {"name": tool, "arguments": arguments} | ({"inputResponses": answers} if answers else {})
            if result.get("requestState") is not None:
                params["requestState"] = result["requestState"]
        raise UpstreamRefused(f"the upstream asked for input more than {MAX_ROUNDS} times")

    async def _call_once(self, tool: str, params: dict[str, Any], relay: CallRelay | None,
                         report: ProgressFn | None, asked: CallerAsked | None = None,
                         mirrored: dict[str, str] | None = None) -> dict[str, Any]:
        request_id = f"gw-{next(self._ids)}"  # never one of the SDK session's integer ids
        params = dict(params)
        headers = self._headers()
        meta: dict[str, Any] = {}
        if report is not None:
            meta["progressToken"] = request_id
        if self.modern:
            meta.update({"io.modelcontextprotocol/protocolVersion": self.protocol_version,
                         "io.modelcontextprotocol/clientInfo": self.client_info,
                         "io.modelcontextprotocol/clientCapabilities": dict(relay.capabilities) if relay else {}})
            if relay is not None:  # log delivery is a per-request opt-in; the relay filters by the caller's level
                meta[LOG_LEVEL_META] = "debug"
            headers["mcp-method"] = "tools/call"
            headers["mcp-name"] = encode_header_value(tool)
            headers.update(mirrored or {})
        if meta:
            params["_meta"] = meta
        body = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params},
                          separators=(",", ":"))
        call = _OneCall(request_id, relay, report, asked)
        try:
            async with self.http.post(body.encode(), headers) as response:
                return await self._answer(response, call)
        except asyncio.CancelledError:
            if not self.modern:  # 2026-07-28: the closed stream says it; 2025: a notification does
                self._later(self._post({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                        "params": {"requestId": request_id, "reason": "the caller cancelled"}}))
            raise
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:  # ValueError: a malformed chunk size
            raise UpstreamBroken(f"{type(exc).__name__}: {str(exc)[:200]}") from None
        finally:
            for task in call.asking:  # the call ended: nobody waits for those answers any more
                task.cancel()

    async def _answer(self, response: Http1Response, call: _OneCall) -> dict[str, Any]:
        kind = response.headers.get("content-type", "").partition(";")[0].strip().lower()
        if kind == "text/event-stream" and response.status == 200:
            async for message in _sse_messages(response):
                answer = await self._take(message, call)
                if answer is not None:
                    return answer
            raise UpstreamBroken("the upstream closed the call's stream without an answer")
        content = await response.read()
        if response.status == 404 and self.session.session_id:
            raise UpstreamBroken("the upstream lost the session (404)")
        try:
            message = json.loads(content)
        except ValueError:
            message = None
        answer = await self._take(message, call) if isinstance(message, dict) else None
        if answer is None:
            raise UpstreamBroken(f"the upstream answered HTTP {response.status} ({kind or 'no body'})")
        return answer

    async def _take(self, message: Any, call: _OneCall) -> dict[str, Any] | None:
        """The call's result from `message` (raises its error); None when `message` is something else."""
        if not isinstance(message, dict):
            return None
        method = message.get("method")
        if method is not None:
            params = message.get("params") if isinstance(message.get("params"), dict) else {}
            if "id" in message:  # the upstream asks something of the client
                if call.relay is not None and method in RELAYED_REQUESTS:
                    task = asyncio.create_task(self._relay_request(call, message["id"], method, params))
                    call.asking.add(task)
                    task.add_done_callback(call.asking.discard)
                elif method in RELAYED_REQUESTS:  # a client the gateway cannot reach mid-call
                    call.asked.refused = True
                    self._later(self._post({"jsonrpc": "2.0", "id": message["id"], "error": {
                        "code": _MISSING_CAPABILITY, "message": "the calling client cannot be asked through the "
                        "gateway (it has no 2025-11-25 session with the gateway, or it calls over gRPC)"}}))
                else:
                    self._later(self._post({"jsonrpc": "2.0", "id": message["id"],
                                            "error": {"code": _METHOD_NOT_FOUND, "message": "Method not found"}}))
            elif method == _LIST_CHANGED and self.on_notice is not None:
                self.on_notice(method)
            elif method == "notifications/message" and call.relay is not None:
                await call.relay.log(params)
            elif (method == "notifications/progress" and call.report is not None
                  and params.get("progressToken") == call.request_id):
                with contextlib.suppress(TypeError, ValueError):
                    await call.report(float(params.get("progress", 0)),
                                      None if params.get("total") is None else float(params["total"]),
                                      params.get("message"))
            return None
        if message.get("id") != call.request_id:
            return None
        if "error" in message:
            error = message["error"] if isinstance(message["error"], dict) else {}
            raise UpstreamRefused(str(error.get("message", "error"))[:200])
        result = message.get("result")
        return result if isinstance(result, dict) else {}

    async def _relay_request(self, call: _OneCall, request_id: Any, method: str, params: dict[str, Any]) -> None:
        """Ask the client, answer the upstream (its result or a JSON-RPC error; -32603 when relaying failed)."""
        assert call.relay is not None
        try:
            answer: dict[str, Any] = {"result": await call.asked.ask(call.relay, method, params)}
        except asyncio.CancelledError:  # the call ended first (its client left, its deadline): the upstream hears
            self._later(self._post({"jsonrpc": "2.0", "id": request_id, "error": {
                "code": _INTERNAL_ERROR, "message": "the call ended before the calling client answered"}}))
            raise
        except RelayRefused as exc:
            answer = {"error": {"code": exc.code, "message": exc.message}}
        except Exception as exc:  # noqa: BLE001 - the upstream waits for an answer whatever went wrong here
            log.warning("relayed request failed", method=method, error=f"{type(exc).__name__}: {str(exc)[:200]}")
            answer = {"error": {"code": _INTERNAL_ERROR, "message": "the gateway could not relay the request"}}
        await self._post({"jsonrpc": "2.0", "id": request_id, **answer})

    def _later(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _post(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, ValueError):
            async with self.http.post(json.dumps(message).encode(), self._headers()) as response:
                await response.read()


async def _sse_messages(response: Http1Response):
    """The JSON messages of an SSE stream (`data:` lines joined per event; comments and other fields skipped)."""
    data: list[str] = []
    async for line in response.lines():
        if not line:
            if data:
                with contextlib.suppress(ValueError):
                    yield json.loads("\n".join(data))
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        with contextlib.suppress(ValueError):
            yield json.loads("\n".join(data))

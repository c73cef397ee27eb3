"""A tools/call on a Streamable HTTP upstream as one JSON-RPC POST, on kept-alive HTTP/1.1 connections (http1.py).

The SDK client spends more CPU on a call (a session, a dispatcher, memory streams, a task per
request, a transport task per POST) than the gateway's whole pipeline. Once the SDK client has
connected the upstream (handshake or discovery, the tools listed), a plain call — no progress
asked for — is sent here instead, with what the SDK would send: the negotiated protocol version,
the session id on 2025-era upstreams, the routing headers and the `_meta` envelope on 2026-07-28.
The answer is read as JSON or as an SSE stream; the SDK path stays for everything else (progress,
resources, prompts, completions, listing, the liveness probe).

On the way:
- a `notifications/tools/list_changed` on the call's stream is passed on (`on_notice`); other
  notifications are dropped (no progress was asked for); a request from the upstream (sampling,
  elicitation, roots) is answered "method not found", the gateway having nothing to offer;
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

__all__ = ["LeanHttpCaller", "SessionTracker", "UpstreamBroken", "UpstreamRefused"]

log = get_logger(__name__)
_METHOD_NOT_FOUND = -32601
_LIST_CHANGED = "notifications/tools/list_changed"


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

    async def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """The call's JSON-RPC `result` (a CallToolResult as the upstream sent it)."""
        request_id = f"gw-{next(self._ids)}"  # never one of the SDK session's integer ids
        params: dict[str, Any] = {"name": tool, "arguments": arguments}
        headers = self._headers()
        if self.modern:
            params["_meta"] = {"io.modelcontextprotocol/protocolVersion": self.protocol_version,
                               "io.modelcontextprotocol/clientInfo": self.client_info,
                               "io.modelcontextprotocol/clientCapabilities": {}}
            headers["mcp-method"] = "tools/call"
            headers["mcp-name"] = encode_header_value(tool)
        body = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params},
                          separators=(",", ":"))
        try:
            async with self.http.post(body.encode(), headers) as response:
                return await self._answer(response, request_id)
        except asyncio.CancelledError:
            if not self.modern:  # 2026-07-28: the closed stream says it; 2025: a notification does
                self._later(self._post({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                        "params": {"requestId": request_id, "reason": "the caller cancelled"}}))
            raise
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:  # ValueError: a malformed chunk size
            raise UpstreamBroken(f"{type(exc).__name__}: {str(exc)[:200]}") from None

    async def _answer(self, response: Http1Response, request_id: str) -> dict[str, Any]:
        kind = response.headers.get("content-type", "").partition(";")[0].strip().lower()
        if kind == "text/event-stream" and response.status == 200:
            async for message in _sse_messages(response):
                answer = self._take(message, request_id)
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
        answer = self._take(message, request_id) if isinstance(message, dict) else None
        if answer is None:
            raise UpstreamBroken(f"the upstream answered HTTP {response.status} ({kind or 'no body'})")
        return answer

    def _take(self, message: Any, request_id: str) -> dict[str, Any] | None:
        """The call's result from `message` (raises its error); None when `message` is something else."""
        if not isinstance(message, dict):
            return None
        method = message.get("method")
        if method is not None:
            if "id" in message:  # the upstream asks something of the client: nothing to offer
                self._later(self._post({"jsonrpc": "2.0", "id": message["id"],
                                        "error": {"code": _METHOD_NOT_FOUND, "message": "Method not found"}}))
            elif method == _LIST_CHANGED and self.on_notice is not None:
                self.on_notice(method)
            return None
        if message.get("id") != request_id:
            return None
        if "error" in message:
            error = message["error"] if isinstance(message["error"], dict) else {}
            raise UpstreamRefused(str(error.get("message", "error"))[:200])
        result = message.get("result")
        return result if isinstance(result, dict) else {}

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

"""ASGI middleware: a POST body that is not one well-formed JSON-RPC message gets -32600, before the SDK.

The SDK (mcp 2.3.0) takes a request whose `id` is not a string or an integer (an object, an
array, a boolean, null, a fraction) for a notification, since a notification may carry extra
fields, and answers 202 with an empty body: the client waits for a reply that never comes. MCP
requires ids to be strings or integers ("unlike base JSON-RPC, the ID MUST NOT be null") and
has no batches since 2025-06-18. Such a body is answered here with HTTP 400 and a JSON-RPC error
-32600 (invalid request) saying what to fix. A body that is not JSON at all goes on to the SDK,
which answers -32700 (parse error) itself.
"""

from __future__ import annotations

import json
from typing import Any

from mcp_types import INVALID_REQUEST
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["JsonRpcGuard", "envelope_problem"]


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def envelope_problem(message: Any) -> str | None:
    """Why `message` (parsed JSON) is not a JSON-RPC message MCP accepts, or None when it is."""
    if isinstance(message, list):
        return "batches are not supported (MCP has none since 2025-06-18): send one message per request"
    if not isinstance(message, dict):
        return "the body must be a JSON-RPC message, a JSON object"
    if message.get("jsonrpc") != "2.0":
        return 'the message must have "jsonrpc": "2.0"'
    if "method" in message:
        if not isinstance(message["method"], str):
            return "method must be a string"
        if "id" in message and not _valid_id(message["id"]):
            return "id must be a string or an integer (not null, an object, an array, a boolean or a fraction)"
        return None
    if "result" in message or "error" in message:
        # An error answering a message whose id could not be read carries id null (JSON-RPC 2.0, 5.1).
        if not (_valid_id(message.get("id")) or ("error" in message and message.get("id") is None)):
            return "the id of a response must be the string or integer of the request it answers"
        return None
    return "the message must have a method (a request or notification) or a result or error (a response)"


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # later calls wait for the disconnect, as the SDK expects

    return replayed


class JsonRpcGuard:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client went away: nobody to answer
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            message = json.loads(body)
            problem = envelope_problem(message)
        except (ValueError, RecursionError):
            problem = None  # not JSON: the SDK answers its parse error
        else:
            if problem is None:
                scope["mcp.message"] = message  # read by what comes next (stateless sessions), parsed once
                scope["mcp.body_bytes"] = len(body)
        if problem is not None:
            error = {"jsonrpc": "2.0", "id": None,
                     "error": {"code": INVALID_REQUEST, "message": f"Invalid request: {problem}"}}
            await Response(json.dumps(error), status_code=400, media_type="application/json")(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)

"""The gateway's MCP server over stdio, for a local client that starts it as a subprocess.

`mnemesh tools serve-stdio` runs a gateway process whose MCP server reads stdin and writes stdout
(the SDK's stdio transport; logs go to stderr) for one caller: the principal of the token it was
given, checked once at start, since a pipe carries no per-request credentials. Calls run the same
pipeline as HTTP (scopes, validation, rate limits, breakers, audit). Both eras are served: the
client's first message decides. Changes to the tool list reach a 2026-07-28 client on its
`subscriptions/listen` stream and a 2025 one as notifications on the connection. The process ends
when the client closes stdin.
"""

from __future__ import annotations

import contextlib

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server
from mcp.shared._context_streams import create_context_streams
from mcp.shared.message import SessionMessage
from mcp.shared.subscriptions import ServerEvent

from libs.auth import Principal, TokenVerifier
from libs.config import Settings
from libs.errors import PermissionDenied, Unauthenticated
from services.tool_gateway.entrypoints.mcp_sessions import NOTICE_METHODS, ChangeFeed

__all__ = ["principal_of", "serve"]


def principal_of(settings: Settings, token: str, required_scope: str) -> Principal:
    """The caller a stdio server serves: the verified token's principal (anyone, with auth disabled)."""
    if not settings.auth_enabled:
        return Principal(subject="local", tenant_id="", scopes=frozenset({"*"}))
    if not token:
        raise Unauthenticated("no token", field="token",
                              hint="pass --token or set MNEMESH_TOKEN (`mnemesh token --tenant ... --scope "
                                   "tools:read --scope tools:call` makes one)")
    principal = TokenVerifier(settings).verify(token)
    if not principal.has_scope(required_scope):
        raise PermissionDenied(f"the token lacks the scope {required_scope!r}", field="token",
                               hint=f"ask for a token with scope {required_scope} (and tools:call to call tools)")
    return principal


async def serve(server: Server, changes: ChangeFeed | None = None) -> None:
    async with stdio_server() as (read, write):
        if changes is None:
            await server.run(read, write, server.create_initialization_options())
            return
        await _serve_with_notices(server, changes, read, write)


async def _serve_with_notices(server: Server, changes: ChangeFeed, read, write) -> None:
    """A 2025-era stdio connection is one long session: tool-list changes are sent on it as notifications,
    once the client has sent `notifications/initialized` (a 2026-07-28 client never does: it listens)."""
    initialized, pending, wake = anyio.Event(), set[str](), [anyio.Event()]
    inbound_writer, inbound = create_context_streams[SessionMessage | Exception](0)

    def deliver(event: ServerEvent) -> None:
        if initialized.is_set() and (method := NOTICE_METHODS.get(type(event))):
            pending.add(method)
            wake[0].set()

    async def watch_inbound() -> None:
        async with inbound_writer:
            async for message in read:
                if isinstance(message, SessionMessage) and isinstance(message.message, types.JSONRPCNotification) \
                        and message.message.method == "notifications/initialized":
                    initialized.set()
                await inbound_writer.send(message)

    async def send_notices() -> None:
        while True:
            await wake[0].wait()
            wake[0] = anyio.Event()
            for method in sorted(pending):
                pending.discard(method)
                with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                    await write.send(SessionMessage(types.JSONRPCNotification(jsonrpc="2.0", method=method)))

    unsubscribe = changes.subscribe(deliver)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_inbound)
            tg.start_soon(send_notices)
            await server.run(inbound, write, server.create_initialization_options())
            tg.cancel_scope.cancel()
    finally:
        unsubscribe()



"""The gateway's MCP server over stdio, for a local client that starts it as a subprocess.

`mnemesh tools serve-stdio` runs a gateway process whose MCP server reads stdin and writes stdout
(the SDK's stdio transport; logs go to stderr) for one caller: the principal of the token it was
given, checked once at start, since a pipe carries no per-request credentials. Calls run the same
pipeline as HTTP (scopes, validation, rate limits, breakers, audit). Both eras are served: the
client's first message decides. Changes to the tool list reach a 2026-07-28 client on its
`subscriptions/listen` stream. The process ends when the client closes stdin.
"""

from __future__ import annotations

from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server

from libs.auth import Principal, TokenVerifier
from libs.config import Settings
from libs.errors import PermissionDenied, Unauthenticated

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


async def serve(server: Server) -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())



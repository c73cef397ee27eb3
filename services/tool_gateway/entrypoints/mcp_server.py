"""MCP for agents (Streamable HTTP at /mcp), on the official SDK's low-level server: translate only.

- tools/list offers each registered tool once, at its current version (handlers.list_current_tools);
- tools/call goes to handlers.call_tool; its structured errors come back as tool results with
  `isError` (structuredContent `{error_type, field, reason, retryable, hint}` plus the same JSON as
  text), which is what an agent reads and relays. Until the call pipeline exists every call ends so.

Authentication happens before MCP (mcp_auth.BearerAuth): the endpoint needs `tools:read`;
calling needs `tools:call` as well, checked here. The endpoint is stateless (no MCP session lives
in the process), so any replica can answer any request.
"""

from __future__ import annotations

import json
from importlib.metadata import version
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from libs.auth import Principal, TokenVerifier
from libs.errors import DomainError, PermissionDenied, Unavailable
from libs.transient import TRANSIENT_ERRORS
from services.tool_gateway.domain import CallTool, ToolSpec
from services.tool_gateway.entrypoints.jsonrpc_guard import JsonRpcGuard
from services.tool_gateway.entrypoints.mcp_auth import BearerAuth, Caller
from services.tool_gateway.service_layer import handlers
from services.tool_gateway.service_layer.ports import Registry

__all__ = ["CALL_SCOPE", "LIST_SCOPE", "PATH", "build_server", "error_result", "http_app", "tool_to_mcp"]

PATH = "/mcp"
LIST_SCOPE = "tools:read"  # needed for the endpoint itself: listing is where every agent starts
CALL_SCOPE = "tools:call"

INSTRUCTIONS = ("The tools registered with the Mnemesh tool-gateway. Listing works; calling does not yet: "
                "tools/call answers isError with error_type 'unimplemented' (or 'not_found' for an unknown "
                "name), so do not retry a call and do not invent its result.")


def tool_to_mcp(spec: ToolSpec) -> types.Tool:
    return types.Tool(name=spec.name, description=spec.description, input_schema=spec.input_schema,
                      output_schema=spec.output_schema or None)


def error_result(error: DomainError) -> types.CallToolResult:
    detail = error.to_dict()
    return types.CallToolResult(content=[types.TextContent(text=json.dumps(detail, ensure_ascii=False))],
                                structured_content=detail, is_error=True)


def _unavailable(exc: BaseException) -> Unavailable:
    return Unavailable(f"a dependency is unreachable ({type(exc).__name__})",
                       hint="retry with backoff; operators: check PostgreSQL")


def _caller(ctx: ServerRequestContext[Any, Any]) -> Principal | None:
    user = ctx.request.scope.get("user") if ctx.request is not None else None
    return user.principal if isinstance(user, Caller) else None


def _no_param_headers(name: str) -> None:
    """No input schema to check `Mcp-Param-*` headers against (the SDK then skips them).

    Those headers mirror call arguments for intermediaries that route on them; nothing routes on
    them here and no call runs yet. Without this the SDK would run a whole tools/list (a registry
    query) for every call just to find the schema. The call pipeline should check them.
    """
    return None


def build_server(registry: Registry) -> Server:
    async def list_tools(ctx: ServerRequestContext,
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        try:
            specs = await handlers.list_current_tools(registry)
        except TRANSIENT_ERRORS as exc:
            error = _unavailable(exc)
            raise MCPError(types.INTERNAL_ERROR, f"{error.error_type}: {error.reason}",
                           error.to_dict()) from None
        return types.ListToolsResult(tools=[tool_to_mcp(spec) for spec in specs])

    async def call_tool(ctx: ServerRequestContext,
                        params: types.CallToolRequestParams) -> types.CallToolResult:
        caller = _caller(ctx)
        try:
            if caller is None or not caller.has_scope(CALL_SCOPE):
                raise PermissionDenied(f"the token lacks the scope {CALL_SCOPE!r}", field="authorization",
                                       hint=f"ask for a token with scope {CALL_SCOPE}")
            # Always raises for now: nothing runs a tool until the call pipeline exists.
            await handlers.call_tool(CallTool(params.name, dict(params.arguments or {})), registry)
        except DomainError as exc:
            return error_result(exc)
        except TRANSIENT_ERRORS as exc:
            return error_result(_unavailable(exc))

    return Server("mnemesh-tool-gateway", version=version("mnemesh"), instructions=INSTRUCTIONS,
                  on_list_tools=list_tools, on_call_tool=call_tool, get_tool_input_schema=_no_param_headers)


_LOOPBACK_HOSTS = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
_LOOPBACK_ORIGINS = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]


def _listed(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


class PostOnly:
    """Streamable HTTP without server-initiated streams: only POST reaches the SDK.

    The endpoint keeps no session, so a GET stream could never carry anything; left open, each
    would hold a socket and a task for nothing. DELETE ends sessions, of which there are none.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] != "POST":
            await Response("this MCP endpoint answers POST only (it keeps no sessions and sends no server "
                           "streams)", status_code=405, headers={"Allow": "POST"})(scope, receive, send)
            return
        await self.app(scope, receive, send)


def http_app(registry: Registry, verifier: TokenVerifier | None, *, allowed_hosts: str = "",
             allowed_origins: str = "") -> ASGIApp:
    """The ASGI app: bearer authentication, then POST only, then JSON-RPC envelope checks, then the SDK.

    DNS rebinding protection is always on, whatever the bind address (a container binds 0.0.0.0
    and still answers a browser on the developer's machine): the Host header must be a loopback
    one or one of `allowed_hosts` (MNEMESH_MCP_ALLOWED_HOSTS), and an Origin, when sent, one of
    the loopback origins or `allowed_origins`.
    """
    server = build_server(registry)
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=[*_LOOPBACK_HOSTS, *_listed(allowed_hosts)],
        allowed_origins=[*_LOOPBACK_ORIGINS, *_listed(allowed_origins)])
    app = server.streamable_http_app(streamable_http_path=PATH, stateless_http=True, transport_security=security)
    return BearerAuth(PostOnly(JsonRpcGuard(app)), verifier, required_scope=LIST_SCOPE)

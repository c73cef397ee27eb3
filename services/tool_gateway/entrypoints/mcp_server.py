"""MCP for agents (Streamable HTTP at /mcp), on the official SDK's low-level server: translate only.

- tools/list offers each registered tool the caller may call once, at its current version
  (handlers.list_current_tools);
- tools/call goes through the one call pipeline (service_layer.pipeline.call_tool); a result comes
  back as structuredContent plus the same compact JSON as text (and a resource link to the whole
  result when it was truncated); a refusal or failure as a tool result with `isError`
  (structuredContent `{error_type, field, reason, retryable, hint}` plus the same JSON as text),
  which is what an agent reads and relays.

Authentication happens before MCP (mcp_auth.BearerAuth): the endpoint needs `tools:read`;
calling needs `tools:call` and the tool's own scopes, checked in the pipeline. The endpoint is stateless (no MCP session lives
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
from services.tool_gateway.domain import CallOutcome, ToolCall, ToolSpec, error_detail
from services.tool_gateway.domain.experience import note
from services.tool_gateway.entrypoints.calls import current_trace_id
from services.tool_gateway.entrypoints.jsonrpc_guard import JsonRpcGuard
from services.tool_gateway.entrypoints.mcp_auth import BearerAuth, Caller
from services.tool_gateway.entrypoints.mcp_guides import guide_handlers
from services.tool_gateway.service_layer import experience, handlers, pipeline
from services.tool_gateway.service_layer.pipeline import CallPorts
from services.tool_gateway.service_layer.ports import ExperienceStore

__all__ = ["CALL_SCOPE", "LIST_SCOPE", "PATH", "build_server", "error_result", "http_app", "outcome_result",
           "tool_to_mcp"]

PATH = "/mcp"
LIST_SCOPE = "tools:read"  # needed for the endpoint itself: listing is where every agent starts
CALL_SCOPE = "tools:call"

INSTRUCTIONS = ("The tools registered with the Mnemesh tool-gateway. A failed call answers isError with a "
                "structured error {error_type, field, reason, retryable, hint}: retry only when retryable is "
                "true, fix the named field otherwise, and never invent a result.")


def tool_to_mcp(spec: ToolSpec) -> types.Tool:
    return types.Tool(name=spec.name, description=spec.description, input_schema=spec.input_schema,
                      output_schema=spec.output_schema or None)


def error_result(error: DomainError) -> types.CallToolResult:
    detail = error_detail(error)  # with the backend's own fault, when it sent one
    return types.CallToolResult(content=[types.TextContent(text=json.dumps(detail, ensure_ascii=False))],
                                structured_content=detail, is_error=True)


def outcome_result(outcome: CallOutcome, spec_has_output_schema: bool) -> types.CallToolResult:
    """A pipeline outcome as an MCP tool result."""
    if outcome.error is not None:
        return error_result(outcome.error)
    result = outcome.result
    assert result is not None
    content: list[types.ContentBlock] = [types.TextContent(text=result.text)]
    if outcome.resource_uri:
        content.append(types.ResourceLink(uri=outcome.resource_uri, name=f"result of {outcome.tool}",
                                          mime_type="application/json",
                                          description="the whole result; this answer was truncated"))
        if spec_has_output_schema:
            # A preview cannot match the tool's output schema, which clients check: say so instead.
            detail = {"error_type": "result_too_large", "field": "", "retryable": False,
                      "reason": f"the result ({result.value.get('total_bytes')} bytes) is over the gateway's cap",
                      "hint": f"read the whole result as the resource {outcome.resource_uri}"}
            return types.CallToolResult(content=[types.TextContent(text=json.dumps(detail)), content[1]],
                                        structured_content=detail, is_error=True)
    return types.CallToolResult(content=content, structured_content=result.value, is_error=False)


def _unavailable(exc: BaseException) -> Unavailable:
    return Unavailable(f"a dependency is unreachable ({type(exc).__name__})",
                       hint="retry with backoff; operators: check PostgreSQL")


def _caller(ctx: ServerRequestContext[Any, Any], local: Principal | None) -> Principal | None:
    """The HTTP request's authenticated caller; on stdio (no request) the process's own principal."""
    if ctx.request is None:
        return local
    user = ctx.request.scope.get("user")
    return user.principal if isinstance(user, Caller) else None


def _no_param_headers(name: str) -> None:
    """No input schema to check `Mcp-Param-*` headers against (the SDK then skips them).

    Those headers mirror call arguments for intermediaries that route on them; nothing routes on
    them here and no call runs yet. Without this the SDK would run a whole tools/list (a registry
    query) for every call just to find the schema. The call pipeline should check them.
    """
    return


def build_server(ports: CallPorts, local_principal: Principal | None = None,
                 experience_store: ExperienceStore | None = None) -> Server:
    """`local_principal`: the caller of requests that come with no HTTP request (stdio, in process);
    `experience_store`: when given, tools/list appends each tool's experience note to its description."""
    registry = ports.registry

    async def with_notes(specs: list[ToolSpec], caller: Principal | None) -> list[types.Tool]:
        tools = [tool_to_mcp(spec) for spec in specs]
        if experience_store is None or caller is None or not specs:
            return tools
        notes = await experience.experience_notes(caller.tenant_id or pipeline.SYSTEM_TENANT, [], experience_store)
        for tool in tools:
            if tool.name in notes and notes[tool.name].calls:
                tool.description = f"{tool.description or ''} [experience: {note(notes[tool.name])}]"
        return tools

    async def list_tools(ctx: ServerRequestContext,
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        try:
            caller = _caller(ctx, local_principal)
            tools = await with_notes(await handlers.list_current_tools(registry, caller), caller)
        except TRANSIENT_ERRORS as exc:
            error = _unavailable(exc)
            raise MCPError(types.INTERNAL_ERROR, f"{error.error_type}: {error.reason}",
                           error.to_dict()) from None
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: ServerRequestContext,
                        params: types.CallToolRequestParams) -> types.CallToolResult:
        caller = _caller(ctx, local_principal)
        if caller is None:
            return error_result(PermissionDenied("the request carries no authenticated caller",
                                                 field="authorization", hint="send a bearer token"))
        call = ToolCall(name=params.name, arguments=dict(params.arguments or {}), principal=caller,
                        trace_id=current_trace_id())
        try:
            outcome = await pipeline.call_tool(call, ports)
        except TRANSIENT_ERRORS as exc:  # the audit log (PostgreSQL) or Redis is unreachable
            return error_result(_unavailable(exc))
        return outcome_result(outcome, outcome.has_output_schema)

    return Server("mnemesh-tool-gateway", version=version("mnemesh"), instructions=INSTRUCTIONS,
                  on_list_tools=list_tools, on_call_tool=call_tool, get_tool_input_schema=_no_param_headers,
                  **guide_handlers(ports, experience_store, lambda ctx: _caller(ctx, local_principal)))


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


def http_app(ports: CallPorts, verifier: TokenVerifier | None, *, allowed_hosts: str = "",
             allowed_origins: str = "", experience: ExperienceStore | None = None) -> ASGIApp:
    """The ASGI app: bearer authentication, then POST only, then JSON-RPC envelope checks, then the SDK.

    DNS rebinding protection is always on, whatever the bind address (a container binds 0.0.0.0
    and still answers a browser on the developer's machine): the Host header must be a loopback
    one or one of `allowed_hosts` (MNEMESH_MCP_ALLOWED_HOSTS), and an Origin, when sent, one of
    the loopback origins or `allowed_origins`.
    """
    server = build_server(ports, experience_store=experience)
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=[*_LOOPBACK_HOSTS, *_listed(allowed_hosts)],
        allowed_origins=[*_LOOPBACK_ORIGINS, *_listed(allowed_origins)])
    app = server.streamable_http_app(streamable_http_path=PATH, stateless_http=True, transport_security=security)
    return BearerAuth(PostOnly(JsonRpcGuard(app)), verifier, required_scope=LIST_SCOPE)

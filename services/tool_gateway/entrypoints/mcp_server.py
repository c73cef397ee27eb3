"""MCP for agents (Streamable HTTP at /mcp), on the official SDK's low-level server: translate only.

- tools/list offers each registered tool the caller may call once, at its current version
  (handlers.list_current_tools);
- tools/call goes through the one call pipeline (service_layer.pipeline.call_tool); a result comes
  back as structuredContent plus the same compact JSON as text (and a resource link to the whole
  result when it was truncated: a text block naming it for clients before 2025-06-18); a refusal or
  failure as a tool result with `isError`: the structured error `{error_type, field, reason,
  retryable, hint}` as JSON text, and as structuredContent too when the tool declares no output
  schema (structured content must match a declared one, and clients check it even on errors).

Authentication happens before MCP (mcp_auth.BearerAuth): the endpoint needs `tools:read`;
calling needs `tools:call` and the tool's own scopes, checked in the pipeline. The endpoint is stateless (no MCP session lives
in the process), so any replica can answer any request; mcp_sessions gives 2025-era clients session ids
that need no state.

A call whose request carries a progress token gets the progress its upstream reports; a cancelled
call (2026-07-28: the client closed the request's stream; 2025: `notifications/cancelled`, through
mcp_sessions) stops, and so does the upstream call under it.
"""

from __future__ import annotations

import asyncio
import functools
from importlib.metadata import version
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.subscriptions import ListenHandler, SubscriptionBus
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
from starlette.types import ASGIApp

from libs.auth import Principal, TokenVerifier
from libs.errors import DomainError, PermissionDenied, Unavailable, ValidationFailed
from libs.transient import TRANSIENT_ERRORS
from libs.validation import check_identifier
from services.tool_gateway.domain import ToolCall, ToolSpec
from services.tool_gateway.domain.experience import note
from services.tool_gateway.entrypoints.calls import current_trace_id
from services.tool_gateway.entrypoints.jsonrpc_guard import JsonRpcGuard
from services.tool_gateway.entrypoints.mcp_fast import FastCalls, param_schema
from services.tool_gateway.entrypoints.mcp_auth import BearerAuth, Caller
from services.tool_gateway.entrypoints.mcp_guides import UpstreamCatalogs, guide_handlers
from services.tool_gateway.entrypoints.mcp_metadata import ProtectedResourceMetadata
from services.tool_gateway.entrypoints.mcp_results import REPLAY_OF_META, error_result, outcome_result
from services.tool_gateway.entrypoints.mcp_relay import LocalLogLevels, LogLevels, RelayAnswers, RelayCalls
from services.tool_gateway.entrypoints.mcp_subscribe import (
    LocalSubscribed,
    Subscribed,
    scoped_listen,
    session_handlers,
)
from services.tool_gateway.entrypoints.mcp_tasks import TaskMiddleware, task_handlers
from services.tool_gateway.entrypoints.mcp_tasks import capabilities as task_capabilities
from services.tool_gateway.entrypoints.mcp_sessions import (
    SESSION_HEADER,
    CancelPublisher,
    InFlightCalls,
    StatelessSessions,
    cancel_key,
)
from services.tool_gateway.service_layer import experience, handlers, pipeline
from services.tool_gateway.service_layer.call_context import progress_reporter, reporting_progress
from services.tool_gateway.service_layer.pipeline import CallPorts
from services.tool_gateway.service_layer.ports import ExperienceStore
from services.tool_gateway.service_layer.tasks import TaskRunner

__all__ = ["CALL_SCOPE", "answer_call", "CHAIN_ID_META", "LIST_SCOPE", "PATH", "REPLAY_OF_META", "build_server",
           "error_result", "http_app", "outcome_result", "tool_to_mcp"]

PATH = "/mcp"
LIST_SCOPE = "tools:read"  # needed for the endpoint itself: listing is where every agent starts
CALL_SCOPE = "tools:call"
CHAIN_ID_META = "mnemesh/chain_id"  # a tools/call's chain id, in its params' _meta
INSTRUCTIONS = ("The tools registered with the Mnemesh tool-gateway. A failed call answers isError with a "
                "structured error {error_type, field, reason, retryable, hint}: retry only when retryable is "
                "true, fix the named field otherwise, and never invent a result.")


def tool_to_mcp(spec: ToolSpec, tasks: bool = False) -> types.Tool:
    """`tasks`: the gateway runs calls as tasks (2025-11-25), so every tool may be called as one."""
    return types.Tool(name=spec.name, description=spec.description, input_schema=spec.input_schema,
                      output_schema=spec.output_schema or None,
                      execution=types.ToolExecution(task_support="optional") if tasks else None)


def chain_id_of(params: types.CallToolRequestParams) -> str:
    """The chain id a tools/call carries in `_meta` (`mnemesh/chain_id`); "" when none."""
    value = (params.meta or {}).get(CHAIN_ID_META)
    if value is None or value == "":
        return ""
    field = f"_meta/{CHAIN_ID_META}"
    if not isinstance(value, str):
        raise ValidationFailed(f"must be a string, not {type(value).__name__}", field=field,
                               hint="pass the same chain id with every step")
    return check_identifier(value, field, 128)  # the rule gRPC's CallToolRequest.chain_id follows


class Cancelled(DomainError):
    error_type = "cancelled"


def _unavailable(exc: BaseException) -> Unavailable:
    return Unavailable(f"a dependency is unreachable ({type(exc).__name__})",
                       hint="retry with backoff; operators: check PostgreSQL")


def _caller(ctx: ServerRequestContext[Any, Any], local: Principal | None) -> Principal | None:
    """The HTTP request's authenticated caller; on stdio (no request) the process's own principal."""
    if ctx.request is None:
        return local
    user = ctx.request.scope.get("user")
    return user.principal if isinstance(user, Caller) else None


class _GatewayServer(Server):
    """Announces `listChanged` for tools, prompts and resources on the initialize handshake when the
    gateway has a change feed (the 2026-07-28 capabilities follow from serving subscriptions/listen)."""

    list_changed = False
    tasks = False  # announces tasks (tools/call), 2025-11-25

    def create_initialization_options(self, notification_options=None, experimental_capabilities=None,
                                      extensions=None):
        if notification_options is None and self.list_changed:
            notification_options = NotificationOptions(prompts_changed=True, resources_changed=True,
                                                       tools_changed=True)
        options = super().create_initialization_options(notification_options, experimental_capabilities, extensions)
        if self.tasks:
            options.capabilities.tasks = task_capabilities()
        return options


def _cancel_key(ctx: ServerRequestContext[Any, Any], caller: Principal) -> str | None:
    """The key a 2025-era `notifications/cancelled` finds this call by (None: none can, e.g. 2026-07-28)."""
    if ctx.request is None or ctx.request_id is None:
        return None
    session = ctx.request.headers.get(SESSION_HEADER)
    return cancel_key(caller, session, ctx.request_id) if session else None


LOOKUP_SECONDS = 1.0  # for the shape of an error the pipeline did not answer


async def _shows_output_schema(ports: CallPorts, name: str) -> bool:
    """For a call that ended without the pipeline's outcome: whether its tool declares an output schema. True
    when that cannot be read soon (the registry is unreachable): an error as text alone never breaks a client,
    structured content that does not match a declared schema may."""
    try:
        async with asyncio.timeout(LOOKUP_SECONDS):
            return await handlers.shows_output_schema(name, ports.registry)
    except (TimeoutError, *TRANSIENT_ERRORS):
        return True


async def answer_call(ports: CallPorts, caller: Principal | None, params: types.CallToolRequestParams, *,
                      in_flight: InFlightCalls, cancel: str | None = None, report=None,
                      version: str = "") -> types.CallToolResult:
    """A tools/call through the pipeline, as the MCP tool result (the SDK's handler and the lean path's).

    `cancel`: the key a 2025-era `notifications/cancelled` finds the call by; `report`: where the
    upstream's progress goes (None: the caller sent no progress token); `version`: the caller's protocol
    revision (outcome_result)."""
    if caller is None:
        return error_result(PermissionDenied("the request carries no authenticated caller",
                                             field="authorization", hint="send a bearer token"))
    try:
        chain_id = chain_id_of(params)
    except DomainError as exc:
        return error_result(exc, await _shows_output_schema(ports, params.name))
    call = ToolCall(name=params.name, arguments=dict(params.arguments or {}), principal=caller,
                    chain_id=chain_id, trace_id=current_trace_id())
    outcome, failure = None, None
    with reporting_progress(report), in_flight.track(cancel) as scope:
        try:
            outcome = await pipeline.call_tool(call, ports)
        except TRANSIENT_ERRORS as exc:  # the audit log (PostgreSQL) or Redis is unreachable
            failure = _unavailable(exc)
    if failure is None and (outcome is None or scope.cancelled_caught):
        failure = Cancelled("the caller cancelled the call", field="",
                            hint="the call was stopped, upstream too; call again to retry")
    if failure is not None:
        return error_result(failure, await _shows_output_schema(ports, call.name))
    assert outcome is not None
    return outcome_result(outcome, version)


def build_server(ports: CallPorts, local_principal: Principal | None = None,
                 experience_store: ExperienceStore | None = None, *, in_flight: InFlightCalls | None = None,
                 changes: SubscriptionBus | None = None, upstreams: UpstreamCatalogs | None = None,
                 tasks: TaskRunner | None = None, levels: LogLevels | None = None,
                 subscribed: Subscribed | None = None) -> Server:
    """`local_principal`: the caller of requests that come with no HTTP request (stdio, in process);
    `experience_store`: when given, tools/list appends each tool's experience note to its description;
    `in_flight`: where 2025-era cancellations find calls; `changes`: the tool-list change feed, served
    to `subscriptions/listen` streams; `tasks`: where task-augmented calls run (2025-11-25 MCP tasks);
    `levels` and `subscribed`: where sessions keep their logging level and subscriptions. Only with them (the
    HTTP app, which relays log messages and sends resource updates on the GET stream) are `logging/setLevel`
    and `resources/(un)subscribe` served, and so announced: stdio has no path that delivers either."""
    registry = ports.registry
    in_flight = in_flight or InFlightCalls()

    async def with_notes(specs: list[ToolSpec], caller: Principal | None) -> list[types.Tool]:
        tools = [tool_to_mcp(spec, tasks is not None) for spec in specs]
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
        # Progress is relayed only when the caller asked for it (a progress token): otherwise the upstream
        # is not asked for any either.
        report = ctx.session.report_progress if progress_token_from_params(ctx.params) is not None else None
        return await answer_call(ports, caller, params, in_flight=in_flight,
                                 cancel=_cancel_key(ctx, caller) if caller is not None else None, report=report,
                                 version=ctx.protocol_version)

    server = _GatewayServer(
        "mnemesh-tool-gateway", version=version("mnemesh"), instructions=INSTRUCTIONS,
        on_list_tools=list_tools, on_call_tool=call_tool, get_tool_input_schema=param_schema,
        on_subscriptions_listen=scoped_listen(ListenHandler(changes), lambda ctx: _caller(ctx, local_principal),
                                              upstreams) if changes is not None else None,
        **guide_handlers(ports, experience_store, lambda ctx: _caller(ctx, local_principal), upstreams))
    server.list_changed = changes is not None
    if levels is not None and subscribed is not None:
        for method, (params_type, handler) in session_handlers(
                lambda ctx: _caller(ctx, local_principal), levels, upstreams, subscribed).items():
            server.add_request_handler(method, params_type, handler)
    if tasks is not None:
        def caller_of(ctx: ServerRequestContext) -> Principal | None:
            return _caller(ctx, local_principal)

        def chain_id_or_refuse(params: types.CallToolRequestParams) -> str:
            try:
                return chain_id_of(params)
            except DomainError as exc:
                raise MCPError(types.INVALID_PARAMS, f"{exc.error_type}: {exc.reason}", exc.to_dict()) from None

        server.tasks = True
        server.middleware.append(TaskMiddleware(tasks, caller_of, chain_id_or_refuse, outcome_result))
        for method, (params_type, handler) in task_handlers(tasks, caller_of, outcome_result, error_result).items():
            server.add_request_handler(method, params_type, handler)
    return server


_LOOPBACK_HOSTS = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
_LOOPBACK_ORIGINS = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]


def _listed(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def http_app(ports: CallPorts, verifier: TokenVerifier | None, *, allowed_hosts: str = "",
             allowed_origins: str = "", experience: ExperienceStore | None = None,
             changes: SubscriptionBus | None = None, cancels: CancelPublisher | None = None,
             in_flight: InFlightCalls | None = None, resource_url: str = "",
             authorization_servers: tuple[str, ...] = (), upstreams: UpstreamCatalogs | None = None,
             tasks: TaskRunner | None = None, answers: RelayAnswers | None = None,
             levels: LogLevels | None = None, relay_timeout: float = 120.0,
             subscribed: Subscribed | None = None) -> ASGIApp:
    """The ASGI app: protected-resource metadata, bearer authentication, JSON-RPC envelope checks, the
    relaying of upstreams' log messages and requests to 2025-era sessions (mcp_relay: `answers` routes
    the clients' answers across replicas, `levels` keeps their logging levels), the lean call path,
    stateless sessions (cancellation, the GET stream), then the SDK.

    DNS rebinding protection is always on, whatever the bind address (a container binds 0.0.0.0
    and still answers a browser on the developer's machine): the Host header must be a loopback
    one or one of `allowed_hosts` (MNEMESH_MCP_ALLOWED_HOSTS), and an Origin, when sent, one of
    the loopback origins or `allowed_origins`.
    """
    in_flight = in_flight or InFlightCalls()
    levels, subscribed = levels or LocalLogLevels(), subscribed or LocalSubscribed()
    server = build_server(ports, experience_store=experience, in_flight=in_flight, changes=changes,
                          upstreams=upstreams, tasks=tasks, levels=levels, subscribed=subscribed)
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=[*_LOOPBACK_HOSTS, *_listed(allowed_hosts)],
        allowed_origins=[*_LOOPBACK_ORIGINS, *_listed(allowed_origins)])
    app = server.streamable_http_app(streamable_http_path=PATH, stateless_http=True, transport_security=security)
    sessions = StatelessSessions(app, in_flight=in_flight, cancels=cancels, changes=changes, subscriptions=subscribed)
    fast = FastCalls(sessions, server, functools.partial(answer_call, ports, in_flight=in_flight), path=PATH,
                     security=security, in_flight=in_flight,
                     schema_of=functools.partial(handlers.listed_schema, registry=ports.registry))

    async def answer_reporting(caller, params, *, cancel=None, version=""):
        return await answer_call(ports, caller, params, in_flight=in_flight, cancel=cancel, report=progress_reporter(),
                                 version=version)

    relay = RelayCalls(fast, server, answer_reporting, path=PATH, security=security, in_flight=in_flight,
                       answers=answers or RelayAnswers(), levels=levels, timeout=relay_timeout)
    metadata = ProtectedResourceMetadata(PATH, resource_url=resource_url, authorization_servers=authorization_servers,
                                         scopes=(LIST_SCOPE, CALL_SCOPE))
    return metadata.wrap(BearerAuth(JsonRpcGuard(relay), verifier, required_scope=LIST_SCOPE,
                                    resource_metadata=metadata.url_for))

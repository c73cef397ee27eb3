"""Federated upstream MCP servers (stdio commands or Streamable HTTP URLs), kept connected.

Each upstream has a supervisor task: connect with the official SDK client, list its tools, expose
them under `<prefix>.<tool>` (domain/naming.py), then watch the connection (a ping every
`ping_seconds`, a failed call, an upstream `tools/list_changed`). A dead upstream is reported
(`status`), reconnected with exponential backoff, and its tools disappear from tools/list while it
is down. Stdio processes are started and reaped by the SDK's stdio_client, which kills the whole
process tree when the connection closes, so stopping the manager leaves no process behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from importlib.metadata import version
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import mcp_param_headers, x_mcp_header_map
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from libs.errors import NotFound, Unavailable, ValidationFailed
from libs.safe_schema import SafeValidator
from libs.logs import get_logger
from services.tool_gateway.adapters import upstream_sdk
from services.tool_gateway.adapters.http1 import Http1Pool
from services.tool_gateway.adapters.upstream_catalog import Catalog, list_catalog
from services.tool_gateway.adapters.upstream_http import (
    CallerAsked,
    LeanHttpCaller,
    SessionTracker,
    UpstreamBroken,
    UpstreamRefused,
)
from services.tool_gateway.domain import BackendFailed, ToolSpec
from services.tool_gateway.domain.content import MEDIA_KEY
from services.tool_gateway.domain.naming import exposed_name
from services.tool_gateway.domain.upstream import UpstreamConfig, UpstreamStatus, load_upstreams
from services.tool_gateway.service_layer.call_context import call_relay, progress_reporter

__all__ = ["UpstreamConfig", "UpstreamManager", "UpstreamStatus", "load_upstreams"]

log = get_logger(__name__)
MAX_SUBSCRIBED_PER_UPSTREAM = 10_000  # resource URIs one upstream connection is subscribed to, for all callers
CLIENT_INFO = {"name": "mnemesh-tool-gateway", "version": version("mnemesh")}  # how the gateway introduces itself


class _Connection:
    def __init__(self, config: UpstreamConfig) -> None:
        self.config = config
        self.client: Client | None = None
        self.broken = asyncio.Event()
        self.changed = asyncio.Event()
        self.tools: dict[str, types.Tool] = {}  # by exposed name
        self.catalog = Catalog()  # its resources, templates and prompts
        self.lean: LeanHttpCaller | None = None  # plain calls on a Streamable HTTP upstream (upstream_http.py)
        self.output_validators: dict[str, SafeValidator] = {}  # by upstream tool name, for lean calls
        # 2026-07-28: the arguments each upstream tool (by its name) wants mirrored in `Mcp-Param-*` headers
        self.param_headers: dict[str, dict[tuple[str, ...], str]] = {}
        self.subscribed: set[str] = set()  # resource URIs subscribed to, renewed on reconnection
        self.attempted = asyncio.Event()  # its first connection attempt ended (up, or failed)


class UpstreamManager:
    def __init__(self, *, ping_seconds: float = 5.0, backoff_base: float = 0.5, backoff_cap: float = 30.0,
                 on_change: Callable[[], None] | None = None,
                 on_resource_updated: Callable[[str], Awaitable[None]] | None = None) -> None:
        """`on_resource_updated(uri)`: an upstream said a resource the gateway subscribed to changed."""
        self.ping_seconds, self.backoff_base, self.backoff_cap = ping_seconds, backoff_base, backoff_cap
        self.on_change, self.on_resource_updated = on_change, on_resource_updated
        self.connections: dict[str, _Connection] = {}
        self.status: dict[str, UpstreamStatus] = {}
        self._tasks: dict[str, asyncio.Task] = {}
        self._specs: dict[str, ToolSpec] = {}

    # --- the registry overlay: federated tools live here, not in PostgreSQL -----------------------------

    def specs(self) -> list[ToolSpec]:
        return list(self._specs.values())

    def spec(self, name: str) -> ToolSpec | None:
        return self._specs.get(name)

    def _rebuild(self) -> None:
        specs: dict[str, ToolSpec] = {}
        for upstream, conn in sorted(self.connections.items()):
            if self.status[upstream].state != "up":
                continue
            for exposed, tool in conn.tools.items():
                specs[exposed] = ToolSpec(
                    name=exposed, description=tool.description or f"{tool.name} (from {upstream})",
                    input_schema=dict(tool.input_schema or {"type": "object"}),
                    output_schema=dict(tool.output_schema or {}), version="1.0.0", scopes=conn.config.scopes,
                    timeout_seconds=conn.config.timeout_seconds, backend=f"mcp:{upstream}/{tool.name}")
        self._specs = specs
        if self.on_change is not None:
            self.on_change()

    # --- lifecycle -------------------------------------------------------------------------------------

    def add(self, config: UpstreamConfig) -> None:
        if config.name in self.connections:
            raise ValueError(f"an upstream named {config.name!r} exists already")
        if bool(config.command) == bool(config.url):
            raise ValueError("an upstream needs exactly one of command (stdio) and url (Streamable HTTP)")
        self.connections[config.name] = _Connection(config)
        self.status[config.name] = UpstreamStatus()
        self._tasks[config.name] = asyncio.create_task(self._supervise(config.name), name=f"upstream:{config.name}")

    async def remove(self, name: str) -> bool:
        """Disconnect an upstream (its process stops) and drop its tools; False when there is none."""
        task = self._tasks.pop(name, None)
        if task is None:
            return False
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        del self.connections[name], self.status[name]
        self._rebuild()
        return True

    async def settled(self, within: float) -> list[str]:
        """Wait until each upstream added so far has connected or failed its first attempt, at most `within`
        seconds; the names of those still connecting then (they go on connecting, as any other)."""
        waits = [conn.attempted.wait() for conn in self.connections.values() if not conn.attempted.is_set()]
        if waits:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(within):
                    await asyncio.gather(*waits)
        return sorted(name for name, conn in self.connections.items() if not conn.attempted.is_set())

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()

    def _transport(self, conn: _Connection, stack: contextlib.AsyncExitStack):
        """The SDK client's transport; for a URL also the lean caller's parts (its HTTP client, the session)."""
        config = conn.config
        if config.command:
            return StdioServerParameters(command=config.command[0], args=config.command[1:],
                                         env=config.env or None), None
        session = SessionTracker()
        http = httpx2.AsyncClient(headers=config.headers, timeout=httpx2.Timeout(config.timeout_seconds),
                                  event_hooks={"response": [session]})
        stack.push_async_callback(http.aclose)
        return streamable_http_client(config.url, http_client=http), session

    @staticmethod
    def _lean(conn: _Connection, client: Client, session: SessionTracker | None,
              stack: contextlib.AsyncExitStack) -> LeanHttpCaller | None:
        """The lean caller of a Streamable HTTP upstream; over TLS it trusts what the SDK client's HTTP client
        trusts (httpx2's context: its CAs, SSL_CERT_FILE/SSL_CERT_DIR)."""
        url = conn.config.url
        if session is None or not url.startswith(("http://", "https://")):
            return None
        pool = Http1Pool(url, conn.config.headers, connect_timeout=conn.config.timeout_seconds,
                         ssl_context=httpx2.create_ssl_context() if url.startswith("https://") else None)
        stack.push_async_callback(pool.aclose)
        return LeanHttpCaller(pool, client.protocol_version, session, client_info=CLIENT_INFO,
                              on_notice=lambda _method: conn.changed.set())

    async def _supervise(self, name: str) -> None:
        conn = self.connections[name]
        status = self.status[name]
        failures = 0
        while True:
            conn.broken.clear()
            try:
                async with contextlib.AsyncExitStack() as stack:
                    transport, lean_parts = self._transport(conn, stack)
                    client = await stack.enter_async_context(
                        Client(transport, mode=conn.config.mode, message_handler=self._handler(conn),  # type: ignore[arg-type]
                               client_info=types.Implementation(**CLIENT_INFO)))
                    conn.client = client
                    conn.lean = self._lean(conn, client, lean_parts, stack)
                    await self._refresh(name, conn)
                    status.state, status.reason, failures = "up", "", 0
                    self._rebuild()
                    conn.attempted.set()
                    log.info("upstream connected", upstream=name, tools=len(conn.tools))
                    await self._renew_subscriptions(name, conn, client)
                    await self._watch(name, conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure of an upstream is a reason to reconnect
                status.reason = f"{type(exc).__name__}: {str(exc)[:200]}"
            finally:
                conn.client, conn.lean = None, None
            failures += 1
            status.state, status.restarts = "down", status.restarts + 1
            self._rebuild()
            conn.attempted.set()
            delay = random.uniform(0, min(self.backoff_cap, self.backoff_base * 2 ** (failures - 1)))
            log.warning("upstream down", upstream=name, reason=status.reason, retry_in=round(delay, 2))
            await asyncio.sleep(delay)
            status.state = "connecting"

    @staticmethod
    async def _renew_subscriptions(name: str, conn: _Connection, client: Client) -> None:
        """Subscribe the new connection to what the old one was subscribed to, once the upstream is up: one
        URI refused (gone, or the upstream no longer subscribes) is logged and dropped, never the upstream."""
        if not conn.subscribed:
            return
        if not _subscribes(client):
            conn.subscribed.clear()
            return
        for uri in sorted(conn.subscribed):
            try:
                await client.subscribe_resource(uri)
            except Exception as exc:  # noqa: BLE001 - a broken transport is the watch's to see
                conn.subscribed.discard(uri)
                log.warning("upstream subscription not renewed", upstream=name, uri=uri[:200],
                            error=f"{type(exc).__name__}: {str(exc)[:200]}")

    async def _watch(self, name: str, conn: _Connection) -> None:
        while True:
            broken = asyncio.create_task(conn.broken.wait())
            changed = asyncio.create_task(conn.changed.wait())
            try:
                await asyncio.wait([broken, changed], timeout=self.ping_seconds,
                                             return_when=asyncio.FIRST_COMPLETED)
            finally:
                broken.cancel()
                changed.cancel()
            if conn.broken.is_set():
                raise ConnectionError(self.status[name].reason or "the connection broke")
            if conn.changed.is_set():
                conn.changed.clear()
                await self._refresh(name, conn)
                self._rebuild()
                continue
            # The liveness probe is a fresh tools/list: `ping` is gone from the 2026-07-28 revision, and an
            # upstream on it sends no list_changed, so this is also how its tool changes are seen.
            before = (dict(conn.tools), conn.catalog)
            async with asyncio.timeout(self.ping_seconds):
                await self._refresh(name, conn)
            if (conn.tools, conn.catalog) != before:
                self._rebuild()

    async def _refresh(self, name: str, conn: _Connection) -> None:
        assert conn.client is not None
        listed = await conn.client.list_tools(cache_mode="bypass")
        prefix = name if conn.config.prefix is None else conn.config.prefix
        taken = {n for other, c in self.connections.items() if other != name for n in c.tools}
        tools: dict[str, types.Tool] = {}
        for tool in listed.tools:
            exposed = exposed_name(prefix, tool.name, taken | set(tools))
            tools[exposed] = tool
        conn.tools = tools
        conn.output_validators = {}
        # The SDK client has dropped the tools whose annotations are invalid from `listed` already.
        conn.param_headers = {t.name: mapped for t in listed.tools if (mapped := x_mcp_header_map(t.input_schema))}
        self.status[name].tools = len(tools)
        names = {n for c in self.connections.values() for n in c.tools}
        names |= {n for other, c in self.connections.items() if other != name for n, _ in c.catalog.prompts}
        try:
            conn.catalog = await list_catalog(conn.client, prefix, names)
        except MCPError as exc:  # resources or prompts it declares but cannot list: its tools still serve
            log.warning("upstream catalog not listed", upstream=name, error=exc.error.message[:200])
            conn.catalog = Catalog()

    def _handler(self, conn: _Connection):
        async def handle(message) -> None:
            if isinstance(message, Exception):
                self.status[conn.config.name].reason = f"{type(message).__name__}: {str(message)[:200]}"
                conn.broken.set()
            elif isinstance(message, types.ToolListChangedNotification):
                conn.changed.set()
            elif isinstance(message, types.ResourceUpdatedNotification) and self.on_resource_updated is not None:
                await self.on_resource_updated(str(message.params.uri))
        return handle

    # --- resources, prompts and completions of the upstreams (upstream_catalog.py) ----------------------

    def catalogs(self) -> list[tuple[str, Catalog, tuple[str, ...]]]:
        """(upstream, catalog, scopes a caller needs) of every upstream that is up."""
        return [(name, conn.catalog, tuple(conn.config.scopes)) for name, conn in sorted(self.connections.items())
                if self.status[name].state == "up" and conn.client is not None]

    def _client(self, upstream: str) -> Client:
        conn = self.connections.get(upstream)
        if conn is None or conn.client is None or self.status[upstream].state != "up":
            raise Unavailable(f"the upstream {upstream!r} is down", hint="retry with backoff; it is reconnecting")
        return conn.client

    async def read_resource(self, upstream: str, uri: str) -> types.ReadResourceResult:
        return await self._client(upstream).read_resource(uri)

    async def subscribe(self, upstream: str, uri: str) -> None:
        """Subscribe to one of the upstream's resources when it serves `resources/subscribe` (a 2025-era
        connection that declares subscriptions); otherwise nothing (2026-07-28 has subscriptions/listen).

        The connection serves every caller, so a subscription is never dropped for one caller's
        unsubscribe (the gateway filters updates per session); it is renewed when the upstream reconnects.
        A URI subscribed to already is not asked again; a connection holds at most MAX_SUBSCRIBED_PER_UPSTREAM."""
        client = self._client(upstream)
        subscribed = self.connections[upstream].subscribed
        if not _subscribes(client) or uri in subscribed:
            return
        if len(subscribed) >= MAX_SUBSCRIBED_PER_UPSTREAM:
            raise ValidationFailed(f"the gateway holds {MAX_SUBSCRIBED_PER_UPSTREAM} subscriptions to the upstream "
                                   f"{upstream!r} already", field="uri",
                                   hint="read the resource instead; operators: callers subscribe to too much")
        await client.subscribe_resource(uri)
        subscribed.add(uri)

    async def get_prompt(self, upstream: str, name: str, arguments: dict[str, str]) -> types.GetPromptResult:
        return await self._client(upstream).get_prompt(name, arguments)

    async def complete(self, upstream: str, ref, argument: dict[str, str],
                       context: dict[str, str] | None) -> types.CompleteResult:
        """The upstream's completions; none (an empty completion) from an upstream that declares no completions."""
        client = self._client(upstream)
        if client.server_capabilities is not None and client.server_capabilities.completions is None:
            return types.CompleteResult(completion=types.Completion(values=[]))
        return await client.complete(ref, argument, context)

    # --- the backend -----------------------------------------------------------------------------------

    async def call(self, target: str, arguments: dict[str, Any], timeout: float) -> dict[str, Any]:
        upstream, _, tool = target.partition("/")
        conn = self.connections.get(upstream)
        if conn is None:
            raise NotFound(f"no upstream named {upstream!r}", field="backend", hint="operators: add the upstream")
        if conn.client is None or self.status[upstream].state != "up":
            raise Unavailable(f"the upstream {upstream!r} is down ({self.status[upstream].reason or 'connecting'})",
                              hint="retry with backoff; the gateway is reconnecting it")
        report, relay = progress_reporter(), call_relay()
        if conn.lean is not None and (report is None or relay is not None):  # one POST (upstream_http.py)
            # With a relay, the upstream's log messages, progress and requests (sampling, elicitation)
            # made on the call's stream go to the calling client; stdio and TLS upstreams relay progress only.
            return await self._lean_call(upstream, conn, conn.lean, tool, arguments, relay, report, timeout)
        try:
            # Progress the upstream reports is relayed to the caller (when it asked for it), all of it before the
            # answer (upstream_sdk.py); a call cancelled here (the caller went away) makes the SDK client send
            # the upstream `notifications/cancelled` (or close the request's stream on 2026-07-28 HTTP).
            result = await upstream_sdk.call_tool(conn.client, tool, arguments, timeout, report)
        except MCPError as exc:
            if exc.error.code == types.HEADER_MISMATCH:  # listed again and resent, refused still: its tools changed
                conn.changed.set()
            raise _refused(exc.error.message) from None
        except (OSError, EOFError, RuntimeError) as exc:  # the transport broke under the call
            conn.broken.set()
            raise Unavailable(f"the upstream {upstream!r} connection failed ({type(exc).__name__})",
                              hint="retry with backoff") from None
        if isinstance(result, types.InputRequiredResult):  # nobody on this path can be asked
            raise _cannot_ask(relayable=conn.lean is not None)
        return _result(result)

    async def _lean_call(self, upstream: str, conn: _Connection, lean: LeanHttpCaller, tool: str,
                         arguments: dict[str, Any], relay=None, report=None,
                         timeout: float | None = None) -> dict[str, Any]:
        """`timeout`: the call's deadline from now (the pipeline's), which relayed requests must fit in. A call
        that fails after the calling client refused, declined or did not answer what the upstream asked fails
        on the caller's side (`caller_side`): it does not count against the upstream's shared breaker."""
        asked = CallerAsked(None if timeout is None else asyncio.get_running_loop().time() + timeout)
        try:
            mirrored = conn.param_headers.get(tool)
            raw = await lean.call(tool, arguments, relay=relay, report=report, asked=asked,
                                  headers=mcp_param_headers(mirrored, arguments) if mirrored else None)
        except UpstreamRefused as exc:
            raise _caller_side(_refused(exc.message), asked.refused) from None
        except UpstreamBroken as exc:
            self.status[upstream].reason = str(exc)
            conn.broken.set()
            raise Unavailable(f"the upstream {upstream!r} connection failed ({str(exc)[:100]})",
                              hint="retry with backoff") from None
        if raw.get("resultType") == "input_required":  # with a relay, lean.call asked the caller already
            raise _cannot_ask()
        if raw.get("resultType", "complete") != "complete":
            raise BackendFailed(f"the upstream answered a result the gateway does not know ({raw.get('resultType')})",
                                hint="operators: check the upstream server")
        try:
            result = types.CallToolResult.model_validate(raw, by_name=False)
        except ValidationError:
            raise BackendFailed("the upstream answered something that is not a tool result",
                                hint="operators: check the upstream server") from None
        if not result.is_error:
            _check_output(conn, tool, result)
        try:
            return _result(result)
        except BackendFailed as exc:
            raise _caller_side(exc, asked.refused) from None


def _subscribes(client: Client) -> bool:
    resources = client.server_capabilities.resources if client.server_capabilities else None
    return bool(resources is not None and resources.subscribe and client.protocol_version not in MODERN_PROTOCOL_VERSIONS)


def _check_output(conn: _Connection, tool: str, result: types.CallToolResult) -> None:
    """What the SDK client checks of a result: structured content that matches the tool's output schema."""
    schema = next((t.output_schema for t in conn.tools.values() if t.name == tool), None)
    if not schema:
        return
    if result.structured_content is None:
        raise BackendFailed(f"the upstream tool {tool} has an output schema but returned no structured content",
                            hint="operators: check the upstream server")
    validator = conn.output_validators.get(tool)
    if validator is None:
        validator = conn.output_validators[tool] = SafeValidator(schema)
    error = next(iter(validator.iter_errors(result.structured_content)), None)
    if error is not None:
        where = "/".join(str(p) for p in error.path) or "(root)"
        raise BackendFailed(f"the upstream tool {tool} returned a result that does not match its output schema "
                            f"({where}: {error.message[:200]})", hint="operators: check the upstream server")


def _caller_side(error: BackendFailed, refused: bool) -> BackendFailed:
    """`error`, marked the caller's doing when the caller refused the upstream's request or could not be asked it
    (pipeline: not counted against the breaker or the canary's arm, not retried: the client would be asked
    again)."""
    if refused:
        error.caller_side = True  # type: ignore[attr-defined]
        error.retryable = False
        error.hint = "the upstream needed an answer from the calling client (sampling or elicitation) and got none"
    return error


def _cannot_ask(relayable: bool = True) -> BackendFailed:
    """An upstream asked for input (2026-07-28 `input_required`) of a caller the gateway cannot relay to: the
    caller's doing (stdio, gRPC and 2026-07-28 callers are never relayed to), not the upstream's. `relayable`:
    the upstream's calls can be relayed to other callers (a Streamable HTTP one; a stdio one's never are)."""
    error = _caller_side(BackendFailed("the upstream needs input (sampling or elicitation) from the calling client, "
                                       "which the gateway cannot ask it for"), True)
    error.hint = ("call this tool over MCP Streamable HTTP in a 2025-era session (initialize) that declares the "
                  "capability, or use a tool that needs no input mid-call" if relayable else
                  "this upstream's tools cannot ask the caller for input through the gateway: use a tool that "
                  "needs no input mid-call")
    return error


def _refused(message: str) -> BackendFailed:
    return BackendFailed(f"the upstream refused the call: {message[:200]}",
                         hint="check the arguments against the tool's schema")


def _result(result: types.CallToolResult) -> dict[str, Any]:
    texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    if result.is_error:
        reason = (texts[0] if texts else "the upstream tool failed")[:200]
        raise BackendFailed(f"the upstream tool failed: {reason}",
                            hint="read the reason; fix the arguments or retry later")
    if result.structured_content is not None:
        return dict(result.structured_content)
    if any(not isinstance(block, types.TextContent) for block in result.content):
        # Media and embedded resources travel as the blocks themselves (MEDIA_KEY); the MCP entry point
        # answers them as blocks again, gRPC callers get them as JSON.
        return {MEDIA_KEY: [block.model_dump(mode="json", by_alias=True, exclude_none=True)
                            for block in result.content]}
    if len(texts) == 1:
        with contextlib.suppress(ValueError):
            value = json.loads(texts[0])
            return value if isinstance(value, dict) else {"result": value}
    return {"text": "\n".join(texts)}


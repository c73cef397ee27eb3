"""The lean upstream caller's parts without a network: the HTTP/1.1 response reader (bodies by length, chunked,
up to the end; lines of an SSE stream), the output-schema check a lean call keeps from the SDK client, and the
renewal of an upstream's subscriptions on reconnection."""

from __future__ import annotations

import asyncio

import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from services.tool_gateway.adapters import upstreams
from services.tool_gateway.adapters.http1 import ProtocolError, _parse_head
from services.tool_gateway.adapters.upstream_catalog import Catalog
from services.tool_gateway.adapters.upstreams import UpstreamManager, _check_output, _Connection
from services.tool_gateway.domain import BackendFailed
from services.tool_gateway.domain.upstream import UpstreamConfig


def response(raw: bytes):
    reader = asyncio.StreamReader()
    head, _, body = raw.partition(b"\r\n\r\n")
    reader.feed_data(body)
    reader.feed_eof()
    return _parse_head(reader, head + b"\r\n\r\n")


async def test_a_body_is_read_by_its_length_chunked_or_to_the_end() -> None:
    sized = response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}extra")
    chunked = response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n1;ext=1\r\n}\r\n0\r\nX: y\r\n\r\n")
    to_end = response(b"HTTP/1.1 404 Not Found\r\nConnection: close\r\n\r\nnope")
    assert (await sized.read(), await chunked.read(), await to_end.read()) == (b"{}", b"{}", b"nope")
    assert (sized.status, to_end.status, to_end.headers["connection"]) == (200, 404, "close")
    assert sized.complete and chunked.complete and to_end.complete


async def test_lines_are_split_on_any_line_end_across_chunks() -> None:
    stream = response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                      b"9\r\nevent: me\r\n" b"8\r\nssage\r\nd\r\n" b"6\r\nata: x\r\n" b"2\r\n\n\n\r\n0\r\n\r\n")
    assert [line async for line in stream.lines()] == ["event: message", "data: x", ""]


async def test_a_character_or_a_crlf_straddling_two_chunks_is_read_whole() -> None:
    text = "data: 中文\r\n\r\n".encode()
    cut = text.index("中".encode()) + 1  # inside the character's three bytes
    crlf = text.index(b"\r\n") + 1  # between CR and LF
    body = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (text[:cut], text[cut:crlf], text[crlf:]))
    stream = response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body + b"0\r\n\r\n")
    assert [line async for line in stream.lines()] == ["data: 中文", ""]


async def test_no_body_after_204_and_304_and_a_body_past_the_cap_is_a_protocol_error() -> None:
    for status in (b"204 No Content", b"304 Not Modified"):
        empty = response(b"HTTP/1.1 " + status + b"\r\n\r\nleft for the next answer")
        assert await empty.read() == b"" and empty.complete
    reader = asyncio.StreamReader()
    reader.feed_data(b"x" * 100)
    reader.feed_eof()
    big = _parse_head(reader, b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", max_body_bytes=64)
    with pytest.raises(ProtocolError, match="larger than 64 bytes"):
        await big.read()
    sized = _parse_head(reader, b"HTTP/1.1 200 OK\r\nContent-Length: 65\r\n\r\n", max_body_bytes=64)
    with pytest.raises(ProtocolError, match="larger than 64 bytes"):
        await sized.read()


async def test_what_is_not_http_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        response(b"SSH-2.0-OpenSSH\r\n\r\n")


def _connection_with(output_schema: dict | None) -> _Connection:
    conn = _Connection(UpstreamConfig(name="fx", url="http://127.0.0.1:1/mcp"))
    conn.tools = {"fx.lookup": types.Tool(name="lookup", input_schema={"type": "object"},
                                          output_schema=output_schema)}
    return conn


def test_a_lean_call_s_result_must_match_the_upstream_tool_s_output_schema() -> None:
    conn = _connection_with({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    _check_output(conn, "lookup", types.CallToolResult(content=[], structured_content={"n": 1}))
    with pytest.raises(BackendFailed, match="does not match its output schema"):
        _check_output(conn, "lookup", types.CallToolResult(content=[], structured_content={"n": "one"}))
    with pytest.raises(BackendFailed, match="no structured content"):
        _check_output(conn, "lookup", types.CallToolResult(content=[]))
    _check_output(_connection_with(None), "lookup", types.CallToolResult(content=[]))  # no schema: no check


class _ReconnectingClient:
    """The SDK client of an upstream that subscribes, except to a resource it no longer serves."""

    protocol_version = "2025-11-25"
    server_capabilities = types.ServerCapabilities(resources=types.ResourcesCapability(subscribe=True))

    def __init__(self, *args, **kwargs) -> None:
        self.subscribed: list[str] = []

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        return None

    async def list_tools(self, **kwargs):
        return types.ListToolsResult(tools=[types.Tool(name="echo", input_schema={"type": "object"})])

    async def subscribe_resource(self, uri: str) -> None:
        if uri == "fixture://gone":
            raise MCPError(types.INVALID_PARAMS, "no such resource")
        self.subscribed.append(uri)


async def test_a_refused_renewal_of_a_subscription_drops_that_uri_and_the_upstream_stays_up(monkeypatch) -> None:
    async def no_catalog(client, prefix, names):
        return Catalog()

    monkeypatch.setattr(upstreams, "Client", _ReconnectingClient)
    monkeypatch.setattr(upstreams, "list_catalog", no_catalog)
    monkeypatch.setattr(UpstreamManager, "_transport", lambda self, conn, stack: (None, None))
    manager = UpstreamManager(ping_seconds=60)
    config = UpstreamConfig(name="up", url="http://127.0.0.1:9/mcp")
    manager.connections["up"] = conn = upstreams._Connection(config)
    conn.subscribed.update({"fixture://gone", "fixture://motd"})  # what the previous connection subscribed to
    manager.status["up"] = upstreams.UpstreamStatus()
    task = asyncio.create_task(manager._supervise("up"))
    try:
        for _ in range(100):
            if conn.client is not None and conn.subscribed == {"fixture://motd"}:
                break
            await asyncio.sleep(0.01)
        assert manager.status["up"].state == "up" and [s.name for s in manager.specs()] == ["up.echo"]
        assert conn.subscribed == {"fixture://motd"} and conn.client.subscribed == ["fixture://motd"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_call_failing_after_the_caller_refused_the_upstreams_request_is_marked_the_callers_doing() -> None:
    class Lean:
        def __init__(self, refuse: bool) -> None:
            self.refuse, self.deadline = refuse, None

        async def call(self, tool, arguments, *, relay, report, asked, headers):
            self.deadline = asked.deadline
            asked.refused = self.refuse
            raise upstreams.UpstreamRefused("the user declined")

    manager = UpstreamManager()
    conn = _Connection(UpstreamConfig(name="up", url="http://127.0.0.1:9/mcp"))
    manager.status["up"] = upstreams.UpstreamStatus()
    for refuse in (True, False):
        lean = Lean(refuse)
        with pytest.raises(BackendFailed) as failed:
            await manager._lean_call("up", conn, lean, "ask", {}, None, None, 30.0)  # type: ignore[arg-type]
        assert getattr(failed.value, "caller_side", False) is refuse and failed.value.retryable is False
        assert lean.deadline is not None and 29 < lean.deadline - asyncio.get_running_loop().time() <= 30


async def test_a_lean_call_mirrors_the_arguments_the_tools_schema_marks_x_mcp_header_in_mcp_param_headers() -> None:
    class Lean:
        def __init__(self) -> None:
            self.sent: list = []

        async def call(self, tool, arguments, *, relay, report, asked, headers):
            self.sent.append((tool, headers))
            return {"content": [], "structuredContent": {"ok": True}}

    manager = UpstreamManager()
    conn = _Connection(UpstreamConfig(name="up", url="http://127.0.0.1:9/mcp"))
    manager.status["up"] = upstreams.UpstreamStatus()
    conn.param_headers = {"route": {("region",): "Region", ("to", "zone"): "Zone"}}
    lean = Lean()
    await manager._lean_call("up", conn, lean, "route", {"region": "华东", "to": {"zone": 7}}, None, None, 30.0)
    await manager._lean_call("up", conn, lean, "route", {"to": {}}, None, None, 30.0)  # none present: none sent
    await manager._lean_call("up", conn, lean, "echo", {"region": "x"}, None, None, 30.0)  # not marked
    [(_, both), (_, none), (_, unmarked)] = lean.sent
    assert both["Mcp-Param-Zone"] == "7" and both["Mcp-Param-Region"].startswith("=?base64?")  # not a token
    assert none == {} and unmarked is None


async def test_an_upstream_still_working_is_called_again_with_its_state_with_no_caller_to_ask() -> None:
    """A 2026-07-28 `input_required` that carries only its `requestState` asks nobody: the lean caller calls again
    with it (no relay needed); one that asks for input comes back as it is when there is no caller to ask."""
    from services.tool_gateway.adapters.upstream_http import LeanHttpCaller

    caller = object.__new__(LeanHttpCaller)  # its transport is not used: `_call_once` answers below
    sent: list[dict] = []
    answers = [{"resultType": "input_required", "requestState": "s1"},
               {"resultType": "input_required", "requestState": "s2"},
               {"content": [], "structuredContent": {"job": "done"}}]

    async def call_once(tool, params, relay, report, asked=None, headers=None):
        sent.append(dict(params))
        return answers[len(sent) - 1]

    caller._call_once = call_once  # type: ignore[method-assign]
    assert await caller.call("job", {"x": 1}) == answers[2]
    assert [p.get("requestState") for p in sent] == [None, "s1", "s2"]
    assert all("inputResponses" not in p for p in sent)
    asking = {"resultType": "input_required", "inputRequests": {"q": {"method": "elicitation/create", "params": {}}}}
    answers[:] = [asking]
    sent.clear()
    assert await caller.call("job", {}) == asking and len(sent) == 1

"""The lean paths against the real thing: the MCP endpoint's lean tools/call path (mcp_fast) with the official
SDK client in both revisions, its answers compared with the SDK's own for the same request, and the lean
upstream caller (upstream_http) on a real fixture MCP server in both revisions, cancellation included."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import anyio
import httpx2
import pytest
from test_gateway_mcp_protocol import wait_for_text
from test_gateway_upstreams import federating, http_upstream, listed, tool_error, wait_answers  # noqa: F401
from test_mcp import MODES, Gateway, mcp_client
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.inbound import encode_header_value
from mcp_types import HEADER_MISMATCH

from services.tool_gateway.adapters.http1 import Http1Pool, ProtocolError
from services.tool_gateway.adapters.upstream_http import LeanHttpCaller, SessionTracker, UpstreamRefused

pytestmark = pytest.mark.integration
MODERN_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
               "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "0"},
               "io.modelcontextprotocol/clientCapabilities": {}}


def _request(version: str, token: str, name: str, arguments: dict) -> tuple[dict, dict]:
    params: dict = {"name": name, "arguments": arguments}
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": version}
    if version == "2026-07-28":
        params["_meta"] = MODERN_META
        headers.update({"Mcp-Method": "tools/call", "Mcp-Name": name})
    return {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": params}, headers


def _message(response: httpx2.Response) -> dict:
    if response.headers["content-type"].startswith("text/event-stream"):
        data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        return json.loads(data[-1])
    return response.json()


@pytest.mark.parametrize("version", ["2025-11-25", "2026-07-28"])
@pytest.mark.parametrize("arguments", [{"text": "hi", "times": 2}, {"text": 7}, {}])
async def test_the_lean_path_answers_what_the_sdk_answers_for_the_same_call(
    federating: Gateway, version: str, arguments: dict  # noqa: F811
) -> None:
    """An `Mcp-Param-*` header sends the same request through the SDK (the lean path leaves those to it)."""
    await listed(federating, {"rm.echo"})
    message, headers = _request(version, federating.token("tools:*"), "rm.echo", arguments)
    async with httpx2.AsyncClient(timeout=30) as http:
        lean = await http.post(federating.url, json=message, headers=headers)
        sdk = await http.post(federating.url, json=message, headers={**headers, "Mcp-Param-Unused": "x"})
    assert (lean.status_code, lean.headers["content-type"]) == (sdk.status_code, sdk.headers["content-type"])
    assert _message(lean) == _message(sdk)
    result = _message(lean)["result"]
    assert result["isError"] is (arguments != {"text": "hi", "times": 2})
    if not result["isError"]:
        assert result["structuredContent"] == {"echo": "hi hi"}


@pytest.mark.parametrize("mode", MODES)
async def test_the_sdk_client_calls_through_the_lean_path_with_structured_errors_scopes_and_auth(
    federating: Gateway, mode: str  # noqa: F811
) -> None:
    await listed(federating, {"rm.echo", "local.echo"})
    async with mcp_client(federating, federating.token("tools:*"), mode) as client:
        remote = await client.call_tool("rm.echo", {"text": "a", "times": 3})
        local = await client.call_tool("local.echo", {"text": "b"})
        invalid = await client.call_tool("rm.echo", {"times": 2})
        missing = await client.call_tool("rm.nothing_here", {})
    assert (remote.structured_content, local.structured_content) == ({"echo": "a a a"}, {"echo": "b"})
    # rm.echo declares an output schema: its errors carry the structured error as JSON text only
    assert tool_error(invalid)["error_type"] == "validation" and invalid.structured_content is None
    assert "text" in tool_error(invalid)["reason"]
    assert missing.is_error and missing.structured_content["error_type"] == "not_found"
    async with mcp_client(federating, federating.token("tools:read"), mode) as client:
        refused = await client.call_tool("rm.echo", {"text": "a"})
    assert tool_error(refused)["error_type"] == "permission_denied"
    message, headers = _request("2026-07-28" if mode == "auto" else "2025-11-25", "not-a-token", "rm.echo",
                                {"text": "a"})
    async with httpx2.AsyncClient(timeout=30) as http:
        unauthenticated = await http.post(federating.url, json=message, headers=headers)
    assert unauthenticated.status_code == 401
    assert unauthenticated.json()["error"]["data"]["error_type"] == "unauthenticated"


@pytest.mark.parametrize("mode", MODES)
async def test_the_lean_upstream_caller_calls_and_cancels_on_both_revisions(
    http_upstream: str, mode: str, tmp_path: Path  # noqa: F811
) -> None:
    await wait_answers(http_upstream)
    session = SessionTracker()
    pool = Http1Pool(http_upstream)
    async with (httpx2.AsyncClient(event_hooks={"response": [session]}) as http,
                Client(streamable_http_client(http_upstream, http_client=http), mode=mode) as client):
        assert (session.session_id is not None) == (mode == "legacy")
        lean = LeanHttpCaller(pool, client.protocol_version, session, client_info={"name": "t", "version": "0"})
        results = await asyncio.gather(*(lean.call("echo", {"text": str(n), "times": 2}) for n in range(5)))
        assert [r["structuredContent"] for r in results] == [{"echo": f"{n} {n}"} for n in range(5)]
        assert (await lean.call("no_such_tool", {}))["isError"] is True  # a tool error: the manager maps it
        with pytest.raises(UpstreamRefused):  # a JSON-RPC error: arguments that are not an object
            await lean.call("echo", ["not", "an", "object"])  # type: ignore[arg-type]
        marker = tmp_path / f"slow-{mode}"
        call = asyncio.create_task(lean.call("slow", {"marker": str(marker)}))
        await wait_for_text(marker, "started")
        call.cancel()
        await wait_for_text(marker, "cancelled")
        with pytest.raises(asyncio.CancelledError):
            await call
        again = await lean.call("echo", {"text": "after"})  # the cancelled call's connection is not reused
        assert again["structuredContent"] == {"echo": "after"}
    await pool.aclose()


async def test_the_pool_never_sends_a_request_twice_and_drops_connections_idle_too_long() -> None:
    """A kept connection that closes under a request, unanswered, fails that request: the upstream may have
    run the tool, so sending it again is the pipeline's decision. A connection idle past `idle_seconds` is
    not reused (servers close theirs after their keep-alive timeout)."""
    answered, requests, connections = 0, 0, 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal answered, requests, connections
        connections += 1
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)
        requests += 1
        answered += 1
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"2\r\n{}\r\n0\r\n\r\n")
        await writer.drain()
        with contextlib.suppress(asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")  # the next request on this connection: dropped unanswered
            requests += 1
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = Http1Pool(f"http://127.0.0.1:{port}/mcp", idle_seconds=0.5)
    try:
        with anyio.fail_after(10):
            async with pool.post(b"{}", {}) as response:
                assert (response.status, await response.read()) == (200, b"{}")
            with pytest.raises(ProtocolError):  # on the kept connection, which the server drops
                async with pool.post(b"{}", {}) as response:
                    pass
            assert (answered, requests, connections) == (1, 2, 1)  # sent once, not again on a new connection
            async with pool.post(b"{}", {}) as response:  # a new connection
                assert (response.status, await response.read()) == (200, b"{}")
            await asyncio.sleep(0.7)  # past idle_seconds: the kept connection is closed, a new one opened
            async with pool.post(b"{}", {}) as response:
                assert (response.status, await response.read()) == (200, b"{}")
    finally:
        await pool.aclose()
        server.close()
    assert (answered, connections) == (3, 3)


async def test_the_pool_skips_interim_answers_and_holds_at_most_max_connections_at_a_time() -> None:
    open_now, most = 0, 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_now, most
        open_now += 1
        most = max(most, open_now)
        try:
            await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(2)
            await asyncio.sleep(0.05)
            writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </x>; rel=preload\r\n\r\n"
                         b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
            await writer.drain()
        finally:
            open_now -= 1
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = Http1Pool(f"http://127.0.0.1:{port}/mcp", max_connections=2)

    async def one() -> tuple[int, bytes]:
        async with pool.post(b"{}", {}) as response:
            return response.status, await response.read()

    try:
        with anyio.fail_after(10):
            answers = await asyncio.gather(*(one() for _ in range(6)))
    finally:
        await pool.aclose()
        server.close()
    assert answers == [(200, b"{}")] * 6 and most == 2
    with pytest.raises(ProtocolError, match="closed"):  # a closed pool opens nothing more
        async with pool.post(b"{}", {}):
            pass


async def test_the_lean_pool_speaks_tls_and_checks_the_certificate(tmp_path: Path) -> None:
    import ssl
    import subprocess
    import sys

    from test_gateway_relay import test_ca_and_certificate
    from test_gateway_upstreams import FIXTURE

    from mnemesh.infra import free_port

    ca, certificate, key = test_ca_and_certificate(tmp_path)
    port = free_port()
    upstream = subprocess.Popen([sys.executable, FIXTURE, "https", str(port), str(certificate), str(key)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "echo", "arguments": {"text": "tls"}, "_meta": MODERN_META}}).encode()
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
               "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "echo"}
    trusting = Http1Pool(f"https://127.0.0.1:{port}/mcp", ssl_context=ssl.create_default_context(cafile=str(ca)))
    by_name = Http1Pool(f"https://localhost:{port}/mcp", ssl_context=ssl.create_default_context(cafile=str(ca)))
    stranger = Http1Pool(f"https://127.0.0.1:{port}/mcp", ssl_context=ssl.create_default_context())
    try:
        await wait_answers(f"https://127.0.0.1:{port}/mcp", verify=ssl.create_default_context(cafile=str(ca)))
        async with trusting.post(body, headers) as response:
            assert json.loads(await response.read())["result"]["structuredContent"] == {"echo": "tls"}
        async with by_name.post(body, headers) as response:  # the host name is checked against the certificate
            assert json.loads(await response.read())["result"]["structuredContent"] == {"echo": "tls"}
        with pytest.raises(ssl.SSLCertVerificationError):  # a certificate of a CA the context does not trust
            async with stranger.post(body, headers):
                pass
        with pytest.raises(ValueError, match="SSL context"):
            Http1Pool(f"https://127.0.0.1:{port}/mcp")
    finally:
        for pool in (trusting, by_name, stranger):
            await pool.aclose()
        upstream.terminate()
        upstream.wait(10)


async def test_mcp_param_headers_are_checked_against_the_arguments_the_tools_schema_marks(
    federating: Gateway  # noqa: F811
) -> None:
    """`rm.route` marks `region` x-mcp-header: a 2026-07-28 call mirrors it in `Mcp-Param-Region`, served by the
    lean path when it matches (the answer the SDK gives too), refused 400 HEADER_MISMATCH when it is missing or
    disagrees; a 2025-11-25 call has no such header to check."""
    await listed(federating, {"rm.route"})
    token = federating.token("tools:*")
    arguments = {"region": "华东-1", "parcel": "p-7"}
    message, headers = _request("2026-07-28", token, "rm.route", arguments)
    region = {"Mcp-Param-Region": encode_header_value("华东-1")}
    legacy, legacy_headers = _request("2025-11-25", token, "rm.route", arguments)
    async with httpx2.AsyncClient(timeout=30) as http:
        lean = await http.post(federating.url, json=message, headers={**headers, **region})
        sdk = await http.post(federating.url, json=message, headers={**headers, **region, "Mcp-Param-Unused": "x"})
        missing = await http.post(federating.url, json=message, headers=headers)
        wrong = await http.post(federating.url, json=message, headers={**headers, "Mcp-Param-Region": "eu-west"})
        stray = await http.post(federating.url, json={**message, "params": {**message["params"], "arguments": {
            "parcel": "p-7"}}}, headers={**headers, **region})
        older = await http.post(federating.url, json=legacy, headers=legacy_headers)
    assert lean.status_code == 200 and _message(lean) == _message(sdk)
    assert _message(lean)["result"]["structuredContent"] == arguments
    for refused, why in ((missing, "missing"), (wrong, "does not match"), (stray, "absent")):
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["code"] == HEADER_MISMATCH and "Mcp-Param-Region" in error["message"] and why in error["message"]
    assert older.status_code == 200 and _message(older)["result"]["structuredContent"] == arguments

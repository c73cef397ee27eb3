"""What third-party MCP clients found wanting in the gateway (a probe of real ones), against a real gateway in front
of this repository's fixture upstream (over stdio and Streamable HTTP): a caller the gateway cannot relay to does
not open the upstream tool's shared breaker; a 2025-03-26 client, which sends no `MCP-Protocol-Version` header,
still has log messages and sampling relayed; a caller on a revision before resource links gets the link to a
whole result as text; completions of an upstream prompt whose server has none are an empty completion."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable

import httpx2
import mcp_types as types
import pytest
from test_gateway_relay import client_of, sample
from test_gateway_upstreams import federating, http_upstream, listed, tool_error  # noqa: F401 - fixtures
from test_mcp import HEADERS, Gateway, mcp_client

pytestmark = pytest.mark.integration


async def test_a_caller_the_gateway_cannot_ask_for_input_fails_on_its_side_and_the_breaker_stays_closed(
    federating: Gateway  # noqa: F811
) -> None:
    """2026-07-28 callers (like stdio and gRPC ones) are never relayed to: an upstream that needs sampling fails the
    call, as the caller's doing, which neither opens the tool's breaker (5 failures in a row would) nor is retried."""
    await listed(federating, {"local.ask_llm", "rm.ask_llm"})
    async with mcp_client(federating, federating.token("tools:*")) as client:
        errors = {tool: [tool_error(await client.call_tool(tool, {"prompt": "hi"})) for _ in range(8)]
                  for tool in ("rm.ask_llm", "local.ask_llm")}
    for tool, failed in errors.items():
        assert {e["error_type"] for e in failed} == {"backend_error"}, (tool, failed[-1])  # never circuit_open
        # what would serve the call: a caller the gateway can ask, or (a stdio upstream's tool) none
        hint = "2025-era session" if tool == "rm.ask_llm" else "cannot ask the caller for input through the gateway"
        assert all(e["retryable"] is False and hint in e["hint"] for e in failed), failed[-1]
    async with client_of(federating, sampling_callback=sample) as client:  # a caller it can ask: served at once
        sampled = await client.call_tool("rm.ask_llm", {"prompt": "hello"})
    assert sampled.structured_content == {"said": "you said hello", "model": "test-model"}


@contextlib.asynccontextmanager
async def session(gw: Gateway, version: str, capabilities: dict | None = None) -> AsyncIterator[
        tuple[httpx2.AsyncClient, dict[str, str]]]:
    """A raw HTTP client in a session the gateway issued (initialize as `version`), and the headers of its requests:
    no MCP-Protocol-Version header, as a 2025-03-26 client sends none."""
    headers = {**HEADERS, "Authorization": f"Bearer {gw.token('tools:*')}"}
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                  "params": {"protocolVersion": version, "capabilities": capabilities or {},
                             "clientInfo": {"name": "probe", "version": "0"}}}
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(10, read=30)) as http:
        init = await http.post(gw.url, json=initialize, headers=headers)
        assert init.status_code == 200, init.text
        headers["mcp-session-id"] = init.headers["mcp-session-id"]
        await http.post(gw.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
        yield http, headers


async def call(http: httpx2.AsyncClient, url: str, headers: dict[str, str], name: str, arguments: dict,
               answer: Callable[[dict], dict] | None = None) -> tuple[list[dict], dict]:
    """A tools/call read off its response stream: (the messages before its answer, the answer); a request the
    gateway makes of the client on that stream is answered `answer(request)` in a POST of its own."""
    before: list[dict] = []
    message = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
    async with http.stream("POST", url, json=message, headers=headers) as response:
        if not response.headers["content-type"].startswith("text/event-stream"):
            return before, json.loads(await response.aread())
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            got = json.loads(line[5:])
            if got.get("id") == 2 and "method" not in got:
                return before, got
            before.append(got)
            if "method" in got and "id" in got and answer is not None:
                reply = {"jsonrpc": "2.0", "id": got["id"], "result": answer(got)}
                assert (await http.post(url, json=reply, headers=headers)).status_code == 202
    raise AssertionError(f"the stream of {name} ended without an answer: {before}")


async def test_a_2025_03_26_client_without_the_version_header_has_log_messages_and_sampling_relayed(
    federating: Gateway  # noqa: F811
) -> None:
    await listed(federating, {"rm.chatty", "rm.ask_llm"})

    def sampled(request: dict) -> dict:
        return {"role": "assistant", "model": "probe-model", "content": {"type": "text", "text": "hi back"}}

    async with session(federating, "2025-03-26", {"sampling": {}}) as (http, headers):
        logged, chatty = await call(http, federating.url, headers, "rm.chatty", {})
        asked, said = await call(http, federating.url, headers, "rm.ask_llm", {"prompt": "hi"}, answer=sampled)
    assert chatty["result"]["structuredContent"] == {"done": True}
    assert [m["params"]["data"] for m in logged if m.get("method") == "notifications/message"] == \
        ["chatty: debug", "chatty: info", "chatty: warning"]
    assert [m["method"] for m in asked] == ["sampling/createMessage"]
    assert said["result"]["structuredContent"] == {"said": "hi back", "model": "probe-model"}


@pytest.mark.parametrize(("version", "in_session", "kind"), [
    ("2025-03-26", True, "text"),  # no header in a session: the lean path, as 2025-03-26
    ("2025-03-26", False, "text"),  # no header and no session: the SDK, which assumes 2025-03-26 too
    ("2025-06-18", True, "resource_link"),
])
async def test_the_link_to_a_whole_result_is_text_for_a_caller_before_resource_links(
    federating: Gateway, version: str, in_session: bool, kind: str  # noqa: F811
) -> None:
    await listed(federating, {"rm.echo"})
    async with session(federating, version) as (http, headers):
        if version != "2025-03-26":
            headers["mcp-protocol-version"] = version
        if not in_session:
            del headers["mcp-session-id"]
        _, answer = await call(http, federating.url, headers, "rm.echo", {"text": "x" * 100, "times": 200})
    result = answer["result"]
    assert result["isError"] is True and "structuredContent" not in result  # echo declares an output schema
    error, link = json.loads(result["content"][0]["text"]), result["content"][1]
    assert error["error_type"] == "result_too_large" and link["type"] == kind
    uri = error["hint"].rpartition(" ")[2]
    if kind == "text":
        assert link["text"] == f"the whole result is the resource {uri}; read it with resources/read"
    else:
        assert link["uri"] == uri
    async with mcp_client(federating, federating.token("tools:*")) as client:
        whole = await client.read_resource(uri)
    assert json.loads(whole.contents[0].text) == {"echo": " ".join(["x" * 100] * 200)}


async def test_completing_an_upstream_prompt_whose_server_has_no_completions_answers_no_values(
    federating: Gateway  # noqa: F811
) -> None:
    await listed(federating, {"rm.echo"})
    async with mcp_client(federating, federating.token("tools:*"), "legacy") as client:
        completion = await client.complete(types.PromptReference(name="rm.greet"), {"name": "name", "value": "A"})
    assert completion.completion.values == []

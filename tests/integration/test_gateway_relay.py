"""What an upstream sends its client while serving a call reaches the gateway's caller, and back: log
messages (at the level the caller set), sampling and elicitation requests answered by the official SDK
client's callbacks, an answer that reaches another gateway process than the call (two real processes
behind one address), a clean error for a client that declared no such capability, and resource
subscriptions. The upstream is tests/integration/upstream_server.py over Streamable HTTP; the clients
speak 2025-11-25 (mode "legacy"), the revision with requests from server to client mid-call."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

import anyio
import httpx2
import mcp_types as types
import pytest
from test_gateway_replicas import RoundRobin, two_processes  # noqa: F401 - fixtures
from test_gateway_upstreams import http_upstream  # noqa: F401 - fixtures
from test_mcp import Gateway
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

pytestmark = [pytest.mark.integration,  # logging, sampling and subscribing are deprecated in 2026-07-28, still in 2025-11-25
              pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")]


class AnswersElsewhere(RoundRobin):
    """Round robin, except that a client's answer to a relayed request goes to the other process than the call."""

    def __init__(self, ports: list[int]) -> None:
        super().__init__(ports)
        self.answers: list[tuple[int, int]] = []  # (port of the call, port of the answer)

    def _port(self, request: httpx2.Request) -> int:
        try:
            message = json.loads(request.content) if request.method == "POST" else {}
        except ValueError:
            message = {}
        if isinstance(message, dict) and "result" in message and str(message.get("id", "")).startswith("mnemesh-"):
            called = list(self.calls.values())[-1]
            port = next(p for p in self.ports if p != called)
            self.answers.append((called, port))
            return port
        return super()._port(request)


@contextlib.asynccontextmanager
async def client_of(gw: Gateway, transport: httpx2.AsyncBaseTransport | None = None,
                    **callbacks) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {gw.token('tools:*')}"}
    async with (httpx2.AsyncClient(headers=headers, transport=transport, timeout=httpx2.Timeout(10, read=30)) as http,
                Client(streamable_http_client(gw.url, http_client=http), mode="legacy", **callbacks) as client):
        with anyio.fail_after(30):
            while "rm.ask_llm" not in {t.name for t in (await client.list_tools()).tools}:
                await anyio.sleep(0.1)
        yield client


async def sample(context, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    prompt = params.messages[0].content
    return types.CreateMessageResult(role="assistant", model="test-model", stop_reason="endTurn",
                                     content=types.TextContent(text=f"you said {getattr(prompt, 'text', '')}"))


async def test_upstream_log_messages_reach_the_caller_at_the_level_it_set(
    two_processes: tuple[Gateway, list[int]]  # noqa: F811
) -> None:
    gw, ports = two_processes
    balancer = RoundRobin(ports)
    logged: list[tuple[str, object]] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logged.append((params.level, params.data))

    async with client_of(gw, transport=balancer, logging_callback=on_log) as client:
        result = await client.call_tool("rm.chatty", {})
        everything = list(logged)
        logged.clear()
        await client.set_logging_level("info")  # reaches one process; the other reads it from Redis
        before = len(balancer.calls)
        for _ in range(2):  # one call on each process
            await client.call_tool("rm.chatty", {})
    assert set(list(balancer.calls.values())[before:]) == set(ports)
    assert result.structured_content == {"done": True}
    assert everything == [("debug", "chatty: debug"), ("info", "chatty: info"), ("warning", "chatty: warning")]
    assert logged == [("info", "chatty: info"), ("warning", "chatty: warning")] * 2


async def test_a_sampling_request_is_answered_by_the_callers_callback(
    two_processes: tuple[Gateway, list[int]]  # noqa: F811
) -> None:
    gw, _ = two_processes
    async with client_of(gw, sampling_callback=sample) as client:
        result = await client.call_tool("rm.ask_llm", {"prompt": "hello"})
    assert not result.is_error, result.content
    assert result.structured_content == {"said": "you said hello", "model": "test-model"}


async def test_an_elicitation_is_answered_by_the_callers_callback(
    two_processes: tuple[Gateway, list[int]]  # noqa: F811
) -> None:
    gw, _ = two_processes
    asked: list[str] = []

    async def elicit(context, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"name": "Ada"})

    async with client_of(gw, elicitation_callback=elicit) as client:
        result = await client.call_tool("rm.ask_user", {"question": "Who are you?"})
    assert asked == ["Who are you?"]
    assert result.structured_content == {"action": "accept", "name": "Ada"}


async def test_an_answer_posted_to_the_other_process_reaches_the_waiting_call(
    two_processes: tuple[Gateway, list[int]]  # noqa: F811
) -> None:
    gw, ports = two_processes
    balancer = AnswersElsewhere(ports)
    async with client_of(gw, transport=balancer, sampling_callback=sample) as client:
        results = [await client.call_tool("rm.ask_llm", {"prompt": f"call {n}"}) for n in range(2)]
    assert [r.structured_content for r in results] == [{"said": f"you said call {n}", "model": "test-model"}
                                                       for n in range(2)]
    assert len(balancer.answers) == 2 and all(call != answer for call, answer in balancer.answers)


async def test_a_client_without_the_capability_gets_a_clean_error(
    two_processes: tuple[Gateway, list[int]]  # noqa: F811
) -> None:
    gw, _ = two_processes
    async with client_of(gw) as client:  # no sampling callback: no sampling capability declared
        with anyio.fail_after(20):
            result = await client.call_tool("rm.ask_llm", {"prompt": "hello"})
    assert result.is_error
    assert "did not declare the sampling capability" in result.content[0].text


async def test_resource_subscriptions_round_trip(two_processes: tuple[Gateway, list[int]]) -> None:  # noqa: F811
    gw, _ = two_processes
    async with client_of(gw) as client:
        resources = client.server_capabilities.resources
        subscribed = await client.subscribe_resource("fixture://motd")
        templated = await client.subscribe_resource("fixture://items/7")
        unsubscribed = await client.unsubscribe_resource("fixture://motd")
        with pytest.raises(MCPError) as unknown:
            await client.subscribe_resource("fixture://nothing-here")
    assert resources is not None and resources.subscribe
    assert isinstance(subscribed, types.EmptyResult) and isinstance(templated, types.EmptyResult)
    assert isinstance(unsubscribed, types.EmptyResult)
    assert "no resource fixture://nothing-here" in unknown.value.error.message

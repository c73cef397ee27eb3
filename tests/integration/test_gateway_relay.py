"""What an upstream sends its client while serving a call reaches the gateway's caller, and back: log
messages (at the level the caller set), sampling and elicitation requests answered by the official SDK
client's callbacks, an answer that reaches another gateway process than the call (two real processes
behind one address), a clean error for a client that declared no such capability, and resource
subscriptions. The upstream is tests/integration/upstream_server.py over Streamable HTTP (plain, and over
TLS with a certificate of a test CA the gateway is told to trust); the clients speak 2025-11-25 (mode
"legacy"), the revision with requests from server to client mid-call."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import json
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx2
import mcp_types as types
import pytest
import test_mcp
from test_gateway_replicas import RoundRobin, gateway_process, two_processes  # noqa: F401 - fixtures
from test_gateway_upstreams import FIXTURE, http_upstream, wait_answers  # noqa: F401 - fixtures
from test_mcp import Gateway, gateway_settings
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from libs.auth import issue_token
from mnemesh.infra import free_port

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
async def client_of(gw: Gateway, transport: httpx2.AsyncBaseTransport | None = None, tool: str = "rm.ask_llm",
                    token: str | None = None, **callbacks) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token or gw.token('tools:*')}"}
    async with (httpx2.AsyncClient(headers=headers, transport=transport, timeout=httpx2.Timeout(10, read=30)) as http,
                Client(streamable_http_client(gw.url, http_client=http), mode="legacy", **callbacks) as client):
        with anyio.fail_after(30):
            while tool not in {t.name for t in (await client.list_tools()).tools}:
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


@contextlib.asynccontextmanager
async def gateways_federating(redis_url: str, database_url: str, tmp_path: Path, upstream: dict,
                              **env: str) -> AsyncIterator[tuple[Gateway, list[int]]]:
    """Two gateway processes federating `upstream` (an entry of the upstreams file), with `env` added."""
    config = tmp_path / "upstreams.json"
    config.write_text(json.dumps({"upstreams": [upstream]}))
    first = gateway_settings(redis_url, database_url, tmp_path, tool_upstreams_file=str(config))
    second = first.model_copy(update={"tool_gateway_grpc_port": free_port(), "mcp_http_port": free_port()})
    try:
        async with (gateway_process(first, "first", tmp_path, **env), gateway_process(second, "second", tmp_path, **env)):
            yield Gateway(first, asyncio.Event(), None), [first.mcp_http_port, second.mcp_http_port]  # type: ignore[arg-type]
    finally:
        await test_mcp.drop_namespace(first)


@pytest.fixture
async def legacy_upstream(redis_url: str, database_url: str, tmp_path,
                          http_upstream: str) -> AsyncIterator[tuple[Gateway, list[int]]]:  # noqa: F811
    """Two gateway processes federating the upstream over the 2025-11-25 handshake (`"mode": "legacy"`)."""
    await wait_answers(http_upstream)
    async with gateways_federating(redis_url, database_url, tmp_path, {"name": "old", "url": http_upstream,
                                                                       "prefix": "old", "mode": "legacy"}) as two:
        yield two


async def test_a_2025_era_upstream_asks_on_the_calls_stream_and_hears_the_answer(
    legacy_upstream: tuple[Gateway, list[int]]
) -> None:
    gw, ports = legacy_upstream
    balancer = AnswersElsewhere(ports)

    async def elicit(context, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="decline")

    async with client_of(gw, transport=balancer, tool="old.ask_llm", sampling_callback=sample,
                         elicitation_callback=elicit) as client:
        sampled = await client.call_tool("old.ask_llm", {"prompt": "old times"})
        declined = await client.call_tool("old.ask_user", {"question": "Who?"})
    assert sampled.structured_content == {"said": "you said old times", "model": "test-model"}
    assert declined.structured_content == {"action": "decline", "name": ""}
    assert len(balancer.answers) == 2 and all(call != answer for call, answer in balancer.answers)


async def test_resource_updates_reach_the_sessions_that_subscribed(legacy_upstream: tuple[Gateway, list[int]]) -> None:
    gw, ports = legacy_upstream
    updates: list[str] = []
    heard = anyio.Event()

    async def on_message(message) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            updates.append(str(message.params.uri))
            if str(message.params.uri) == "fixture://motd":
                heard.set()

    async with client_of(gw, transport=RoundRobin(ports), tool="old.touch", message_handler=on_message) as client:
        await client.subscribe_resource("fixture://motd")
        touched = await client.call_tool("old.touch", {"uri": "fixture://items/1"})  # not subscribed to
        for _ in range(20):  # the GET stream may open after the first touch: touch until one is heard
            await client.call_tool("old.touch", {"uri": "fixture://motd"})
            with anyio.move_on_after(0.5):
                await heard.wait()
                break
        await client.unsubscribe_resource("fixture://motd")
        heard_before = len(updates)
        after = await client.call_tool("old.touch", {"uri": "fixture://motd"})
        await anyio.sleep(1)  # an absence: give a stray update the time it took the first to arrive, and more
    assert touched.structured_content == {"subscribed": ["fixture://motd"]}  # forwarded to the upstream
    assert after.structured_content == {"subscribed": ["fixture://motd"]}  # kept there: other callers may need it
    assert heard.is_set() and set(updates) == {"fixture://motd"}
    assert len(updates) == heard_before  # this session no longer hears it


async def test_resource_updates_cross_neither_sessions_nor_tenants(legacy_upstream: tuple[Gateway, list[int]]) -> None:
    gw, ports = legacy_upstream
    heard: dict[str, list[str]] = {"alice": [], "other-session": [], "other-tenant": []}

    def listener(who: str):
        async def on_message(message) -> None:
            if isinstance(message, types.ResourceUpdatedNotification):
                heard[who].append(str(message.params.uri))
        return on_message

    async def until_heard(client: Client, who: str, uri: str) -> None:
        """Touch `uri` until `who` hears it: its GET stream is open from then on."""
        for _ in range(40):
            await client.call_tool("old.touch", {"uri": uri})
            await anyio.sleep(0.25)
            if uri in heard[who]:
                return
        raise AssertionError(f"{who} never heard {uri}")

    globex = issue_token(gw.settings, subject="agent-1", tenant_id="globex", scopes=["tools:*"])
    async with (client_of(gw, transport=RoundRobin(ports), tool="old.touch", message_handler=listener("alice")) as alice,
                client_of(gw, transport=RoundRobin(ports), tool="old.touch",
                          message_handler=listener("other-session")) as same_caller,
                client_of(gw, transport=RoundRobin(ports), tool="old.touch", token=globex,
                          message_handler=listener("other-tenant")) as other_tenant):
        for who, client, uri in (("alice", alice, "fixture://motd"), ("other-session", same_caller, "fixture://items/2"),
                                 ("other-tenant", other_tenant, "fixture://items/3")):
            await client.subscribe_resource(uri)
            await until_heard(client, who, uri)
        for _ in range(3):
            await alice.call_tool("old.touch", {"uri": "fixture://motd"})
        await anyio.sleep(1)  # an absence: more than any update above took to arrive
    assert set(heard["alice"]) == {"fixture://motd"}
    assert set(heard["other-session"]) == {"fixture://items/2"}  # the same caller's other session: not its URI
    assert set(heard["other-tenant"]) == {"fixture://items/3"}


def test_ca_and_certificate(folder: Path) -> tuple[Path, Path, Path]:
    """A CA of the test's own and a certificate it signs for 127.0.0.1: (CA file, certificate, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def issued(subject: str, key, issuer: x509.Name, signer, *, ca: bool) -> x509.Certificate:
        builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(issuer).public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]), critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = issued("mnemesh test CA", ca_key, x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mnemesh test CA")]),
                ca_key, ca=True)
    certificate = issued("127.0.0.1", key, ca.subject, ca_key, ca=False)
    files = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    files[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files[1].write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    files[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return files


test_ca_and_certificate.__test__ = False  # a helper, not a test


@pytest.fixture
async def tls_upstream(redis_url: str, database_url: str, tmp_path) -> AsyncIterator[tuple[Gateway, list[int]]]:
    """Two gateway processes federating the upstream over https://, trusting the test CA (SSL_CERT_FILE)."""
    ca, certificate, key = test_ca_and_certificate(tmp_path)
    port = free_port()
    upstream = subprocess.Popen([sys.executable, FIXTURE, "https", str(port), str(certificate), str(key)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"https://127.0.0.1:{port}/mcp"
    try:
        await wait_answers(url, verify=ssl.create_default_context(cafile=str(ca)))
        async with gateways_federating(redis_url, database_url, tmp_path, {"name": "secure", "url": url,
                                                                           "prefix": "tls"}, SSL_CERT_FILE=str(ca)) as two:
            yield two
    finally:
        upstream.terminate()
        upstream.wait(10)


async def test_a_tls_upstream_is_called_lean_and_relays_sampling_elicitation_and_logs(
    tls_upstream: tuple[Gateway, list[int]]
) -> None:
    gw, ports = tls_upstream
    balancer = AnswersElsewhere(ports)
    logged: list[str] = []

    async def elicit(context, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"name": "Ada"})

    async def log(params: types.LoggingMessageNotificationParams) -> None:
        logged.append(str(params.data))

    async with client_of(gw, transport=balancer, tool="tls.ask_llm", sampling_callback=sample,
                         elicitation_callback=elicit, logging_callback=log) as client:
        echoed = await client.call_tool("tls.echo", {"text": "over tls", "times": 2})
        sampled = await client.call_tool("tls.ask_llm", {"prompt": "secure"})
        asked = await client.call_tool("tls.ask_user", {"question": "Who?"})
        chatty = await client.call_tool("tls.chatty", {})
    assert echoed.structured_content == {"echo": "over tls over tls"}
    assert sampled.structured_content == {"said": "you said secure", "model": "test-model"}
    assert asked.structured_content == {"action": "accept", "name": "Ada"}
    assert chatty.structured_content == {"done": True}
    assert logged == ["chatty: debug", "chatty: info", "chatty: warning"]  # relayed off the upstream's stream
    assert len(balancer.answers) == 2 and all(call != answer for call, answer in balancer.answers)

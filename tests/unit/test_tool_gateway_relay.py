"""Relaying to the calling client, with fakes: the session id's capability flags, the answer routing by
key (another caller's answer reaches nothing), the timeout, the log level filter, and the lean upstream
caller handing an upstream's request mid-call (2025-era) to the relay and POSTing the answer back."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import httpx2
import pytest
from gateway_fakes import fake_ports

from libs.auth import Principal, TokenVerifier, issue_token
from libs.config import Settings
from services.tool_gateway.adapters.upstream_http import CallerAsked, LeanHttpCaller, SessionTracker, _OneCall
from services.tool_gateway.entrypoints.mcp_server import http_app
from services.tool_gateway.entrypoints.mcp_relay import ClientRelay, LocalLogLevels, RelayAnswers, level_key
from services.tool_gateway.entrypoints.mcp_sessions import cancel_key, capabilities_of_session, session_for
from services.tool_gateway.service_layer.call_context import RelayRefused

ALICE = Principal(subject="alice", tenant_id="acme", scopes=frozenset({"tools:*"}))
BOB = Principal(subject="bob", tenant_id="acme", scopes=frozenset({"tools:*"}))


def test_the_session_id_carries_the_declared_capabilities() -> None:
    both = session_for({"sampling": {}, "elicitation": {"form": {}}, "roots": {}})
    assert capabilities_of_session(both) == {"sampling": {}, "elicitation": {"form": {}}}
    assert capabilities_of_session(session_for({"elicitation": {}})) == {"elicitation": {"form": {}}}
    plain = session_for({})
    assert "-" not in plain and capabilities_of_session(plain) == {}
    assert session_for({"sampling": {}}) != session_for({"sampling": {}})


def relay_of(principal: Principal, session: str, answers: RelayAnswers, *, timeout: float = 5.0,
             levels: LocalLogLevels | None = None) -> tuple[ClientRelay, list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []

    async def emit(payload: dict[str, Any]) -> None:
        sent.append(payload)

    return ClientRelay(emit, answers, principal, session, levels or LocalLogLevels(), timeout), sent


async def test_only_the_asking_callers_answer_reaches_the_waiting_request() -> None:
    answers = RelayAnswers()
    session = session_for({"sampling": {}})
    relay, sent = relay_of(ALICE, session, answers)
    asking = asyncio.create_task(relay.ask("sampling/createMessage", {"maxTokens": 5}))
    while not sent:
        await asyncio.sleep(0.01)
    request = sent[0]
    assert request["method"] == "sampling/createMessage" and request["id"].startswith("mnemesh-relay-")
    await answers.publish(cancel_key(BOB, session, request["id"]), {"result": {"model": "bob's"}})
    await answers.publish(cancel_key(ALICE, "another-session", request["id"]), {"result": {"model": "other"}})
    await asyncio.sleep(0)  # a matching answer would have resolved it by now: delivery here is synchronous
    assert not asking.done()
    await answers.publish(cancel_key(ALICE, session, request["id"]), {"result": {"model": "alice's"}})
    assert await asking == {"model": "alice's"}


async def test_an_unanswered_request_times_out_and_an_error_answer_is_refused() -> None:
    answers = RelayAnswers()
    session = session_for({"elicitation": {}})
    relay, sent = relay_of(ALICE, session, answers, timeout=0.1)
    with pytest.raises(RelayRefused) as late:
        await relay.ask("elicitation/create", {"message": "?"})
    assert late.value.code == -32001
    relay, sent = relay_of(ALICE, session, answers)
    asking = asyncio.create_task(relay.ask("elicitation/create", {"message": "?"}))
    while not sent:
        await asyncio.sleep(0.01)
    await answers.publish(cancel_key(ALICE, session, sent[0]["id"]), {"error": {"code": -1, "message": "no"}})
    with pytest.raises(RelayRefused) as refused:
        await asking
    assert (refused.value.code, refused.value.message) == (-1, "no")


async def test_a_request_that_ends_unanswered_is_withdrawn_from_the_client() -> None:
    answers = RelayAnswers()
    session = session_for({"sampling": {}})
    relay, sent = relay_of(ALICE, session, answers, timeout=0.05)
    with pytest.raises(RelayRefused):
        await relay.ask("sampling/createMessage", {})
    assert [m.get("method") for m in sent] == ["sampling/createMessage", "notifications/cancelled"]
    assert sent[1]["params"]["requestId"] == sent[0]["id"] and "did not answer" in sent[1]["params"]["reason"]
    relay, sent = relay_of(ALICE, session, answers)
    asking = asyncio.create_task(relay.ask("sampling/createMessage", {}))
    while not sent:
        await asyncio.sleep(0.01)
    asking.cancel()  # the call ended
    with pytest.raises(asyncio.CancelledError):
        await asking
    assert sent[-1]["method"] == "notifications/cancelled" and sent[-1]["params"]["requestId"] == sent[0]["id"]
    relay, sent = relay_of(ALICE, session, answers)
    asking = asyncio.create_task(relay.ask("sampling/createMessage", {}))
    while not sent:
        await asyncio.sleep(0.01)
    await answers.publish(cancel_key(ALICE, session, sent[0]["id"]), {"result": {}})
    await asking
    assert len(sent) == 1  # answered: nothing to withdraw


async def test_a_client_without_the_capability_is_never_asked() -> None:
    relay, sent = relay_of(ALICE, session_for({"elicitation": {}}), RelayAnswers())
    with pytest.raises(RelayRefused) as refused:
        await relay.ask("sampling/createMessage", {})
    assert refused.value.code == -32021 and "sampling" in refused.value.message and not sent


async def test_log_messages_below_the_sessions_level_are_dropped() -> None:
    levels = LocalLogLevels()
    session = session_for({})
    await levels.set(level_key(ALICE, session), "warning")
    relay, sent = relay_of(ALICE, session, RelayAnswers(), levels=levels)
    for level in ("debug", "info", "warning", "error"):
        await relay.log({"level": level, "data": level})
    assert [m["params"]["level"] for m in sent] == ["warning", "error"]
    relay, sent = relay_of(BOB, session, RelayAnswers(), levels=levels)  # another caller: its own level (none)
    await relay.log({"level": "debug", "data": "x"})
    assert len(sent) == 1


class _Response:
    async def read(self) -> bytes:
        return b""


class _Pool:
    def __init__(self) -> None:
        self.posted: list[dict[str, Any]] = []

    @contextlib.asynccontextmanager
    async def post(self, body: bytes, headers: dict[str, str]):
        self.posted.append(json.loads(body))
        yield _Response()


class _Relay:
    capabilities = {"sampling": {}}

    def __init__(self) -> None:
        self.logged: list[dict[str, Any]] = []

    async def log(self, params: dict[str, Any]) -> None:
        self.logged.append(params)

    async def ask(self, method: str, params: dict[str, Any], *, within: float | None = None) -> dict[str, Any]:
        if method == "elicitation/create" and params.get("broken"):
            raise RuntimeError("the relay broke")
        if method != "sampling/createMessage":
            raise RelayRefused(-32021, "not declared")
        return {"model": "m", "role": "assistant", "content": {"type": "text", "text": "hi"}}


async def test_the_lean_caller_relays_an_upstreams_requests_and_log_messages_mid_call() -> None:
    pool = _Pool()
    lean = LeanHttpCaller(pool, "2025-11-25", SessionTracker(), client_info={"name": "gw", "version": "0"})  # type: ignore[arg-type]
    relay = _Relay()
    call = _OneCall("gw-1", relay, None)
    assert await lean._take({"jsonrpc": "2.0", "method": "notifications/message",
                             "params": {"level": "info", "data": "working"}}, call) is None
    await lean._take({"jsonrpc": "2.0", "id": 7, "method": "sampling/createMessage", "params": {}}, call)
    await lean._take({"jsonrpc": "2.0", "id": 8, "method": "elicitation/create", "params": {}}, call)
    await asyncio.gather(*call.asking)
    assert relay.logged == [{"level": "info", "data": "working"}]
    assert {m["id"]: m.get("result", m.get("error")) for m in pool.posted} == {
        7: {"model": "m", "role": "assistant", "content": {"type": "text", "text": "hi"}},
        8: {"code": -32021, "message": "not declared"}}
    alone = _OneCall("gw-2", None, None)  # a call nobody can be asked for: -32021, not "method not found"
    await lean._take({"jsonrpc": "2.0", "id": 9, "method": "sampling/createMessage", "params": {}}, alone)
    await asyncio.gather(*lean._background)
    assert pool.posted[-1]["id"] == 9 and pool.posted[-1]["error"]["code"] == -32021
    assert await lean._take({"jsonrpc": "2.0", "id": "gw-2", "result": {"content": []}}, alone) == {"content": []}


async def test_a_relayed_request_waits_no_longer_than_the_calls_deadline_allows() -> None:
    session = session_for({"sampling": {}})
    relay, sent = relay_of(ALICE, session, RelayAnswers(), timeout=120)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(RelayRefused) as late:
        await relay.ask("sampling/createMessage", {}, within=0.1)
    assert late.value.code == -32001 and loop.time() - started < 5 and len(sent) == 2  # asked, then withdrawn
    with pytest.raises(RelayRefused):  # no time left: the client is not even asked
        await relay.ask("sampling/createMessage", {}, within=0)
    assert len(sent) == 2
    asked = CallerAsked(loop.time() + 30)
    assert 27 < asked.within() < 28.1  # what is left, less the upstream's margin (2 s)
    assert CallerAsked(loop.time() + 1).within() < 0.8 and CallerAsked().within() is None


async def test_a_refusal_a_decline_or_a_broken_relay_is_noted_and_the_upstream_always_answered() -> None:
    pool = _Pool()
    lean = LeanHttpCaller(pool, "2025-11-25", SessionTracker(), client_info={"name": "gw", "version": "0"})  # type: ignore[arg-type]
    sampled = _OneCall("gw-1", _Relay(), None)
    await lean._take({"jsonrpc": "2.0", "id": 1, "method": "sampling/createMessage", "params": {}}, sampled)
    await asyncio.gather(*sampled.asking)
    assert not sampled.asked.refused  # answered: the call's outcome is the upstream's
    broken = _OneCall("gw-2", _Relay(), None)
    await lean._take({"jsonrpc": "2.0", "id": 2, "method": "elicitation/create", "params": {"broken": 1}}, broken)
    await asyncio.gather(*broken.asking)
    assert pool.posted[-1] == {"jsonrpc": "2.0", "id": 2, "error": {
        "code": -32603, "message": "the gateway could not relay the request"}}
    refused = _OneCall("gw-3", _Relay(), None)
    await lean._take({"jsonrpc": "2.0", "id": 3, "method": "elicitation/create", "params": {}}, refused)
    await asyncio.gather(*refused.asking)
    assert refused.asked.refused and pool.posted[-1]["error"]["code"] == -32021
    alone = _OneCall("gw-4", None, None)
    await lean._take({"jsonrpc": "2.0", "id": 4, "method": "sampling/createMessage", "params": {}}, alone)
    assert alone.asked.refused


async def test_a_call_that_ends_mid_relay_drops_the_waiting_entry_and_answers_the_upstream() -> None:
    pool, answers = _Pool(), RelayAnswers()
    lean = LeanHttpCaller(pool, "2025-11-25", SessionTracker(), client_info={"name": "gw", "version": "0"})  # type: ignore[arg-type]
    relay, sent = relay_of(ALICE, session_for({"elicitation": {}}), answers)
    call = _OneCall("gw-1", relay, None)
    await lean._take({"jsonrpc": "2.0", "id": 5, "method": "elicitation/create", "params": {"message": "?"}}, call)
    while not sent:
        await asyncio.sleep(0.01)
    assert answers._waiting
    for task in call.asking:  # what _call_once does when the call ends (its client disconnected)
        task.cancel()
    await asyncio.gather(*call.asking, return_exceptions=True)
    await asyncio.gather(*lean._background)
    assert not answers._waiting
    assert pool.posted == [{"jsonrpc": "2.0", "id": 5, "error": {
        "code": -32603, "message": "the call ended before the calling client answered"}}]
    assert sent[-1]["method"] == "notifications/cancelled"


async def test_an_elicitation_the_user_declined_is_noted_as_refused() -> None:
    class Declining(_Relay):
        async def ask(self, method, params, *, within=None):
            return {"action": "decline"}

    asked = CallerAsked()
    assert await asked.ask(Declining(), "elicitation/create", {}) == {"action": "decline"} and asked.refused
    accepted = CallerAsked()
    await accepted.ask(_Relay(), "sampling/createMessage", {})
    assert not accepted.refused


# --- the whole HTTP app in process ---------------------------------------------------------------------------

SETTINGS = Settings(jwt_secret="unit-test-secret-0123456789abcdef0123")
ALICE_HTTP = Principal(subject="alice", tenant_id="acme", scopes=frozenset({"tools:*"}))  # gateway_http's caller


@contextlib.asynccontextmanager
async def gateway_http(**kwargs):
    """The gateway's MCP HTTP app in process (its lifespan started), and a token for a caller of tenant acme."""
    app = http_app(fake_ports(), TokenVerifier(SETTINGS), **kwargs)
    events: asyncio.Queue = asyncio.Queue()
    await events.put({"type": "lifespan.startup"})
    started = asyncio.Event()

    async def lifespan_send(message) -> None:
        if message["type"] == "lifespan.startup.complete":
            started.set()

    lifespan = asyncio.create_task(app({"type": "lifespan", "state": {}}, events.get, lifespan_send))
    await started.wait()
    token = issue_token(SETTINGS, subject="alice", tenant_id="acme", scopes=["tools:*"])
    try:
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://127.0.0.1:8765",
                                      headers={"Authorization": f"Bearer {token}",
                                               "Accept": "application/json, text/event-stream"}) as http:
            yield http
    finally:
        await events.put({"type": "lifespan.shutdown"})
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(lifespan, 5)


async def test_initialize_with_params_that_are_not_an_object_is_answered_invalid_params() -> None:
    async with gateway_http() as http:
        for params in ("x", [1], 5):
            reply = await http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params})
            assert reply.status_code == 400 and reply.json()["error"]["code"] == -32602, reply.text
        cancel = await http.post("/mcp", headers={"Mcp-Session-Id": "s1"},
                                 json={"jsonrpc": "2.0", "method": "notifications/cancelled", "params": 5})
        assert cancel.status_code < 500


async def test_an_answer_post_passes_the_sdks_checks_first_and_only_a_relay_id_is_taken_for_one() -> None:
    answers = RelayAnswers()
    relay_id = f"mnemesh-relay-{'a' * 32}"
    with answers.waiting(cancel_key(ALICE_HTTP, "s1", relay_id)) as waiting:
        async with gateway_http(answers=answers) as http:
            answer = {"jsonrpc": "2.0", "id": relay_id, "result": {"action": "accept"}}
            session = {"Mcp-Session-Id": "s1"}
            foreign = await http.post("/mcp", json=answer, headers={**session, "Origin": "https://evil.example"})
            rebound = await http.post("/mcp", json=answer, headers={**session, "Host": "evil.example"})
            plain = await http.post("/mcp", content=json.dumps(answer), headers={**session, "Content-Type": "text/plain"})
            big = await http.post("/mcp", json={**answer, "result": {"text": "x" * 5_000_000}}, headers=session)
            assert (foreign.status_code, rebound.status_code, plain.status_code, big.status_code) == (403, 421, 400, 413)
            assert not waiting.done()
            for other in ("mnemesh-relay-x", f"mnemesh-relay-{'a' * 32}-more", f"MNEMESH-RELAY-{'a' * 32}"):
                await http.post("/mcp", json={**answer, "id": other}, headers=session)  # the SDK's to answer
            assert not waiting.done()
            taken = await http.post("/mcp", json=answer, headers=session)
            assert taken.status_code == 202 and waiting.result() == {"result": {"action": "accept"}}

"""The orchestrator as an A2A agent: its card at the well-known path (validated with the a2a-sdk's types), a
call through the a2a-sdk client, and agent-to-agent delegation with an expected outcome and compensation.

The callee is the real A2A entry point over HTTP in front of the real session store (PostgreSQL); the
caller records its delegation steps in its own session in the same store."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import httpx
import pytest
from a2a.client import A2ACardResolver
from a2a.client.card_resolver import parse_agent_card
from a2a.types.a2a_pb2 import AgentCard

from libs.auth import TokenVerifier, issue_token
from libs.config import Settings, load_settings
from libs.db import Database
from libs.eventstore import EventStore
from libs.http import serve_asgi
from libs.outbox import Outbox
from libs.snapshots import SnapshotStore
from mnemesh.infra import free_port
from services.orchestrator.adapters.a2a_client import A2AAgents
from services.orchestrator.adapters.local import LocalMemory, LocalTools
from services.orchestrator.adapters.repository import EventSourcedSessions
from services.orchestrator.adapters.rules_file import RulesFile
from services.orchestrator.domain.rulebook import parse_rulebook
from services.orchestrator.domain import (
    CompensationFinished,
    State,
    DelegationAnswered,
    DelegationChecked,
    DelegationStarted,
    TaskEnded,
)
from services.orchestrator.entrypoints import a2a
from services.orchestrator.service_layer.agent import Agent
from services.orchestrator.service_layer.delegation import (
    DEPTH_KEY,
    MAX_DEPTH,
    Compensation,
    Delegate,
    Expectation,
    OutcomeRecorder,
    delegate,
)
from services.orchestrator.service_layer.handlers import SendMessage, send_message

pytestmark = pytest.mark.integration


@dataclass
class Callee:
    base_url: str
    settings: Settings
    sessions: EventSourcedSessions
    memory: LocalMemory

    def issue(self, tenant_id: str, scopes: list[str]) -> str:
        return issue_token(self.settings, subject="agent:caller", tenant_id=tenant_id, scopes=scopes)


@pytest.fixture
async def callee(db: Database) -> AsyncIterator[Callee]:
    settings = load_settings(jwt_secret="a2a-test-secret-0123456789abcdef0123")
    sessions = EventSourcedSessions(db, EventStore(db, stream_poll_seconds=1.0), Outbox(db), SnapshotStore(100))
    memory = LocalMemory()
    agent = Agent(sessions, RulesFile(), memory, LocalTools(), memory)
    port = free_port()
    app = a2a.http_app(lambda cmd: send_message(cmd, sessions, agent), OutcomeRecorder(memory),
                       TokenVerifier(settings), f"http://127.0.0.1:{port}{a2a.A2A_PATH}", "9.9.9")
    server = asyncio.create_task(serve_asgi(app, host="127.0.0.1", port=port, port_setting="test"))
    base = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient() as http:
        with anyio.fail_after(20):
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get(f"{base}/.well-known/agent-card.json")).status_code == 200:
                        break
                await anyio.sleep(0.05)
    yield Callee(base, settings, sessions, memory)
    server.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await server


async def test_the_agent_card_is_served_at_the_well_known_path_and_valid_for_the_a2a_sdk(callee: Callee) -> None:
    async with httpx.AsyncClient() as http:
        card = await A2ACardResolver(http, callee.base_url).get_agent_card()
        raw = (await http.get(f"{callee.base_url}/.well-known/agent-card.json")).json()
    assert isinstance(card, AgentCard) and card.name == "Mnemesh orchestrator" and card.version == "9.9.9"
    assert parse_agent_card(raw) == card
    [interface] = card.supported_interfaces
    assert (interface.url, interface.protocol_binding) == (f"{callee.base_url}/a2a", "JSONRPC")
    assert card.security_schemes["bearer"].http_auth_security_scheme.bearer_format == "JWT"
    assert [s.id for s in card.skills] == ["customer-service"]


async def test_an_a2a_client_calls_the_orchestrator_and_gets_the_turns_grounded_reply(callee: Callee) -> None:
    answer = await A2AAgents(callee.issue).send(callee.base_url, "acme", "ctx-1", "Where is my order A12345?", {})
    assert answer.reply.startswith("Order A12345 is shipped")
    assert answer.metadata["mnemesh.session_id"] == "a2a:ctx-1" and answer.metadata["mnemesh.state"] == "IDLE"
    session = await callee.sessions.load("acme", "a2a:ctx-1")
    assert [m.device_id for m in session.messages if m.role == "user"] == ["a2a:agent:caller"]


async def test_a_message_without_text_or_with_a_bad_context_is_refused_with_the_reason(callee: Callee) -> None:
    agents = A2AAgents(callee.issue)
    with pytest.raises(ValueError, match="refused: message.parts: send at least one text part"):
        await agents.send(callee.base_url, "acme", "ctx-2", "   ", {})
    with pytest.raises(ValueError, match="refused: session_id"):
        await agents.send(callee.base_url, "acme", "bad/context", "hello", {})


async def test_a_call_without_a_valid_token_or_scope_is_refused(callee: Callee) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {}}
    async with httpx.AsyncClient() as http:
        anonymous = await http.post(f"{callee.base_url}/a2a", json=body)
        reader = await http.post(f"{callee.base_url}/a2a", json=body, headers={
            "Authorization": f"Bearer {callee.issue('acme', ['sessions:read'])}"})
    assert anonymous.status_code == 401 and anonymous.json()["field"] == "authorization"
    assert reader.status_code == 403 and "sessions:write" in reader.json()["reason"]


async def delegated(callee: Callee, expected: Expectation, caller_session: str):
    tools = LocalTools()

    async def cancel_order(args: dict) -> dict:
        return {"cancelled": args["order_id"], "status": "cancelled"}
    tools.handlers["orders.cancel"] = cancel_order
    caller_memory = LocalMemory()
    result = await delegate(
        Delegate("acme", "u1", caller_session, callee.base_url, "Where is my order A12345?", expected,
                 Compensation("orders.cancel", {"order_id": "A12345"})),
        callee.sessions, caller_memory, A2AAgents(callee.issue), tools)
    events = [e.event for e in await callee.sessions.history("acme", caller_session)]
    return result, events, tools, caller_memory


async def test_a_delegation_whose_outcome_matches_the_expectation_runs_no_compensation(callee: Callee) -> None:
    result, events, tools, memory = await delegated(callee, Expectation("IDLE", ("shipped",)), "caller-1")
    assert result.matched and tools.calls == []
    started, answered, checked = events
    assert isinstance(started, DelegationStarted) and started.expected_memory_id in memory.outcomes
    assert isinstance(answered, DelegationAnswered) and answered.reply.startswith("Order A12345 is shipped")
    actual = callee.memory.outcomes[answered.actual_memory_id]  # the callee recorded it, linked to the expectation
    assert actual["derived_from"] == (started.expected_memory_id,) and '"state": "IDLE"' in actual["content"]
    assert isinstance(checked, DelegationChecked) and checked.matched


async def test_a_mismatched_outcome_runs_the_declared_compensation_each_step_an_event(callee: Callee) -> None:
    result, events, tools, _ = await delegated(callee, Expectation("IDLE", ("delivered",)), "caller-2")
    assert not result.matched and result.compensated == "ok"
    assert [type(e) for e in events] == [DelegationStarted, DelegationAnswered, DelegationChecked,
                                         CompensationFinished]
    assert not events[2].matched and "'delivered'" in events[2].reason
    assert tools.calls == [("orders.cancel", {"order_id": "A12345"}, f"{result.delegation_id}:compensation")]
    assert json.loads(events[3].result_json) == {"cancelled": "A12345", "status": "cancelled"}


async def test_an_agent_that_does_not_answer_is_compensated_too(callee: Callee) -> None:
    dead = Callee(f"http://127.0.0.1:{free_port()}", callee.settings, callee.sessions, callee.memory)
    result, events, tools, _ = await delegated(dead, Expectation(), "caller-3")
    assert not result.matched and "did not answer" in result.reasons[0]
    assert [type(e) for e in events] == [DelegationStarted, DelegationAnswered, DelegationChecked,
                                         CompensationFinished]
    assert len(tools.calls) == 1


async def test_a_message_deeper_than_the_delegation_limit_is_refused(callee: Callee) -> None:
    agents = A2AAgents(callee.issue)
    answer = await agents.send(callee.base_url, "acme", "deep-3", "hello", {DEPTH_KEY: MAX_DEPTH})
    assert answer.reply.startswith("Hello!")
    with pytest.raises(ValueError, match=f"this message is {MAX_DEPTH + 1} delegations deep"):
        await agents.send(callee.base_url, "acme", "deep-4", "hello", {DEPTH_KEY: MAX_DEPTH + 1})
    with pytest.raises(ValueError, match="must be a whole number of delegations"):
        await agents.send(callee.base_url, "acme", "deep-x", "hello", {DEPTH_KEY: "deep"})


async def test_an_agent_whose_rules_delegate_to_itself_stops_at_the_depth_limit(db: Database) -> None:
    """A rules mistake: every message is delegated to the same agent, which delegates it again. The chain is cut
    at the depth limit, each level compensates, and the user's turn ends (with a person, as nothing delivered)."""
    settings = load_settings(jwt_secret="a2a-test-secret-0123456789abcdef0123")
    port = free_port()
    book = parse_rulebook(f"""
agents:
  me:
    url: http://127.0.0.1:{port}
    text: "{{message}}"
    expect: {{state: PAUSED}}
    compensation: {{tool: orders.cancel, arguments: {{order_id: A1}}}}
rules:
  - {{name: loop, action: delegate, agent: me, keywords: [loop]}}
""")
    sessions = EventSourcedSessions(db, EventStore(db, stream_poll_seconds=1.0), Outbox(db), SnapshotStore(100))
    memory, tools = LocalMemory(), LocalTools()

    async def cancel(args: dict) -> dict:
        return {"status": "cancelled"}
    tools.handlers["orders.cancel"] = cancel

    def issue(tenant_id: str, scopes: list[str]) -> str:
        return issue_token(settings, subject="agent:me", tenant_id=tenant_id, scopes=scopes)
    agent = Agent(sessions, lambda: book, memory, tools, memory, agents=A2AAgents(issue))
    app = a2a.http_app(lambda cmd: send_message(cmd, sessions, agent), OutcomeRecorder(memory),
                       TokenVerifier(settings), f"http://127.0.0.1:{port}{a2a.A2A_PATH}", "9.9.9")
    server = asyncio.create_task(serve_asgi(app, host="127.0.0.1", port=port, port_setting="test"))
    try:
        with anyio.fail_after(60):
            session = await send_message(SendMessage("acme", "u1", "user-loop", "web", "loop please"), sessions, agent)
        events = [v.event for v in await sessions.history("acme", "user-loop")]
        [checked] = [e for e in events if isinstance(e, DelegationChecked)]
        assert session.state == State.IDLE and not checked.matched and "expected PAUSED" in checked.reason
        assert [e.outcome for e in events if isinstance(e, TaskEnded)] == ["compensated"]
        # Four levels compensated: the user's turn (depth 0) and three delegated ones, the deepest because its own
        # delegation (depth 4) was refused; nothing went further.
        assert len(tools.calls) == MAX_DEPTH + 1
        # The deepest level's recorded outcome carries the refusal: its own delegation was 4 deep.
        refused = [a for a in memory.outcomes.values() if "actual outcome" in a["content"]
                   and f"this message is {MAX_DEPTH + 1} delegations deep" in a["content"]]
        assert len(refused) == 1
    finally:
        server.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await server

"""A delegation stays within the turn lease: the agent's answer is bounded by a setting the lease check counts
(with the compensation's deadline), and a runner whose turn was taken over stops recording."""

from __future__ import annotations

import asyncio

import anyio
import pytest
from fakes import FakeSessionRepository
from test_orchestrator_delegation import loop_world, say

from services.orchestrator.adapters.local import LocalMemory, LocalTools
from services.orchestrator.domain import (
    CompensationFinished,
    DelegationAnswered,
    DelegationChecked,
    State,
    TaskEnded,
    TurnRecovered,
)
from services.orchestrator.domain.rulebook import parse_rulebook
from services.orchestrator.service_layer.agent import Agent
from services.orchestrator.service_layer.delegation import AgentAnswer
from services.orchestrator.settings import OrchestratorSettings


def test_the_lease_must_outlast_the_agents_answer_plus_the_compensation() -> None:
    with pytest.raises(ValueError, match="A2A_TIMEOUT_SECONDS"):
        OrchestratorSettings(turn_lease_seconds=40, tool_deadline_seconds=10, verify_seconds=5, a2a_timeout_seconds=30)
    ok = OrchestratorSettings(turn_lease_seconds=42, tool_deadline_seconds=10, verify_seconds=5, a2a_timeout_seconds=30)
    assert ok.a2a_timeout_seconds == 30


def test_an_agent_that_delegates_refuses_a_lease_a_delegation_would_outlast() -> None:
    book = parse_rulebook("rules: []\n")
    with pytest.raises(ValueError, match="delegation_seconds"):
        Agent(FakeSessionRepository(), lambda: book, LocalMemory(), LocalTools(), LocalMemory(),
              tool_deadline_seconds=10, lease_seconds=35, delegation_seconds=30, agents=object())


async def test_an_agent_that_never_answers_is_given_up_on_after_its_timeout_and_compensated() -> None:
    agent, sessions, tools, agents = loop_world(AgentAnswer("never sent"))
    agent.delegation_seconds = 0.2

    async def hangs(agent_url, tenant_id, context_id, text, metadata):
        await asyncio.Event().wait()
    agents.send = hangs

    with anyio.fail_after(5):
        session, events = await say(agent, sessions, "ask the order desk: where is A12345?")

    [answered] = [e for e in events if isinstance(e, DelegationAnswered)]
    assert answered.reason == "the agent did not answer within 0.2 s"
    assert [c[0] for c in tools.calls] == ["orders.cancel"] and session.state == State.IDLE


async def test_a_runner_whose_turn_was_taken_over_stops_recording_and_compensates_nothing() -> None:
    agent, sessions, tools, agents = loop_world(AgentAnswer("never sent"))

    async def slow_while_taken_over(agent_url, tenant_id, context_id, text, metadata):
        # While the agent works, this runner's lease runs out and another runner takes the turn over.
        await sessions.update("acme", "s1", lambda s: [TurnRecovered(s.task.task_id, State.ROUTING, 61.0,
                                                                     "the turn had not moved")])
        return AgentAnswer("I could not find it.", {"mnemesh.state": "IDLE", "mnemesh.actual_memory_id": "a-1"})
    agents.send = slow_while_taken_over

    with anyio.fail_after(5):
        _, events = await say(agent, sessions, "ask the order desk: where is A12345?")

    after = events[[i for i, e in enumerate(events) if isinstance(e, TurnRecovered)][0] + 1:]
    assert after == []  # nothing appended by the runner that lost its lease...
    assert not any(isinstance(e, DelegationAnswered | DelegationChecked | CompensationFinished | TaskEnded)
                   for e in events)
    assert tools.calls == []  # ...and no compensation run behind the new runner's back
    session = await sessions.load("acme", "s1")
    assert session.state == State.ROUTING and session.task.recoveries == 1


# --- one helper races a call against the session (tool calls and delegations alike) -------------------------


async def test_until_stopped_returns_the_result_or_none_and_cancels_what_lost_the_race() -> None:
    from services.orchestrator.service_layer import agent as agent_module
    from services.orchestrator.service_layer import delegation as delegation_module
    from services.orchestrator.service_layer.delegation import until_stopped

    async def answers():
        return "done"

    never = asyncio.Event()
    cancelled = []

    async def hangs():
        try:
            await never.wait()
        except asyncio.CancelledError:
            cancelled.append("call")
            raise

    async def stops():
        return None

    assert await until_stopped(answers(), None) == "done"
    assert await until_stopped(answers(), hangs) == "done" and cancelled == ["call"]  # the watcher is cancelled
    with anyio.fail_after(5):
        assert await until_stopped(hangs(), stops) is None
    assert cancelled == ["call", "call"]  # the call is cancelled
    # The one helper: neither the agent nor the delegation keeps a copy of its own.
    assert not hasattr(agent_module.Agent, "_cancellable") and not hasattr(delegation_module, "_unless_stopped")

"""Agent-to-agent delegation over fakes: what the caller checks, and that refusals say what is wrong."""

from __future__ import annotations

import pytest
from fakes import FakeSessionRepository

from libs.errors import ValidationFailed
from services.orchestrator.adapters.local import LocalMemory, LocalTools
from services.orchestrator.domain import CompensationFinished, DelegationChecked
from services.orchestrator.service_layer.delegation import (
    AgentAnswer,
    Compensation,
    Delegate,
    Expectation,
    delegate,
)


class ScriptedAgent:
    def __init__(self, answer: AgentAnswer) -> None:
        self.answer, self.sent = answer, []

    async def send(self, agent, tenant_id, context_id, text, metadata) -> AgentAnswer:
        self.sent.append(metadata)
        return self.answer


def a_delegation(**changes) -> Delegate:
    fields = {"tenant_id": "acme", "user_id": "u1", "session_id": "s1", "agent": "http://agent.example",
              "text": "book it", "expected": Expectation("IDLE", ("booked",)),
              "compensation": Compensation("orders.cancel", {"order_id": "A1"}), **changes}
    return Delegate(**fields)


async def run(answer: AgentAnswer, **changes):
    sessions, memory, tools = FakeSessionRepository(), LocalMemory(), LocalTools()

    async def cancel(args: dict) -> dict:
        return {"status": "cancelled"}
    tools.handlers["orders.cancel"] = cancel
    agent = ScriptedAgent(answer)
    result = await delegate(a_delegation(**changes), sessions, memory, agent, tools)
    return result, [e.event for e in await sessions.history("acme", "s1")], agent, memory


async def test_the_expected_outcome_is_recorded_before_the_call_and_its_id_sent_along() -> None:
    result, events, agent, memory = await run(AgentAnswer("booked for you", {"mnemesh.state": "IDLE",
                                                                              "mnemesh.actual_memory_id": "a-1"}))
    assert result.matched and result.compensated == ""
    [expected_id] = memory.outcomes
    assert agent.sent == [{"mnemesh.expected_memory_id": expected_id}]
    assert '"reply_contains": ["booked"]' in memory.outcomes[expected_id]["content"]


async def test_an_answer_whose_outcome_was_not_recorded_by_the_callee_is_compensated() -> None:
    result, events, _, _ = await run(AgentAnswer("booked for you", {"mnemesh.state": "IDLE"}))
    assert not result.matched and result.reasons == ("the agent recorded no actual outcome",)
    assert isinstance(events[-2], DelegationChecked) and isinstance(events[-1], CompensationFinished)
    assert events[-1].outcome == "ok"


async def test_a_callee_left_waiting_for_the_user_does_not_match_an_expected_finish() -> None:
    result, _, _, _ = await run(AgentAnswer("Which date?", {"mnemesh.state": "IDLE_WAITING",
                                                             "mnemesh.actual_memory_id": "a-1"}))
    assert "state is IDLE_WAITING, expected IDLE" in result.reasons and "'booked'" in result.reasons[1]


@pytest.mark.parametrize(("changes", "field"), [({"agent": "agent.example"}, "agent"), ({"text": " "}, "text"),
                                                ({"compensation": Compensation("")}, "compensation.tool")])
async def test_a_delegation_missing_what_it_needs_is_refused_naming_the_field(changes, field) -> None:
    with pytest.raises(ValidationFailed) as refused:
        await run(AgentAnswer(""), **changes)
    assert refused.value.field == field

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
    assert agent.sent == [{"mnemesh.expected_memory_id": expected_id, "mnemesh.delegation_depth": 1}]
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


# --- through the loop: a rule or the model decides to delegate ------------------------------------------------

RULES_WITH_AGENTS = """
agents:
  orders_desk:
    url: http://orders-desk.example/a2a
    description: The order desk agent; it knows deliveries.
    text: "{rest}"
    expect: {state: IDLE, reply_contains: [shipped]}
    compensation: {tool: orders.cancel, arguments: {order_id: A12345}}
rules:
  - name: ask_orders_desk
    action: delegate
    agent: orders_desk
    regex: '(?i)^ask the order desk:?'
"""


class Decides:
    """A model that answers with the given decisions in turn."""

    def __init__(self, *decisions: dict) -> None:
        self.decisions, self.seen = list(decisions), []

    async def decide(self, messages, tools) -> dict:
        self.seen.append(messages)
        return self.decisions.pop(0)


def loop_world(answer: AgentAnswer, llm=None):
    from services.orchestrator.domain.rulebook import parse_rulebook
    from services.orchestrator.service_layer.agent import Agent
    book = parse_rulebook(RULES_WITH_AGENTS)
    sessions, memory, tools = FakeSessionRepository(), LocalMemory(), LocalTools()

    async def cancel(args: dict) -> dict:
        return {"status": "cancelled", "order_id": args["order_id"]}
    tools.handlers["orders.cancel"] = cancel
    agents = ScriptedAgent(answer)
    agents.texts = []
    original = agents.send

    async def send(agent, tenant_id, context_id, text, metadata):
        agents.texts.append((agent, text))
        return await original(agent, tenant_id, context_id, text, metadata)
    agents.send = send
    agent = Agent(sessions, lambda: book, memory, tools, memory, llm, tool_deadline_seconds=5.0, agents=agents)
    return agent, sessions, tools, agents


async def say(agent, sessions, text: str):
    from services.orchestrator.service_layer.handlers import SendMessage, send_message
    session = await send_message(SendMessage("acme", "u1", "s1", "web", text), sessions, agent)
    return session, [v.event for v in await sessions.history("acme", "s1")]


async def test_a_rule_delegates_and_a_delivered_outcome_is_the_reply() -> None:
    from services.orchestrator.domain import DecisionMade, Outcome, State, TaskEnded
    agent, sessions, tools, agents = loop_world(AgentAnswer("Order A12345 is shipped.", {
        "mnemesh.state": "IDLE", "mnemesh.actual_memory_id": "actual-1"}))
    session, events = await say(agent, sessions, "Ask the order desk: where is A12345?")
    assert agents.texts == [("http://orders-desk.example/a2a", "where is A12345?")]  # the rule's words taken off
    [decision] = [e for e in events if isinstance(e, DecisionMade)]
    assert (decision.decided_by, decision.action) == ("rule:ask_orders_desk", "delegate")
    assert session.state == State.IDLE and tools.calls == []
    assert (session.messages[-1].text, session.messages[-1].citations) == ("Order A12345 is shipped.", ("actual-1",))
    assert [e.outcome for e in events if isinstance(e, TaskEnded)] == [Outcome.DONE]


async def test_a_mismatched_delegation_runs_the_declared_compensation_and_says_so() -> None:
    from services.orchestrator.domain import Outcome, State, StateChanged, TaskEnded
    agent, sessions, tools, _ = loop_world(AgentAnswer("I could not find it.", {
        "mnemesh.state": "IDLE", "mnemesh.actual_memory_id": "actual-1"}))
    session, events = await say(agent, sessions, "ask the order desk where is A12345")
    assert [c[:2] for c in tools.calls] == [("orders.cancel", {"order_id": "A12345"})]
    assert isinstance(events[-1], StateChanged) and session.state == State.IDLE
    assert session.messages[-1].text == ("The orders_desk agent did not do what was expected (the reply does not "
                                         "carry 'shipped'), so I undid it with orders.cancel.")
    [ended] = [e for e in events if isinstance(e, TaskEnded)]
    assert ended.outcome == Outcome.COMPENSATED


async def test_a_failed_compensation_hands_the_session_to_a_human() -> None:
    from services.orchestrator.domain import State
    agent, sessions, tools, _ = loop_world(AgentAnswer("nope", {"mnemesh.state": "IDLE"}))
    tools.handlers.pop("orders.cancel")  # the compensation tool fails
    session, _ = await say(agent, sessions, "ask the order desk about A12345")
    assert session.state == State.ESCALATE_TO_HUMAN
    assert "could not be checked or undone" in session.messages[-1].text


async def test_the_model_may_delegate_to_a_declared_agent_only() -> None:
    from services.orchestrator.domain import DecisionMade, State
    model = Decides({"action": "delegate", "agent": "billing", "text": "refund it"},
                    {"action": "delegate", "agent": "orders_desk", "text": "where is A12345?"})
    agent, sessions, _, agents = loop_world(AgentAnswer("It is shipped.", {
        "mnemesh.state": "IDLE", "mnemesh.actual_memory_id": "actual-2"}), model)
    session, events = await say(agent, sessions, "can you find out about my parcel A12345 from your colleagues")
    assert "orders_desk: The order desk agent" in model.seen[0][1]["content"]  # the agents are offered
    assert "agent 'billing' is not one of the agents declared" in model.seen[1][-1]["content"]
    [decision] = [e for e in events if isinstance(e, DecisionMade)]
    assert (decision.decided_by, decision.action) == ("llm", "delegate")
    assert agents.texts == [("http://orders-desk.example/a2a", "where is A12345?")]
    assert session.state == State.IDLE and session.messages[-1].text == "It is shipped."


async def test_replay_rebuilds_the_delegation_of_a_task() -> None:
    from services.orchestrator.domain import Session
    agent, sessions, _, _ = loop_world(AgentAnswer("nothing", {"mnemesh.state": "IDLE"}))
    await say(agent, sessions, "ask the order desk: A12345")
    await sessions.update("acme", "s1", lambda s: [])
    history = await sessions.history("acme", "s1")
    for cut in range(1, len(history) + 1):  # at every point, replay and its snapshot form agree
        state = Session.replay("acme", "s1", history[:cut])
        assert Session.from_dict(state.to_dict()).to_dict() == state.to_dict()


@pytest.mark.parametrize(("text", "line", "reason"), [
    ("rules:\n  - {name: r, action: delegate, agent: nobody, keywords: [x]}\n", 2,
     "rule 'r': agent 'nobody' is not declared under agents"),
    ("agents:\n  a: {url: http://a.example}\n", 2,
     "agent 'a': a delegation declares its compensation (tool and arguments), run when the agent does not deliver "
     "what is expected"),
    ("agents:\n  a:\n    url: a.example\n    compensation: {tool: t}\n", 3,
     "agent 'a': url must be the agent's A2A URL (http:// or https://)"),
    ("agents:\n  a:\n    url: http://a.example\n    expect: {status: done}\n    compensation: {tool: t}\n", 4,
     "agent 'a': expect has state and reply_contains, not 'status'"),
])
def test_a_bad_delegation_in_the_rules_file_is_refused_with_its_line(text: str, line: int, reason: str) -> None:
    from services.orchestrator.domain.rulebook import RulesError, parse_rulebook
    with pytest.raises(RulesError) as refused:
        parse_rulebook(text)
    assert (refused.value.line, refused.value.reason) == (line, reason)


async def test_a_delegation_made_while_serving_a_delegated_message_goes_one_deeper() -> None:
    from services.orchestrator.service_layer.delegation import DEPTH_KEY, delegation_depth
    served = delegation_depth.set(2)
    try:
        _, _, agent, _ = await run(AgentAnswer("booked", {"mnemesh.state": "IDLE", "mnemesh.actual_memory_id": "a"}))
    finally:
        delegation_depth.reset(served)
    assert agent.sent[0][DEPTH_KEY] == 3


async def test_a_hard_stop_cancels_the_call_to_the_agent_and_the_compensation_runs() -> None:
    import asyncio

    import anyio

    from services.orchestrator.domain import CompensationFinished, DelegationAnswered, Outcome, State, TaskEnded
    agent, sessions, tools, agents = loop_world(AgentAnswer("never sent"))
    calling, cancelled = asyncio.Event(), asyncio.Event()

    async def hangs(agent_url, tenant_id, context_id, text, metadata):
        calling.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
    agents.send = hangs
    turn = asyncio.create_task(say(agent, sessions, "ask the order desk: where is A12345?"))
    with anyio.fail_after(5):
        await calling.wait()
        stopped, _ = await say(agent, sessions, "算了")
        await cancelled.wait()  # the call to the other agent was cancelled
        session, events = await turn
    assert stopped.state == session.state == State.IDLE
    [answered] = [e for e in events if isinstance(e, DelegationAnswered)]
    assert "stopped while the agent worked" in answered.reason
    [compensated] = [e for e in events if isinstance(e, CompensationFinished)]
    assert compensated.outcome == "ok" and [c[0] for c in tools.calls] == ["orders.cancel"]
    assert [e.outcome for e in events if isinstance(e, TaskEnded)] == [Outcome.CANCELLED]  # nothing said after

"""A turn outlives its request, and a turn whose runner died is taken over once its lease runs out."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

import anyio
import pytest
from fakes import FakeSessionRepository

from services.orchestrator.adapters.local import LocalMemory, LocalTools
from services.orchestrator.adapters.rules_file import DEFAULT_RULES
from services.orchestrator.domain import ActionFinished, Outcome, State, TaskEnded, TurnRecovered
from services.orchestrator.domain.rulebook import parse_rulebook
from services.orchestrator.service_layer.agent import Agent
from services.orchestrator.service_layer.handlers import SendMessage, send_message
from services.orchestrator.service_layer.ports import CallStatus

BOOK = parse_rulebook(DEFAULT_RULES.read_text(encoding="utf-8"))
LEASE = 30.0


def agent(sessions: FakeSessionRepository, tools: LocalTools) -> Agent:
    memory = LocalMemory()
    return Agent(sessions, lambda: BOOK, memory, tools, memory, tool_deadline_seconds=5.0, lease_seconds=LEASE)


def age(sessions: FakeSessionRepository, seconds: float) -> None:
    """Let `seconds` pass since every event so far (how a test lets a lease run out without waiting)."""
    for key, items in sessions.streams.items():
        sessions.streams[key] = [replace(v, occurred_at=v.occurred_at - timedelta(seconds=seconds)) for v in items]


def say(runner: Agent, text: str, device: str = "web"):
    return send_message(SendMessage("acme", "u1", "s1", device, text), runner.sessions, runner)


async def until(sessions: FakeSessionRepository, kind: type, count: int = 1) -> None:
    seen = 0
    async for item in sessions.follow("acme", "s1", 0):
        seen += isinstance(item.event, kind)
        if seen >= count:
            return


async def events(sessions: FakeSessionRepository, kind: type) -> list:
    return [e.event for e in await sessions.history("acme", "s1") if isinstance(e.event, kind)]


async def a_runner_dies_mid_call(sessions: FakeSessionRepository) -> str:
    """A first process starts a tool call that never answers, then dies: its turn stops where it was."""
    tools = LocalTools()

    async def hangs(args):
        await asyncio.Event().wait()

    tools.handlers["orders.get_status"] = hangs
    first = agent(sessions, tools)
    sending = asyncio.create_task(say(first, "where is my order A12345?", device="phone"))
    with anyio.fail_after(5):
        await tools.started.wait()
    for turn in list(first._turns):  # the process dies: its running turn stops without another event
        turn.cancel()
    await asyncio.gather(sending, *first._turns, return_exceptions=True)
    session = await sessions.load("acme", "s1")
    assert session.state == State.ROUTING and len(session.task.pending()) == 1
    return tools.calls[0][2]


async def test_a_cancelled_send_does_not_stop_its_turn() -> None:
    sessions, tools, release = FakeSessionRepository(), LocalTools(), asyncio.Event()

    async def slow(args):
        await release.wait()
        return {"order_id": args["order_id"], "status": "shipped", "eta": "2026-03-01"}

    tools.handlers["orders.get_status"] = slow
    sending = asyncio.create_task(say(agent(sessions, tools), "where is my order A12345?"))
    with anyio.fail_after(5):
        await tools.started.wait()
    sending.cancel()  # the client gave up waiting
    await asyncio.gather(sending, return_exceptions=True)
    release.set()
    with anyio.fail_after(5):
        await until(sessions, TaskEnded)
    session = await sessions.load("acme", "s1")
    assert (session.state, session.task) == (State.IDLE, None)
    assert session.messages[-1].text.startswith("Order A12345 is shipped")
    assert tools.cancelled == []


async def test_a_turn_whose_runner_died_is_taken_over_by_the_next_send_after_its_lease() -> None:
    sessions = FakeSessionRepository()
    lost_call = await a_runner_dies_mid_call(sessions)
    age(sessions, LEASE + 1)
    tools = LocalTools()  # the second process; the gateway knows nothing of the lost call
    with anyio.fail_after(5):
        session = await say(agent(sessions, tools), "is it there yet?")

    recovered = await events(sessions, TurnRecovered)
    assert [(r.state, r.idle_seconds > LEASE) for r in recovered] == [(State.ROUTING, True)]
    assert tools.status_checks == [lost_call]  # asked before calling again
    finished = await events(sessions, ActionFinished)
    assert [(f.action_id, f.outcome) for f in finished] == [(lost_call, Outcome.TIMEOUT),
                                                            (tools.calls[0][2], Outcome.OK)]
    replies = [m.text for m in session.messages if m.role == "assistant"]
    assert replies[0].startswith("Order A12345 is shipped") and len(replies) == 2  # then the queued message
    assert (session.state, session.task, session.queue) == (State.IDLE, None, [])


async def test_a_lost_call_the_gateway_says_is_done_is_not_made_again() -> None:
    sessions = FakeSessionRepository()
    lost_call = await a_runner_dies_mid_call(sessions)
    age(sessions, LEASE + 1)
    tools = LocalTools(statuses={lost_call: CallStatus("done", {"order_id": "A12345", "status": "shipped",
                                                                "eta": "2026-03-09"})})
    with anyio.fail_after(5):
        session = await say(agent(sessions, tools), "any news?")
    assert tools.calls == []
    reply = next(m for m in session.messages if m.role == "assistant")
    assert reply.text == "Order A12345 is shipped; expected delivery 2026-03-09." and reply.citations == (lost_call,)


async def test_a_lost_call_the_gateway_recorded_but_cannot_settle_is_handed_to_a_person() -> None:
    """The gateway recorded the call (it timed out, and its status tool could not say whether it happened):
    calling again could charge twice, so the new runner leaves it to a person."""
    sessions = FakeSessionRepository()
    lost_call = await a_runner_dies_mid_call(sessions)
    age(sessions, LEASE + 1)
    tools = LocalTools(statuses={lost_call: CallStatus("uncertain")})
    with anyio.fail_after(5):
        session = await say(agent(sessions, tools), "any news?")
    assert tools.status_checks == [lost_call] and tools.calls == []
    finished = await events(sessions, ActionFinished)
    assert [(f.action_id, f.outcome, f.do_not_retry) for f in finished] == [(lost_call, Outcome.TIMEOUT, True)]
    assert session.state == State.ESCALATE_TO_HUMAN


async def test_a_busy_turn_within_its_lease_is_left_to_its_runner() -> None:
    sessions = FakeSessionRepository()
    await a_runner_dies_mid_call(sessions)
    age(sessions, LEASE - 1)
    tools = LocalTools()
    with anyio.fail_after(5):
        session = await say(agent(sessions, tools), "is it there yet?")
    assert await events(sessions, TurnRecovered) == []
    assert session.state == State.ROUTING and [q[1] for q in session.queue] == ["is it there yet?"]
    assert tools.calls == tools.status_checks == []


def test_a_lease_shorter_than_a_tool_call_is_refused() -> None:
    with pytest.raises(ValueError, match="must exceed the tool deadline"):
        Agent(FakeSessionRepository(), lambda: BOOK, LocalMemory(), LocalTools(), LocalMemory(),
              tool_deadline_seconds=10.0, lease_seconds=10.0)

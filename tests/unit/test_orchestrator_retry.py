"""A call that must not run again is never made again: non-retryable errors, timed-out calls whose outcome is
unknown or still running, on a live turn, after a pause and on recovery; and `_verify` on the injected clock."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

import anyio
import pytest
from fakes import FakeSessionRepository

from services.orchestrator.adapters.local import LocalMemory, LocalTools, ToolFailure
from services.orchestrator.adapters.repository import from_message, to_message
from services.orchestrator.adapters.rules_file import DEFAULT_RULES
from services.orchestrator.domain import ActionFinished, Outcome, State, StateChanged, TaskEnded
from services.orchestrator.domain.rulebook import parse_rulebook
from services.orchestrator.service_layer.agent import Agent
from services.orchestrator.service_layer.handlers import SendMessage, send_message
from services.orchestrator.service_layer.ports import CallStatus, ToolResult

BOOK = parse_rulebook(DEFAULT_RULES.read_text(encoding="utf-8"))


class FakeTime:
    """A clock that moves only when the agent sleeps on it."""

    def __init__(self) -> None:
        self.now, self.slept = 1_000.0, []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class World:
    def __init__(self, lease_seconds: float = 60.0) -> None:
        self.sessions, self.memory, self.tools, self.time = FakeSessionRepository(), LocalMemory(), LocalTools(), FakeTime()
        self.agent = Agent(self.sessions, lambda: BOOK, self.memory, self.tools, self.memory,
                           tool_deadline_seconds=5.0, lease_seconds=lease_seconds)

    async def say(self, text: str, device: str = "web"):
        return await send_message(SendMessage("acme", "u1", "s1", device, text), self.sessions, self.agent)

    async def events(self, kind: type) -> list:
        return [e.event for e in await self.sessions.history("acme", "s1") if isinstance(e.event, kind)]


@pytest.fixture
def world() -> World:
    return World()


def times_out(world: World, retryable: bool = True, reason: str = "") -> None:
    """Every call of orders.get_status times out (the answer is lost), with the gateway's retryable flag."""
    async def call(tenant_id, user_id, session_id, tool, arguments, call_id, deadline_seconds):
        world.tools.calls.append((tool, arguments, call_id))
        return ToolResult(False, reason=reason, retryable=retryable, timed_out=True)
    world.tools.call = call


async def assert_handed_over_after_one_call(world: World, session, why: str) -> None:
    assert len(world.tools.calls) == 1                       # never called again...
    assert session.state == State.ESCALATE_TO_HUMAN          # ...a person takes over, told why
    ended = (await world.events(TaskEnded))[-1]
    assert ended.outcome == Outcome.ESCALATED and "orders.get_status must not be called again" in ended.reason
    assert why in ended.reason
    finished = await world.events(ActionFinished)
    assert [f.do_not_retry for f in finished] == [True]
    assert session.messages[-1].text == BOOK.template("not_retried")


# --- a live turn --------------------------------------------------------------------------------------------


async def test_a_non_retryable_error_is_handed_to_a_person_and_never_called_again(world) -> None:
    async def refuses(args):
        raise ToolFailure("order_id: the order belongs to another customer", retryable=False)
    world.tools.handlers["orders.get_status"] = refuses

    session = await world.say("status of order A12345")

    await assert_handed_over_after_one_call(world, session, "belongs to another customer")
    assert ("FALLBACK", "ESCALATE_TO_HUMAN") in [(e.from_state, e.to_state) for e in await world.events(StateChanged)]


async def test_a_timeout_the_gateway_says_must_not_be_repeated_is_not_repeated_even_if_getcall_says_failed(
        world) -> None:
    # Today's gateway: CallTool answers "timed out; status unknown; do not call again" (not retryable) and
    # GetCall reports the call as failed. The error's own flag wins: no second call.
    times_out(world, retryable=False, reason="deadline_seconds: timed out; status unknown; do not call again")
    world.tools.default_status = CallStatus("failed")

    session = await world.say("status of order A12345")

    await assert_handed_over_after_one_call(world, session, "do not call again")


async def test_a_timed_out_call_whose_outcome_is_unknown_is_handed_to_a_person(world) -> None:
    times_out(world)  # a lost answer (retryable by itself); GetCall cannot establish what happened
    world.tools.default_status = CallStatus("unknown")

    session = await world.say("status of order A12345")

    await assert_handed_over_after_one_call(world, session, "status says unknown")
    assert world.tools.status_checks == [world.tools.calls[0][2]]


async def test_a_timed_out_call_the_gateway_says_failed_is_retried(world) -> None:
    answers = iter([ToolResult(False, reason="lost", timed_out=True),
                    ToolResult(True, {"order_id": "A12345", "status": "shipped", "eta": "2026-03-01"})])

    async def call(tenant_id, user_id, session_id, tool, arguments, call_id, deadline_seconds):
        world.tools.calls.append((tool, arguments, call_id))
        return next(answers)
    world.tools.call = call
    world.tools.default_status = CallStatus("failed")

    session = await world.say("status of order A12345")

    assert len(world.tools.calls) == 2 and session.state == State.IDLE
    assert [(f.outcome, f.do_not_retry) for f in await world.events(ActionFinished)] == [
        (Outcome.TIMEOUT, False), (Outcome.OK, False)]


async def test_a_call_still_running_when_the_verify_window_ends_is_handed_to_a_person(world) -> None:
    times_out(world)
    world.tools.default_status = CallStatus("running")
    world.agent.clock, world.agent.sleep = world.time.clock, world.time.sleep

    session = await world.say("status of order A12345")

    await assert_handed_over_after_one_call(world, session, "status says running")
    assert len(world.tools.status_checks) > 2  # asked again while the window lasted


async def test_a_non_retryable_failure_that_lands_during_a_pause_is_not_retried_on_resume(world) -> None:
    release = asyncio.Event()

    async def refuses_later(args):
        await release.wait()
        raise ToolFailure("order_id: not allowed", retryable=False)
    world.tools.handlers["orders.get_status"] = refuses_later
    turn = asyncio.create_task(world.say("where is order A12345?", device="phone"))
    with anyio.fail_after(5):
        await world.tools.started.wait()
    assert (await world.say("wait")).state == State.PAUSED
    release.set()
    with anyio.fail_after(5):
        await turn
    assert (await world.sessions.load("acme", "s1")).task.actions[0].do_not_retry  # kept through the pause

    session = await world.say("go on")

    await assert_handed_over_after_one_call(world, session, "not allowed")


# --- verification on the injected clock -------------------------------------------------------------------


async def test_verify_asks_again_on_the_agents_clock_for_exactly_its_window(world) -> None:
    world.agent.clock, world.agent.sleep = world.time.clock, world.time.sleep
    world.agent.verify_seconds = 5.0
    world.tools.default_status = CallStatus("running")

    with anyio.fail_after(1):  # five seconds of the agent's time, no real waiting
        status = await world.agent._verify("acme", "call-1")

    assert status.state == "running"
    # Pauses 0.05, 0.1, 0.2, 0.4, then 0.5 each, while the next ask still falls inside the 5 s window.
    assert world.time.slept == [0.05, 0.1, 0.2, 0.4] + [0.5] * 8
    assert len(world.tools.status_checks) == 13 and world.time.now - 1_000.0 == pytest.approx(4.75)


# --- recovery, and the event on the wire --------------------------------------------------------------------


async def test_a_recovered_call_the_gateway_still_runs_is_not_made_again() -> None:
    first = World(lease_seconds=30.0)

    async def hangs(args):
        await asyncio.Event().wait()
    first.tools.handlers["orders.get_status"] = hangs
    sending = asyncio.create_task(first.say("where is my order A12345?", device="phone"))
    with anyio.fail_after(5):
        await first.tools.started.wait()
    for turn in list(first.agent._turns):  # the runner dies mid-call
        turn.cancel()
    await asyncio.gather(sending, *first.agent._turns, return_exceptions=True)
    for key, items in first.sessions.streams.items():  # its lease runs out
        first.sessions.streams[key] = [replace(v, occurred_at=v.occurred_at - timedelta(seconds=31)) for v in items]
    second = World(lease_seconds=30.0)
    second.sessions = second.agent.sessions = first.sessions
    second.tools.default_status = CallStatus("running")

    with anyio.fail_after(5):
        session = await second.say("is it there yet?")

    assert second.tools.calls == [] and session.state == State.ESCALATE_TO_HUMAN
    assert "orders.get_status must not be called again" in (await second.events(TaskEnded))[-1].reason


def test_do_not_retry_survives_the_event_store_mapping() -> None:
    event = ActionFinished("a-1", "t-1", Outcome.TIMEOUT, "{}", "timed out", do_not_retry=True)
    message = to_message("acme", "s1", event)
    assert message.do_not_retry is True
    assert from_message("session.action_finished", message, "") == event

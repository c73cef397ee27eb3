"""The agent loop over fakes: transitions, fallback, interrupts, the state machine, replay and snapshots."""

from __future__ import annotations

import asyncio
import json

import anyio
import pytest
from orchestrator_world import World, last_reply, world_fixture  # noqa: F401 - the world fixture

from services.orchestrator.adapters.local import ToolFailure
from services.orchestrator.domain import (
    ActionFinished,
    Handling,
    Outcome,
    Session,
    State,
    StateChanged,
    TaskEnded,
    Versioned,
)
from services.orchestrator.service_layer.handlers import replay_session
from services.orchestrator.service_layer.ports import CallStatus

# --- transitions ---------------------------------------------------------------------------------------------


async def test_a_rule_matched_request_goes_parsing_routing_generating_and_back_to_idle_with_a_grounded_reply(
        world) -> None:
    session = await world.say("where is my order A12345?")
    assert await world.transitions() == [("IDLE", "PARSING"), ("PARSING", "ROUTING"), ("ROUTING", "GENERATING"),
                                         ("GENERATING", "IDLE")]
    reply = last_reply(session)
    assert reply.text.startswith("Order A12345 is shipped")
    assert reply.citations == (world.tools.calls[0][2],)  # the step id of the tool call
    assert world.memory.steps[world.tools.calls[0][2]]["tool"] == "orders.get_status"
    assert (session.state, session.task) == (State.IDLE, None)


async def test_a_request_no_rule_covers_goes_through_llm_decide_to_the_planner(world) -> None:
    world.memory.remember("u1", "m-1", "Your favourite colour is green")
    session = await world.say("what is my favourite colour?")
    assert ("PARSING", "LLM_DECIDE") in await world.transitions()
    assert last_reply(session).text == "From what I remember: Your favourite colour is green"
    assert last_reply(session).citations == ("m-1",)


async def test_a_refund_request_is_handed_to_a_human_in_both_languages(world) -> None:
    for text in ("I want a refund", "我要退款"):
        session = await world.say(text)
        assert session.state == State.ESCALATE_TO_HUMAN
        await world.say("cancel")  # a hard stop takes the session back from the human queue
    assert world.tools.calls == []


async def test_an_id_card_number_is_blocked_before_any_tool_or_memory_sees_it(world) -> None:
    session = await world.say("my order A12345, id 11010519491231002X")
    assert session.state == State.IDLE
    assert (await world.events(TaskEnded))[-1].outcome == Outcome.BLOCKED
    assert world.tools.calls == [] and world.memory.steps == {}


async def test_a_failing_tool_falls_back_and_after_three_tries_escalates_to_a_human(world) -> None:
    async def broken(args):
        raise ToolFailure("backend down")
    world.tools.handlers["orders.get_status"] = broken

    session = await world.say("status of order A12345")

    assert session.state == State.ESCALATE_TO_HUMAN
    assert len(world.tools.calls) == 3
    assert [t for t in await world.transitions() if "FALLBACK" in t] == [
        ("ROUTING", "FALLBACK"), ("FALLBACK", "ROUTING")] * 2 + [("ROUTING", "FALLBACK"),
                                                               ("FALLBACK", "ESCALATE_TO_HUMAN")]


async def test_a_tool_that_fails_once_is_retried_and_the_task_completes(world) -> None:
    calls = 0

    async def flaky(args):
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ToolFailure("busy")
        return {"status": "shipped", "eta": "2026-03-01"}
    world.tools.handlers["orders.get_status"] = flaky
    session = await world.say("status of order A12345")
    assert (session.state, calls) == (State.IDLE, 2)
    assert "shipped" in last_reply(session).text


async def test_a_timed_out_tool_is_verified_before_it_is_retried(world) -> None:
    never = asyncio.Event()

    async def hangs(args):
        await never.wait()
        return {}
    world.tools.handlers["orders.get_status"] = hangs
    world.agent.tool_deadline_seconds = 0.05
    world.tools.default_status = CallStatus("done", {"status": "delivered", "eta": "2026-02-02"})

    session = await world.say("status of order A12345")

    assert world.tools.status_checks == [world.tools.calls[0][2]]  # asked about the lost call...
    assert len(world.tools.calls) == 1                                 # ...and did not call again
    assert "delivered" in last_reply(session).text
    finished = await world.events(ActionFinished)
    assert finished[0].outcome == Outcome.OK and "status says done" in finished[0].reason


async def test_a_timed_out_call_still_running_at_the_gateway_is_asked_again_until_it_settles(world) -> None:
    never = asyncio.Event()

    async def hangs(args):
        await never.wait()
        return {}
    answers = [CallStatus("running"), CallStatus("running"),
               CallStatus("done", {"status": "delivered", "eta": "2026-02-02"})]

    async def status(tenant_id: str, call_id: str) -> CallStatus:
        world.tools.status_checks.append(call_id)
        return answers.pop(0)
    world.tools.handlers["orders.get_status"] = hangs
    world.tools.status = status
    world.agent.tool_deadline_seconds = 0.05

    session = await world.say("status of order A12345")

    assert world.tools.status_checks == [world.tools.calls[0][2]] * 3 and len(world.tools.calls) == 1
    assert "delivered" in last_reply(session).text


async def test_a_call_still_running_when_verification_gives_up_is_not_made_again(world) -> None:
    never = asyncio.Event()

    async def hangs(args):
        await never.wait()
        return {}
    world.tools.handlers["orders.get_status"] = hangs
    world.tools.default_status = CallStatus("running")
    world.agent.tool_deadline_seconds, world.agent.verify_seconds = 0.05, 0.3

    session = await world.say("status of order A12345")

    finished = await world.events(ActionFinished)
    assert finished[0].outcome == Outcome.TIMEOUT and "status says running" in finished[0].reason
    assert len(world.tools.calls) == 1 and session.state == State.ESCALATE_TO_HUMAN  # it may yet happen
    assert 2 <= world.tools.status_checks.count(world.tools.calls[0][2]) <= 6  # asked again, for a bounded time


async def test_a_result_that_is_not_verified_is_not_a_success(world) -> None:
    async def no_status(args):
        return {"eta": "2026-03-01"}  # the intent verifies by its `status` field
    world.tools.handlers["orders.get_status"] = no_status
    session = await world.say("status of order A12345")
    assert session.state == State.ESCALATE_TO_HUMAN
    assert all("not verified" in f.reason for f in await world.events(ActionFinished))


# --- interrupts --------------------------------------------------------------------------------------------


async def _start_a_hanging_call(world: World) -> tuple[asyncio.Task, asyncio.Event]:
    release = asyncio.Event()

    async def slow(args):
        await release.wait()
        return {"status": "shipped", "eta": "2026-03-01"}
    world.tools.handlers["orders.get_status"] = slow
    turn = asyncio.create_task(world.say("where is order A12345?", device="phone"))
    with anyio.fail_after(5):
        await world.tools.started.wait()
    return turn, release


@pytest.mark.parametrize("stop", ["cancel", "算了", "取消", "forget it"])
async def test_a_hard_stop_cancels_the_in_flight_tool_call(world, stop: str) -> None:
    turn, _ = await _start_a_hanging_call(world)
    stopped = await world.say(stop, device="web")
    with anyio.fail_after(5):
        await turn
    assert world.tools.cancelled == [world.tools.calls[0][2]]  # the upstream saw the cancellation
    assert (stopped.state, stopped.task) == (State.IDLE, None)
    assert [f.outcome for f in await world.events(ActionFinished)] == [Outcome.CANCELLED]
    assert (await world.events(TaskEnded))[-1].outcome == Outcome.CANCELLED


@pytest.mark.parametrize("pause", ["wait", "hold on", "等一下"])
async def test_a_soft_pause_keeps_the_draft_and_resuming_finishes_it(world, pause: str) -> None:
    turn, release = await _start_a_hanging_call(world)
    paused = await world.say(pause)
    assert paused.state == State.PAUSED and paused.task is not None
    release.set()
    with anyio.fail_after(5):
        await turn
    still = await world.sessions.load("acme", "s1")
    assert still.state == State.PAUSED and still.task.actions[0].outcome == Outcome.OK  # result kept, no reply
    resumed = await world.say("继续" if pause == "等一下" else "go on")
    assert resumed.state == State.IDLE and "shipped" in last_reply(resumed).text
    assert len(world.tools.calls) == 1


@pytest.mark.parametrize(("redirect", "new_tool"), [("wait, check the invoice instead", "billing.get_invoice"),
                                                    ("不对，先查发票", "billing.get_invoice")])
async def test_a_redirect_drops_the_task_and_starts_the_new_one(world, redirect: str, new_tool: str) -> None:
    turn, _ = await _start_a_hanging_call(world)
    session = await world.say(redirect)
    with anyio.fail_after(5):
        await turn
    assert world.tools.cancelled == [world.tools.calls[0][2]]
    assert (await world.events(TaskEnded))[0].outcome == Outcome.DROPPED
    # The new task needs an order number, which it asks for (it does not reuse the dropped task's).
    assert session.task is not None and "order" in last_reply(session).text.lower()
    answered = await world.say("A12345")
    assert world.tools.calls[-1][0] == new_tool and answered.state == State.IDLE


async def test_messages_sent_while_a_task_runs_are_kept_and_answered_in_order(world) -> None:
    turn, release = await _start_a_hanging_call(world)
    queued = await world.say("hello", device="web")
    assert (queued.messages[-1].handling, queued.queue) == (Handling.QUEUED, [(queued.version, "hello")])
    release.set()
    with anyio.fail_after(5):
        await turn
    final = await world.sessions.load("acme", "s1")
    assert final.state == State.IDLE and final.queue == []
    assert final.messages[-1].text.startswith("Hello!")


# --- the whole state machine: every transition, each with its reason ---------------------------------------

# Every transition of the session's state machine (the IDLE → PARSING → ROUTING | LLM_DECIDE →
# GENERATING → IDLE, FALLBACK → ESCALATE_TO_HUMAN, PAUSED, and the interrupts' exits).
MACHINE = {
    ("IDLE", "PARSING"), ("PARSING", "ROUTING"), ("PARSING", "LLM_DECIDE"), ("LLM_DECIDE", "ROUTING"),
    ("ROUTING", "GENERATING"), ("GENERATING", "IDLE"), ("ROUTING", "IDLE"), ("ROUTING", "FALLBACK"),
    ("FALLBACK", "ROUTING"), ("FALLBACK", "ESCALATE_TO_HUMAN"), ("ROUTING", "ESCALATE_TO_HUMAN"),
    ("ESCALATE_TO_HUMAN", "IDLE"), ("ROUTING", "PAUSED"), ("PAUSED", "ROUTING"), ("PAUSED", "IDLE"),
    ("IDLE", "PAUSED"), ("ROUTING", "PARSING"),
}


async def _every_path(world: World) -> None:
    async def hanging() -> tuple[asyncio.Task, asyncio.Event]:
        world.tools.started.clear()
        return await _start_a_hanging_call(world)

    await world.say("where is my order A12345?")                    # the rule path, a grounded reply
    await world.say("what is my favourite colour?")                  # no rule: LLM_DECIDE (the planner)
    await world.say("where is my order?")                            # a question: ROUTING -> IDLE
    await world.say("wait")                                          # paused while the question is open
    await world.say("go on")                                         # ...and back to waiting for the answer
    await world.say("B77777")                                        # the answer: IDLE -> PARSING
    await world.say("I want a refund")                               # a person must answer
    await world.say("cancel")                                        # a hard stop takes it back
    turn, release = await hanging()
    await world.say("hold on")                                       # ROUTING -> PAUSED, a call in flight
    release.set()
    await turn                                                       # its result is kept while paused
    await world.say("continue")                                      # PAUSED -> ROUTING, and the reply
    turn, _ = await hanging()
    await world.say("wait, check the invoice instead")               # a redirect: ROUTING -> PARSING
    await turn
    await world.say("算了")                                           # the new task's question dropped
    turn, _ = await hanging()
    await world.say("等一下")
    await world.say("取消")                                           # PAUSED -> IDLE
    await turn

    async def broken(args):
        raise ToolFailure("backend down")
    world.tools.handlers["orders.get_status"] = broken
    await world.say("status of order A12345")                        # FALLBACK, three tries, a person


async def test_every_transition_of_the_state_machine_happens_and_none_other(world) -> None:
    with anyio.fail_after(20):
        await _every_path(world)
    changes = await world.events(StateChanged)
    assert {(c.from_state, c.to_state) for c in changes} == MACHINE
    assert all(c.reason for c in changes)  # each with its reason
    for a, b in zip(changes, changes[1:], strict=False):  # and they chain: each starts where the last ended
        assert b.from_state == a.to_state, (a, b)


# --- replay and snapshots ----------------------------------------------------------------------------------


async def _busy_history(world: World) -> list[Versioned]:
    for text in ("where is my order?", "A12345", "hello", "我要退款", "cancel", "wait", "check invoice for B99999",
                 "what is this?", "算了"):
        await world.say(text)
    return await world.sessions.history("acme", "s1")


async def test_replaying_every_event_rebuilds_exactly_the_live_state(world) -> None:
    history = await _busy_history(world)
    live = await world.sessions.load("acme", "s1")
    assert (await replay_session("acme", "s1", world.sessions)).to_dict() == live.to_dict()
    assert len(history) > 40


async def test_a_snapshot_at_any_version_plus_the_tail_equals_the_full_replay(world) -> None:
    history = await _busy_history(world)
    full = Session.replay("acme", "s1", history).to_dict()
    for cut in range(len(history) + 1):
        snapshot = json.loads(json.dumps(Session.replay("acme", "s1", history[:cut]).to_dict()))
        rebuilt = Session.replay("acme", "s1", history[cut:], start=Session.from_dict(snapshot))
        assert rebuilt.to_dict() == full, f"snapshot at version {cut}"

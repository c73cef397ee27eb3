"""The agent loop over fakes: slots asked for, and filled from memory (L1 used, L2 offered to confirm)."""

from __future__ import annotations

import pytest
from orchestrator_world import last_reply, world_fixture  # noqa: F401 - the world fixture

from services.orchestrator.domain import (
    Handling,
    Session,
    SlotDeclined,
    SlotFilled,
    SlotOffered,
    State,
    TaskStarted,
)
from services.orchestrator.service_layer.handlers import replay_session

# --- slots -------------------------------------------------------------------------------------------------


async def test_a_missing_slot_asks_instead_of_guessing_and_the_answer_fills_it(world) -> None:
    asked = await world.say("where is my order?")
    assert (asked.state, last_reply(asked).handling) == (State.IDLE, Handling.QUESTION)
    assert "order number" in last_reply(asked).text
    assert world.tools.calls == []

    answered = await world.say("it is B77777")
    assert world.tools.calls[0][1] == {"order_id": "B77777"}
    assert "B77777" in last_reply(answered).text and answered.task is None


# --- slots from memory: L1 used, L2 offered to confirm ------------------------------------------------------


async def test_an_l1_memory_fills_the_slot_without_asking(world) -> None:
    world.memory.remember("u1", "m-l1", "My order number is A12345", "order_id", strong=True)
    session = await world.say("where is my order?")
    [slot] = await world.events(SlotFilled)
    assert (slot.value, slot.source) == ("A12345", "memory:L1:m-l1")
    assert not [m for m in session.messages if m.handling == Handling.QUESTION]
    assert world.tools.calls[0][1] == {"order_id": "A12345"} and "m-l1" in last_reply(session).citations


async def test_an_l2_memory_is_offered_and_a_yes_fills_the_slot_and_promotes_the_memory(world) -> None:
    world.memory.remember("u1", "m-l2", "The order number is probably A12345", "order_id", strong=False,
                          must_confirm=True)
    asked = await world.say("where is my order?")
    assert asked.state == State.IDLE and world.tools.calls == []  # not used before the user confirms it
    question = last_reply(asked)
    assert (question.handling, question.text) == (
        Handling.QUESTION, "I have A12345 on record as your order id. Shall I use it? (yes / no)")
    assert question.citations == ("m-l2",)
    [offered] = await world.events(SlotOffered)
    assert (offered.name, offered.value, offered.memory_id) == ("order_id", "A12345", "m-l2")

    answered = await world.say("Yes, please.")
    [slot] = await world.events(SlotFilled)
    assert (slot.value, slot.source) == ("A12345", "memory:L2-confirmed:m-l2")
    assert world.tools.calls[0][1] == {"order_id": "A12345"}
    assert "A12345" in last_reply(answered).text and answered.task is None
    assert world.memory.confirmed == ["m-l2"]  # now L1: used without asking next time


@pytest.mark.parametrize("yes", ["是的", "对", "好的，用吧", "yep", "OK!"])
async def test_a_confirmation_is_understood_in_chinese_and_english(world, yes: str) -> None:
    world.memory.remember("u1", "m-l2", "order A12345", "order_id", strong=False, must_confirm=True)
    await world.say("我的订单到哪了？")
    await world.say(yes)
    [slot] = await world.events(SlotFilled)
    assert slot.source == "memory:L2-confirmed:m-l2" and len(world.tools.calls) == 1


@pytest.mark.parametrize("no", ["no", "Nope.", "不是", "不对", "错了，不是这个"])
async def test_a_refusal_asks_for_the_value_and_the_memory_is_not_offered_again(world, no: str) -> None:
    world.memory.remember("u1", "m-l2", "order A12345", "order_id", strong=False, must_confirm=True)
    await world.say("where is my order?")
    refused = await world.say(no)
    assert world.tools.calls == [] and refused.state == State.IDLE
    assert last_reply(refused).text == "Which order do you mean? Please give the order number (e.g. A12345)."
    [declined] = await world.events(SlotDeclined)
    assert declined.memory_id == "m-l2" and not await world.events(SlotFilled)

    answered = await world.say("B77777")
    [slot] = await world.events(SlotFilled)
    assert (slot.value, slot.source) == ("B77777", "answer")
    assert world.tools.calls[0][1] == {"order_id": "B77777"} and world.memory.confirmed == []
    assert answered.task is None


@pytest.mark.parametrize(("answer", "value"), [("No, not that one", None), ("no, it is B54321", "B54321"),
                                               ("不对，是B54321", "B54321"), ("不是，不是这个", None)])
async def test_a_no_that_opens_like_a_redirect_answers_the_offer(world, answer: str, value: str | None) -> None:
    world.memory.remember("u1", "m-l2", "order A12345", "order_id", strong=False, must_confirm=True)
    await world.say("where is my order?")
    session = await world.say(answer)
    assert session.messages[-2].handling == Handling.ANSWER  # not a redirect: the task is the same
    [declined] = await world.events(SlotDeclined)
    assert declined.memory_id == "m-l2" and len(await world.events(TaskStarted)) == 1
    assert [c[1] for c in world.tools.calls] == ([{"order_id": value}] if value else [])


async def test_a_redirect_to_a_new_request_while_an_offer_is_open_stays_a_redirect(world) -> None:
    world.memory.remember("u1", "m-l2", "order A12345", "order_id", strong=False, must_confirm=True)
    await world.say("where is my order?")
    session = await world.say("不对，先查发票 B54321")
    assert session.messages[2].handling == Handling.REDIRECT
    assert not await world.events(SlotDeclined) and len(await world.events(TaskStarted)) == 2
    assert world.tools.calls[0][:2] == ("billing.get_invoice", {"order_id": "B54321"})


async def test_an_answer_that_is_neither_yes_nor_no_asks_again_and_a_new_value_replaces_the_offer(world) -> None:
    world.memory.remember("u1", "m-l2", "order A12345", "order_id", strong=False, must_confirm=True)
    await world.say("where is my order?")
    again = await world.say("hmm, let me think")
    assert last_reply(again).text == "Please answer yes or no: shall I use A12345 as your order id?"
    assert world.tools.calls == []
    await world.say("it is B54321")
    [declined] = await world.events(SlotDeclined)
    [slot] = await world.events(SlotFilled)
    assert declined.reason == "the user gave another value" and (slot.value, slot.source) == ("B54321", "answer")
    assert world.tools.calls[0][1] == {"order_id": "B54321"}


async def test_an_l1_memory_wins_over_an_l2_one_and_an_l3_one_never_fills_a_slot(world) -> None:
    world.memory.remember("u1", "m-l3", "order C99999 maybe", "order_id", strong=False, must_confirm=False)
    asked = await world.say("where is my order?")
    assert "order number" in last_reply(asked).text and not await world.events(SlotOffered)
    await world.say("cancel")
    world.memory.remember("u1", "m-l2", "order A12345", "order_id", strong=False, must_confirm=True)
    world.memory.remember("u1", "m-l1", "order B24680", "order_id", strong=True)
    await world.say("where is my order?")
    [slot] = await world.events(SlotFilled)
    assert slot.source == "memory:L1:m-l1" and not await world.events(SlotOffered)


async def test_replay_rebuilds_an_open_offer_and_a_declined_memory(world) -> None:
    world.memory.remember("u1", "m-l2", "order A12345", "order_id", strong=False, must_confirm=True)
    world.memory.remember("u1", "m-l2b", "order B11111", "order_id", strong=False, must_confirm=True)
    await world.say("where is my order?")
    live = await world.say("no")  # the first offer declined: the other L2 memory is offered next
    assert live.task.declined and live.task.offers
    replayed = await replay_session("acme", "s1", world.sessions)
    assert replayed.to_dict() == live.to_dict()
    assert Session.from_dict(live.to_dict()).to_dict() == live.to_dict()  # the snapshot form keeps them


async def test_an_invalid_slot_value_is_explained_in_the_question(world) -> None:
    session = await world.say("where is my order A12?")
    assert last_reply(session).text.startswith("An order number is 1-3 letters and 4-10 digits")
    assert world.tools.calls == []

"""Sessions as event-sourced aggregates, and the orchestrator handlers over a fake event store."""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from dataclasses import replace

import anyio
import pytest
from fakes import FakeSessionRepository

from libs.errors import Conflict, IdempotencyKeyReused, ValidationFailed
from services.orchestrator.domain import MessageAppended, Session, State, StateChanged, Versioned
from services.orchestrator.service_layer.handlers import SendMessage, follow, get_session, send_message


def a_send(**changes) -> SendMessage:
    base = SendMessage(tenant_id="acme", user_id="u1", session_id="s1", device_id="web-1", text="hello")
    return replace(base, **changes)


@pytest.fixture
def sessions() -> FakeSessionRepository:
    return FakeSessionRepository()


# --- domain ------------------------------------------------------------------------------------------------


def test_replaying_a_history_rebuilds_messages_state_and_version() -> None:
    hello = MessageAppended("u1", "web-1", "user", "hello", event_id="e1")
    history = [
        Versioned(1, hello),
        Versioned(2, StateChanged(State.IDLE, State.PARSING, "message arrived")),
        Versioned(3, StateChanged(State.PARSING, State.GENERATING, "parsed")),
    ]
    session = Session.replay("acme", "s1", history)
    assert (session.version, session.state, session.messages) == (3, State.GENERATING, [hello])


def test_a_new_session_is_idle_at_version_zero() -> None:
    session = Session.replay("acme", "s1", [])
    assert (session.version, session.state, session.messages) == (0, State.IDLE, [])


def test_sending_yields_a_user_message_with_its_text_trimmed() -> None:
    events = Session("acme", "s1").send("u1", "web-1", "  hi there \n", event_id="e1")
    assert events == [MessageAppended("u1", "web-1", "user", "hi there", event_id="e1")]


@pytest.mark.parametrize(("text", "device_id", "bad_field"), [
    ("   ", "web-1", "text"),
    ("x" * 8_001, "web-1", "text"),
    ("hello", "", "device_id"),
])
def test_a_message_without_text_or_device_is_refused(text: str, device_id: str, bad_field: str) -> None:
    with pytest.raises(ValidationFailed) as err:
        Session("acme", "s1").send("u1", device_id, text)
    assert err.value.field == bad_field


# --- send_message ------------------------------------------------------------------------------------------


async def test_sending_appends_the_message_and_returns_the_new_version(sessions) -> None:
    first = await send_message(a_send(text="hello"), sessions)
    second = await send_message(a_send(text="again", expected_version=1), sessions)

    assert (first.version, second.version) == (1, 2)
    assert [m.text for m in second.messages] == ["hello", "again"]
    assert [v.version for v in await sessions.history("acme", "s1")] == [1, 2]


async def test_a_device_that_saw_an_old_version_gets_a_conflict_telling_it_to_subscribe(sessions) -> None:
    await send_message(a_send(device_id="phone", text="from phone"), sessions)

    with pytest.raises(Conflict) as err:
        await send_message(a_send(device_id="web-1", text="from web", expected_version=0), sessions)

    assert err.value.field == "expected_version"
    assert "Subscribe" in err.value.hint and "from_version=0" in err.value.hint
    assert "version 1" in err.value.reason
    assert [m.text for m in (await get_session("acme", "s1", sessions)).messages] == ["from phone"]


async def test_the_same_idempotency_key_twice_is_applied_once(sessions) -> None:
    first = await send_message(a_send(idempotency_key="k-1"), sessions)
    again = await send_message(a_send(idempotency_key="k-1"), sessions)

    assert again.version == first.version == 1
    assert [m.text for m in again.messages] == ["hello"]
    assert len(await sessions.history("acme", "s1")) == 1


async def test_a_different_message_under_a_used_idempotency_key_is_refused_not_dropped(sessions) -> None:
    await send_message(a_send(idempotency_key="k-1"), sessions)
    with pytest.raises(IdempotencyKeyReused) as refused:
        await send_message(a_send(idempotency_key="k-1", text="something else"), sessions)
    assert refused.value.field == "idempotency_key"
    assert [m.text for m in (await get_session("acme", "s1", sessions)).messages] == ["hello"]


async def test_thirty_concurrent_senders_at_any_version_all_succeed(sessions) -> None:
    results = await asyncio.gather(*(send_message(a_send(device_id=f"d{i}", text=f"m{i}"), sessions)
                                     for i in range(30)))
    assert sorted(r.version for r in results) == list(range(1, 31))
    assert len((await get_session("acme", "s1", sessions)).messages) == 30


async def test_a_device_catching_up_and_resending_with_the_same_key_is_not_applied_twice(sessions) -> None:
    await send_message(a_send(idempotency_key="k-1", expected_version=0), sessions)
    await send_message(a_send(device_id="phone", text="meanwhile", expected_version=1), sessions)

    session = await send_message(a_send(idempotency_key="k-1", expected_version=2), sessions)

    assert session.version == 2
    assert [m.text for m in session.messages] == ["hello", "meanwhile"]


async def test_an_exact_retry_of_a_send_returns_the_first_result_instead_of_a_conflict(sessions) -> None:
    first = await send_message(a_send(idempotency_key="k-1", expected_version=0), sessions)
    retry = await send_message(a_send(idempotency_key="k-1", expected_version=0), sessions)
    assert retry.version == first.version == 1
    assert len(await sessions.history("acme", "s1")) == 1


async def test_different_idempotency_keys_are_different_messages(sessions) -> None:
    await send_message(a_send(idempotency_key="k-1"), sessions)
    session = await send_message(a_send(idempotency_key="k-2"), sessions)
    assert session.version == 2


async def test_the_same_key_in_another_session_is_another_message(sessions) -> None:
    await send_message(a_send(idempotency_key="k-1"), sessions)
    other = await send_message(a_send(idempotency_key="k-1", session_id="s2"), sessions)
    assert other.version == 1
    assert len(await sessions.history("acme", "s2")) == 1


async def test_a_session_read_back_is_rebuilt_from_its_events(sessions) -> None:
    for i in range(3):
        await send_message(a_send(text=f"m{i}", device_id=f"d{i}"), sessions)
    session = await get_session("acme", "s1", sessions)
    assert session.version == 3
    assert [(m.device_id, m.text, m.role) for m in session.messages] == [
        ("d0", "m0", "user"), ("d1", "m1", "user"), ("d2", "m2", "user")]


@pytest.mark.parametrize(("changes", "bad_field"), [
    ({"text": "  "}, "text"),
    ({"device_id": ""}, "device_id"),
    ({"session_id": ""}, "session_id"),
    ({"session_id": "s" * 129}, "session_id"),
    ({"tenant_id": ""}, "tenant.tenant_id"),
    ({"expected_version": -2}, "expected_version"),
])
async def test_an_invalid_send_is_refused_naming_the_field_and_appends_nothing(sessions, changes: dict,
                                                                               bad_field: str) -> None:
    with pytest.raises(ValidationFailed) as err:
        await send_message(a_send(**changes), sessions)
    assert err.value.field == bad_field
    assert sessions.appends == 0


# --- follow ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("session_id", "from_version", "bad_field"), [
    ("s1", -1, "from_version"),
    ("", 0, "session_id"),
])
async def test_following_with_bad_arguments_is_refused(sessions, session_id: str, from_version: int,
                                                       bad_field: str) -> None:
    async with aclosing(follow("acme", session_id, from_version, sessions)) as items:
        with pytest.raises(ValidationFailed) as err:
            await anext(items)
    assert err.value.field == bad_field


async def test_following_catches_up_after_the_given_version_then_sees_new_messages(sessions) -> None:
    for text in ("one", "two", "three"):
        await send_message(a_send(text=text), sessions)

    with anyio.fail_after(5):
        async with aclosing(follow("acme", "s1", 1, sessions)) as items:
            caught_up = [await anext(items), await anext(items)]
            await send_message(a_send(text="four"), sessions)
            live = await anext(items)

    assert [(v.version, v.event.text) for v in caught_up] == [(2, "two"), (3, "three")]
    assert (live.version, live.event.text) == (4, "four")

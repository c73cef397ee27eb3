"""Sessions in the real event store: concurrent senders, idempotency keys."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from libs.db import Database
from libs.errors import IdempotencyKeyReused
from libs.eventstore import EventStore
from libs.outbox import Outbox
from services.orchestrator.adapters.repository import EventSourcedSessions
from services.orchestrator.service_layer.handlers import SendMessage, get_session, send_message

pytestmark = pytest.mark.integration


def a_send(**changes) -> SendMessage:
    fields = {"tenant_id": "acme", "user_id": "u1", "session_id": "s1", "device_id": "web", "text": "hello",
              **changes}
    return SendMessage(**fields)


async def test_thirty_concurrent_senders_at_any_version_all_succeed_in_one_gapless_order(db: Database) -> None:
    sessions = EventSourcedSessions(db, EventStore(db), Outbox(db))
    with anyio.fail_after(60):
        results = await asyncio.gather(*(send_message(a_send(device_id=f"d{i}", text=f"m{i}"), sessions)
                                         for i in range(30)), return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    assert failures == []
    session = await get_session("acme", "s1", sessions)
    assert session.version == 32  # the first message starts a task (3 events), the other 29 queue behind it
    assert sorted(m.text for m in session.messages) == sorted(f"m{i}" for i in range(30))


async def test_a_reused_idempotency_key_with_another_message_is_refused_and_a_retry_is_not(db: Database) -> None:
    sessions = EventSourcedSessions(db, EventStore(db), Outbox(db))
    first = await send_message(a_send(idempotency_key="k-1"), sessions)
    retry = await send_message(a_send(idempotency_key="k-1"), sessions)
    with pytest.raises(IdempotencyKeyReused):
        await send_message(a_send(idempotency_key="k-1", text="another message"), sessions)
    assert first.version == retry.version == 3
    assert [m.text for m in (await get_session("acme", "s1", sessions)).messages] == ["hello"]


async def test_a_replica_holding_a_cached_session_still_sees_what_another_replica_appended(db: Database) -> None:
    one = EventSourcedSessions(db, EventStore(db), Outbox(db))
    other = EventSourcedSessions(db, EventStore(db), Outbox(db))
    await send_message(a_send(text="first"), one)
    assert (await one.load("acme", "s1")).version == 3  # now cached in `one`
    await send_message(a_send(text="second", device_id="app"), other)
    after = await send_message(a_send(text="third"), one)
    assert [m.text for m in after.messages] == ["first", "second", "third"]
    assert after.version == 5
    assert (await one.load("acme", "s1")).to_dict() == (await other.load("acme", "s1")).to_dict()


async def test_a_refused_send_leaves_the_cached_state_as_the_store_has_it(db: Database) -> None:
    sessions = EventSourcedSessions(db, EventStore(db), Outbox(db))
    await send_message(a_send(idempotency_key="k"), sessions)
    with pytest.raises(IdempotencyKeyReused):
        await send_message(a_send(idempotency_key="k", text="another"), sessions)
    fresh = EventSourcedSessions(db, EventStore(db), Outbox(db), cache_size=0)
    assert (await sessions.load("acme", "s1")).to_dict() == (await fresh.load("acme", "s1")).to_dict()


async def test_concurrent_updates_are_group_committed_and_a_refusal_fails_only_its_own(db: Database) -> None:
    sessions = EventSourcedSessions(db, EventStore(db), Outbox(db))
    await send_message(a_send(text="first"), sessions)  # a task starts: the next messages queue behind it
    transactions = 0
    original = sessions._commit_group

    async def counted(*args):
        nonlocal transactions
        transactions += 1
        return await original(*args)
    sessions._commit_group = counted
    sends = [send_message(a_send(device_id=f"d{i}", text=f"m{i}", expected_version=3 if i == 7 else -1), sessions)
             for i in range(40)]
    with anyio.fail_after(60):
        results = await asyncio.gather(*sends, return_exceptions=True)
    refused = [i for i, r in enumerate(results) if isinstance(r, BaseException)]
    assert refused == [7] or (refused == [] and results[7].version == 4)  # stale unless it went first
    ok = [r for r in results if not isinstance(r, BaseException)]
    assert sorted(r.version for r in ok) == sorted({r.version for r in ok})  # each saw its own append
    assert transactions < len(sends)  # grouped: fewer transactions than updates
    session = await get_session("acme", "s1", sessions)
    assert session.version == 3 + len(ok) and [m.text for m in session.messages][0] == "first"
    fresh = EventSourcedSessions(db, sessions.store, sessions.outbox, cache_size=0)
    assert (await fresh.load("acme", "s1")).to_dict() == session.to_dict()

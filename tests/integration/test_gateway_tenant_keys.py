"""The tool gateway's per-tenant Redis state against real Redis: tenant ids may hold ".", so keys built by
joining a tenant and an id with "." collided across tenants ("acme" + "eu.trip-1" == "acme.eu" + "trip-1")."""

from __future__ import annotations

import asyncio

import pytest

from libs.errors import DomainError
from services.tool_gateway.adapters.redis_chains import RedisChainStore, RedisTaskStore
from services.tool_gateway.adapters.redis_state import RedisResultStore
from services.tool_gateway.domain.chains import ChainStep

pytestmark = pytest.mark.integration


@pytest.fixture
def factory(redis_factory):
    return redis_factory


async def test_a_dotted_tenant_does_not_share_chains_results_running_marks_or_tasks(factory, unique: str) -> None:
    chains, results, tasks = RedisChainStore(factory, unique), RedisResultStore(factory, unique), \
        RedisTaskStore(factory, unique)
    await chains.record("acme", "agent-1", "eu.trip-1", ChainStep("trip.quote", "h", "c1", "ok", "c1", 1.0))
    await results.put("acme", "eu.c1", '{"city": "Oslo"}')
    await results.mark_running("acme", "eu.trip-1", 30)
    await tasks.begin("acme", "eu.t1", {"state": "working", "caller": "agent-1"}, 30, 16)
    assert await chains.load("acme.eu", "agent-1", "trip-1") is None
    assert await results.get("acme.eu", "c1") is None
    assert not await results.running("acme.eu", "trip-1")
    assert await tasks.load("acme.eu", "t1") is None and not await tasks.held("acme.eu", "t1")
    # the owner sees its own state
    [step] = (await chains.load("acme", "agent-1", "eu.trip-1")).steps
    assert step.call_id == "c1" and await results.get("acme", "eu.c1") == '{"city": "Oslo"}'
    assert await results.running("acme", "eu.trip-1") and await tasks.held("acme", "eu.t1")


async def test_parts_holding_the_separator_do_not_collide_either(factory, unique: str) -> None:
    chains, results = RedisChainStore(factory, unique), RedisResultStore(factory, unique)
    await chains.record("acme", "agent:1", "trip", ChainStep("trip.quote", "h", "c1", "ok", "c1", 1.0))
    await results.put("acme", "running:x", "{}")
    assert await chains.load("acme", "agent", "1:trip") is None
    assert not await results.running("acme", "x")


async def test_a_tenant_id_that_is_not_one_is_refused_before_any_key_is_built(factory, unique: str) -> None:
    with pytest.raises(ValueError, match="tenant"):
        await RedisResultStore(factory, unique).get("acme:eu", "c1")


async def test_the_chain_script_keeps_no_step_past_the_cap_and_says_so(factory, unique: str) -> None:
    chains = RedisChainStore(factory, unique, max_steps=2)
    for n in range(2):
        await chains.record("acme", "agent-1", "c", ChainStep("trip.quote", f"h{n}", f"c{n}", "ok", f"c{n}", 1.0 + n))
    with pytest.raises(DomainError) as full:
        await chains.record("acme", "agent-1", "c", ChainStep("trip.quote", "h2", "c2", "ok", "c2", 3.0))
    assert (full.value.error_type, full.value.field) == ("chain_full", "chain_id") and "'c'" in full.value.reason
    # a step it holds is still renewed, and replaced by a fresh run
    await chains.record("acme", "agent-1", "c", ChainStep("trip.quote", "h1", "c9", "ok", "c9", 4.0))
    steps = (await chains.load("acme", "agent-1", "c")).steps
    assert [s.call_id for s in steps] == ["c0", "c9"]


async def test_a_callers_working_tasks_are_capped_and_a_lapsed_lease_or_an_end_frees_a_place(factory,
                                                                                          unique: str) -> None:
    tasks = RedisTaskStore(factory, unique)
    ids = [f"{n:032x}" for n in range(4)]
    state = {"state": "working", "caller": "agent-1"}
    assert [await tasks.begin("acme", i, {**state, "task_id": i}, 30, 2) for i in ids[:3]] == [1, 2, -2]
    assert await tasks.load("acme", ids[2]) is None  # refused: not saved
    assert await tasks.begin("acme", ids[2], {**state, "caller": "agent-2"}, 30, 2) == 1  # another caller
    assert await tasks.end("acme", ids[0], {**state, "state": "completed"})
    assert not await tasks.end("acme", ids[0], {**state, "state": "failed"})  # final stays final
    assert (await tasks.load("acme", ids[0]))["state"] == "completed"
    assert await tasks.begin("acme", ids[3], state, 0.2, 2) == 2
    await asyncio.sleep(0.3)  # ids[3]'s lease lapsed (its replica lost): it no longer counts
    assert await tasks.begin("acme", ids[0], state, 30, 2) == 2


async def test_a_running_step_is_held_by_one_call_released_only_by_it_and_lapses_after_its_time(factory,
                                                                                               unique: str) -> None:
    chains = RedisChainStore(factory, unique)
    assert await chains.claim("acme", "agent-1", "trip-1", "trip.pay\x1fh", "call-a", 30)
    assert not await chains.claim("acme", "agent-1", "trip-1", "trip.pay\x1fh", "call-b", 30)  # held by call-a
    assert await chains.claim("acme", "agent-2", "trip-1", "trip.pay\x1fh", "call-c", 30)  # another caller's chain
    assert await chains.claim("acme.eu", "agent-1", "trip-1", "trip.pay\x1fh", "call-d", 30)  # another tenant's
    await chains.release("acme", "agent-1", "trip-1", "trip.pay\x1fh", "call-b")  # not its hold: nothing
    assert not await chains.claim("acme", "agent-1", "trip-1", "trip.pay\x1fh", "call-b", 30)
    await chains.release("acme", "agent-1", "trip-1", "trip.pay\x1fh", "call-a")
    assert await chains.claim("acme", "agent-1", "trip-1", "trip.pay\x1fh", "call-b", 0.2)
    await asyncio.sleep(0.4)  # call-b's replica was lost: its hold lapses
    assert await chains.claim("acme", "agent-1", "trip-1", "trip.pay\x1fh", "call-e", 30)

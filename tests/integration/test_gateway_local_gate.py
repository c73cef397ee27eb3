"""The local gate (a replica's allowance of rate-limit tokens taken from Redis in batches, and its breaker's
"closed" trusted for a moment) against real Redis, two gates standing for two replicas: the shared bounds
still hold, within what the README states ("at most one batch per bucket and replica over the limit")."""

from __future__ import annotations

import asyncio
import time

import anyio
import pytest

from services.tool_gateway.adapters.local_gate import LocalGate
from services.tool_gateway.adapters.redis_state import BreakerSettings, RedisBreakers, RedisRateLimiter

pytestmark = pytest.mark.integration


@pytest.fixture
def factory(redis_factory):
    return redis_factory


def replica(factory, unique: str, *, cache_seconds: float = 0.2, open_seconds: float = 0.5) -> LocalGate:
    breakers = RedisBreakers(factory, unique, BreakerSettings(failures=2, open_seconds=open_seconds),
                             cache_seconds=cache_seconds)
    return LocalGate(RedisRateLimiter(factory, unique), breakers, batch_seconds=0.05)


async def test_a_fast_bucket_shared_by_two_replicas_admits_at_most_its_limit_plus_a_batch_each(
        factory, unique: str) -> None:
    a, b = replica(factory, unique), replica(factory, unique)
    rate = 400.0  # burst 800, batch 20 (50 ms of it)
    assert a.batch(rate) == 20
    admitted, started = 0, time.monotonic()

    async def caller(gate: LocalGate) -> None:
        nonlocal admitted
        while time.monotonic() - started < 1.0:
            wait, ok, state, _ = await gate.admit([("caller:t:u", rate)], "mail.send@1", 5.0)
            if wait == 0:
                assert (ok, state) == (True, "closed")
                admitted += 1
            else:
                await asyncio.sleep(0)  # refused: let the other callers run

    await asyncio.gather(*(caller(g) for g in (a, b, a, b)))
    elapsed = time.monotonic() - started
    await asyncio.gather(a.close(), b.close())
    # More than a batch each was taken (the batches did their work) and the shared bound held: burst + refill
    # over the run, plus at most one batch per replica held when it began.
    assert 800 < admitted <= 800 + rate * elapsed + 2 * 20, (admitted, elapsed)


async def test_refused_calls_take_no_token_and_say_how_long_to_wait(factory, unique: str) -> None:
    gate = replica(factory, unique)
    buckets = [("caller:t:u", 1.0), ("tool:mail.send", 400.0)]  # burst 2 for the caller
    outcomes = [await gate.admit(buckets, "mail.send@1", 5.0) for _ in range(3)]
    assert [o[0] == 0 for o in outcomes] == [True, True, False]
    assert 0 < outcomes[2][0] <= 1.0 and outcomes[2][1:] == (False, "", 0.0)
    # The tool's bucket gave a batch of 20 to the first call, one went to each admitted call and the token the
    # refused call had taken locally came back.
    assert gate.held(gate.limiter.key("tool:mail.send")) == 18
    await gate.close()


async def test_a_slow_bucket_takes_one_token_per_call_as_before(factory, unique: str) -> None:
    gate = replica(factory, unique)
    assert gate.batch(5.0) == 1
    for _ in range(10):  # burst 10
        assert (await gate.admit([("caller:t:u", 5.0)], "x@1", 5.0))[0] == 0
    assert gate.held(gate.limiter.key("caller:t:u")) == 0
    assert (await gate.admit([("caller:t:u", 5.0)], "x@1", 5.0))[0] > 0
    await gate.close()


async def test_a_breaker_opened_by_another_replica_refuses_here_within_the_trust_interval(
        factory, unique: str) -> None:
    a, b = replica(factory, unique, cache_seconds=0.2), replica(factory, unique, cache_seconds=0.2)
    buckets = [("tool:jobs.submit", 10_000.0)]
    assert (await a.admit(buckets, "jobs.submit@1", 5.0))[1:3] == (True, "closed")  # a trusts "closed" now
    for _ in range(2):
        await b.breakers.record("jobs.submit@1", False)
    assert await b.breakers.state("jobs.submit@1") == "open"
    assert (await b.admit(buckets, "jobs.submit@1", 5.0))[1:3] == (False, "open")  # b's own failures: at once
    await asyncio.sleep(0.25)  # past a's trust
    assert (await a.admit(buckets, "jobs.submit@1", 5.0))[1:3] == (False, "open")
    await asyncio.gather(a.close(), b.close())


async def test_a_half_open_breaker_lets_one_probe_through_across_replicas_and_a_success_closes_it(
        factory, unique: str) -> None:
    a, b = replica(factory, unique, open_seconds=0.3), replica(factory, unique, open_seconds=0.3)
    buckets = [("tool:jobs.submit", 10_000.0)]
    for _ in range(2):
        await a.breakers.record("jobs.submit@1", False)
    await asyncio.sleep(0.35)
    answers = await asyncio.gather(*(g.admit(buckets, "jobs.submit@1", 5.0) for g in (a, b, a, b)))
    assert sorted(ok for _, ok, _, _ in answers) == [False, False, False, True]
    assert {state for _, _, state, _ in answers} == {"half_open"}
    assert await a.breakers.record("jobs.submit@1", True) == "closed"
    assert a.breakers.trusted_closed("jobs.submit@1")
    assert (await b.admit(buckets, "jobs.submit@1", 5.0))[1:3] == (True, "closed")
    await asyncio.gather(a.close(), b.close())


async def test_a_top_up_renews_the_trust_and_refills_off_the_calls_path(factory, unique: str) -> None:
    gate = replica(factory, unique, cache_seconds=1.0)
    buckets = [("tool:t", 400.0)]
    key = gate.limiter.key("tool:t")

    async def topped_up() -> None:
        with anyio.fail_after(5):
            while gate._topping:
                await asyncio.sleep(0.01)

    started = time.monotonic()
    await gate.admit(buckets, "t@1", 5.0)  # takes a batch of 20, keeps 19; trusts "closed" for 1 s
    for _ in range(10):  # spent locally; under half the batch now: a top-up runs in the background
        await gate.admit(buckets, "t@1", 5.0)
    await topped_up()
    assert gate.held(key) == 20
    await asyncio.sleep(max(0.0, 0.6 - (time.monotonic() - started)))  # past half the trust
    await gate.admit(buckets, "t@1", 5.0)
    await topped_up()
    await asyncio.sleep(max(0.0, 1.1 - (time.monotonic() - started)))  # the first trust has lapsed by now
    assert gate.breakers.trusted_closed("t@1")  # renewed by the top-up
    await gate.close()


async def test_calls_that_find_the_trust_lapsed_wait_for_one_answer_instead_of_each_asking(
        factory, unique: str) -> None:
    gate = replica(factory, unique, cache_seconds=0.05)
    buckets = [("tool:t", 10_000.0)]  # batch 64: the tokens stay local throughout
    await gate.admit(buckets, "t@1", 5.0)
    await asyncio.sleep(0.06)  # the trust lapsed
    scripts = 0
    run_script = gate.limiter.run_script

    async def counted(*args, **kwargs):
        nonlocal scripts
        scripts += 1
        return await run_script(*args, **kwargs)

    gate.limiter.run_script = counted
    answers = await asyncio.gather(*(gate.admit(buckets, "t@1", 5.0) for _ in range(8)))
    assert all(a == (0.0, True, "closed", 0.0) for a in answers)
    assert scripts == 1
    await gate.close()

"""Procedural memory, canaries and call status, through the domain rules and the pipeline with fakes."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from experience_fake import FakeExperience
from gateway_fakes import fake_ports

from libs.auth import Principal
from libs.errors import Conflict, Unavailable
from services.tool_gateway.domain import ToolCall, ToolSpec
from services.tool_gateway.domain.experience import (
    Experience,
    Observation,
    context_key,
    note,
    observe,
    percentile,
)
from services.tool_gateway.domain.guide import guide
from services.tool_gateway.domain.rollout import ArmCounts, Rollout, arm_for, rollback_reason
from services.tool_gateway.service_layer import handlers
from services.tool_gateway.service_layer.experience import record_call, tool_stats
from services.tool_gateway.service_layer.pipeline import call_tool

INPUT = {"type": "object", "properties": {"date": {"type": "string"}, "city": {"type": "string"}}}


def agent(n: int | str = 1) -> Principal:
    return Principal(subject=f"agent-{n}", tenant_id="acme", scopes=frozenset({"tools:call", "tools:read"}))


def spec(version: str = "1.0.0") -> ToolSpec:
    return ToolSpec(name="weather.get", description="The weather of a city on a date.", input_schema=INPUT,
                    version=version, backend="fake:")


def test_experience_counts_successes_failures_latency_percentiles_errors_and_best_arguments() -> None:
    exp = Experience("weather.get")
    for i in range(90):
        observe(exp, Observation(ok=True, latency_ms=10 + i % 5, arguments={"city": "Paris" if i % 3 else "Lyon",
                                                                              "blob": "x" * 500}))
    for _ in range(8):
        observe(exp, Observation(ok=False, latency_ms=3, error={"error_type": "validation", "field": "arguments/date",
                                                                "reason": "must be ISO 8601", "hint": "2024-05-01"}))
    observe(exp, Observation(ok=False, latency_ms=900, error={"error_type": "unavailable", "reason": "down"}))
    assert not observe(exp, Observation(ok=False, latency_ms=1, error={"error_type": "permission_denied"}))
    assert (exp.calls, exp.failures) == (99, 9)
    assert 10 <= percentile(exp.buckets, 0.5) <= 14 * 1.3 and percentile(exp.buckets, 0.99) >= 14
    assert percentile(exp.buckets, 1.0) >= 900
    assert exp.common_errors()[0]["count"] == 8 and exp.best_arguments() == {"city": ["Paris", "Lyon"]}
    assert note(exp).startswith("91 % success over 99 calls, p50 ")
    assert "common error: validation arguments/date: must be ISO 8601 (hint: 2024-05-01)" in note(exp)
    assert "weather.get 1.0.0" in guide(spec(), exp) and "8× validation `arguments/date`" in guide(spec(), exp)


async def test_a_call_counts_for_the_tool_overall_and_for_its_calling_context() -> None:
    store = FakeExperience()
    await record_call("acme", "weather.get", "trip planning", Observation(ok=True, latency_ms=5), store)
    await record_call("acme", "weather.get", "", Observation(ok=False, latency_ms=5, error={"error_type": "x"}),
                      store)
    [overall] = await tool_stats("acme", store, "weather.get")
    [planning] = await tool_stats("acme", store, "weather.get", "trip planning")
    assert (overall.calls, overall.failures, planning.calls, planning.context) == (2, 1, 1,
                                                                                   context_key("trip planning"))
    assert await tool_stats("other", store, "weather.get") == []


def test_canary_arms_are_sticky_per_caller_and_split_near_the_percentage() -> None:
    rollout = Rollout(name="weather.get", stable="1.0.0", canary="2.0.0", percent=20.0, callers=("agent-vip",))
    arms = [arm_for(rollout, "acme", f"agent-{i}") for i in range(5_000)]
    share = arms.count("canary") / len(arms)
    assert abs(share - 0.20) < 4 * math.sqrt(0.2 * 0.8 / len(arms))  # four standard deviations
    assert all(arm_for(rollout, "acme", f"agent-{i}") == arms[i] for i in range(200))
    assert arm_for(rollout, "acme", "agent-vip") == "canary"
    assert arm_for(replace(rollout, canary=""), "acme", "agent-vip") == "stable"


def test_a_canary_is_rolled_back_only_past_min_calls_and_the_error_rate_margin() -> None:
    rollout = Rollout(name="t", stable="1.0.0", canary="2.0.0", percent=50, max_error_rate_delta=0.2, min_calls=10)
    assert rollback_reason(rollout, ArmCounts(10, 1, 9, 9)) == ""  # too few canary calls yet
    assert rollback_reason(rollout, ArmCounts(10, 1, 10, 3)) == ""  # 30 % vs 10 %: within the margin
    assert "error rate 40%" in rollback_reason(rollout, ArmCounts(10, 1, 10, 4))


class VersionedBackend:
    def __init__(self, failing: set[str]) -> None:
        self.failing, self.calls = failing, []

    async def call(self, s: ToolSpec, arguments: dict, timeout: float) -> dict:
        self.calls.append(s.version)
        if s.version in self.failing:
            raise Unavailable("down", hint="retry")
        return {"version": s.version}


async def test_a_failing_canary_is_rolled_back_automatically_and_its_callers_go_back_to_stable() -> None:
    ports = fake_ports()
    for v in ("1.0.0", "2.0.0"):
        await ports.registry.register(spec(v))
    ports.backends = VersionedBackend(failing={"2.0.0"})
    await handlers.set_canary("weather.get", "2.0.0", ports.registry, percent=50.0, min_calls=5)
    [listed] = await handlers.list_current_tools(ports.registry)
    assert listed.version == "1.0.0"  # the canary is not what agents are offered
    outcomes = [await call_tool(ToolCall("weather.get", {}, agent(i)), ports) for i in range(60)]
    rollout = (await ports.registry.rollouts())["weather.get"]
    assert rollout.state == "rolled_back" and rollout.canary == "" and "error rate 100%" in rollout.reason
    assert 1 <= ports.backends.calls.count("2.0.0") <= 5  # at most min_calls canary calls (its breaker opens)
    assert all(o.version == "1.0.0" for o in outcomes[-20:])


async def test_promote_makes_the_canary_stable_and_rollback_pins_a_version_in_one_call_each() -> None:
    ports = fake_ports()
    for v in ("1.0.0", "1.1.0", "2.0.0"):
        await ports.registry.register(spec(v))
    with pytest.raises(Conflict):
        await handlers.promote_canary("weather.get", ports.registry)
    await handlers.set_canary("weather.get", "2.0.0", ports.registry, percent=0, callers=("agent-1",))
    ports.backends = VersionedBackend(failing=set())
    assert (await call_tool(ToolCall("weather.get", {}, agent(1)), ports)).version == "2.0.0"
    assert (await call_tool(ToolCall("weather.get", {}, agent(2)), ports)).version == "1.1.0"
    assert (await handlers.promote_canary("weather.get", ports.registry)).stable == "2.0.0"
    assert (await call_tool(ToolCall("weather.get", {}, agent(2)), ports)).version == "2.0.0"
    assert (await handlers.roll_back_tool("weather.get", "1.0.0", ports.registry)).stable == "1.0.0"
    assert (await call_tool(ToolCall("weather.get", {}, agent(2)), ports)).version == "1.0.0"
    assert (await call_tool(ToolCall("weather.get", {}, agent(2), version="2.0.0"), ports)).version == "2.0.0"


async def test_get_call_answers_done_with_the_result_failed_or_unknown_by_call_or_chain_id() -> None:
    ports = fake_ports()
    await ports.registry.register(spec())
    ports.backends = VersionedBackend(failing=set())
    outcome = await call_tool(ToolCall("weather.get", {}, agent(), chain_id="action-7"), ports)
    by_chain = await handlers.get_call("acme", "action-7", ports.call_log, ports.results)
    by_id = await handlers.get_call("acme", outcome.call_id, ports.call_log, ports.results)
    assert (by_chain.state, by_chain.result) == ("done", {"version": "1.0.0"})
    assert by_id.record.call_id == outcome.call_id
    assert (await handlers.get_call("other", "action-7", ports.call_log, ports.results)).state == "unknown"
    ports.backends = VersionedBackend(failing={"1.0.0"})
    await call_tool(ToolCall("weather.get", {}, agent(), chain_id="action-8"), ports)
    assert (await handlers.get_call("acme", "action-8", ports.call_log, ports.results)).state == "failed"
    await ports.results.mark_running("acme", "action-9", 5)
    assert (await handlers.get_call("acme", "action-9", ports.call_log, ports.results)).state == "running"


async def test_remove_tool_drops_one_version_or_all() -> None:
    ports = fake_ports()
    for v in ("1.0.0", "2.0.0"):
        await ports.registry.register(spec(v))
    assert await handlers.remove_tool("weather.get", "2.0.0", ports.registry) == ["2.0.0"]
    assert await handlers.remove_tool("weather.get", "", ports.registry) == ["1.0.0"]
    assert await handlers.list_current_tools(ports.registry) == []

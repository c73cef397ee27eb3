"""The one call pipeline, through fakes: every stage refuses or passes in order, and every call is audited."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

from gateway_fakes import fake_ports

from libs.auth import Principal
from libs.errors import Unavailable, ValidationFailed
from services.tool_gateway.domain import BackendFailed, ToolCall, ToolSpec, args_sha256, clean_result
from services.tool_gateway.service_layer.handlers import list_current_tools
from services.tool_gateway.service_layer.pipeline import CallPorts, call_tool

INPUT = {"type": "object", "properties": {"amount": {"type": "number", "exclusiveMinimum": 0}},
         "required": ["amount"]}
AGENT = Principal(subject="agent-1", tenant_id="acme", scopes=frozenset({"tools:call", "tools:read", "pay:send"}))


def spec(name: str = "pay.send", **changes) -> ToolSpec:
    return replace(ToolSpec(name=name, description="Send a payment to a customer.", input_schema=INPUT,
                            scopes=("pay:send",), timeout_seconds=1.0), **changes)


def call(name: str = "pay.send", arguments: dict | None = None, principal: Principal = AGENT, **kw) -> ToolCall:
    return ToolCall(name=name, arguments={"amount": 5} if arguments is None else arguments, principal=principal, **kw)


async def answering(result: dict):
    async def behaviour(arguments: dict) -> dict:
        return result
    return behaviour


def failing(*errors: Exception):
    remaining = list(errors)

    async def behaviour(arguments: dict) -> dict:
        if remaining:
            raise remaining.pop(0)
        return {"ok": True}
    return behaviour


async def ports_with(*specs: ToolSpec, **policy) -> CallPorts:
    ports = fake_ports(**policy)
    for s in specs:
        await ports.registry.register(s)
        ports.backends.behaviours[s.name] = await answering({"paid": True, "name": s.name})
    return ports


async def test_a_valid_call_returns_the_backends_result_and_is_audited_with_its_argument_hash() -> None:
    ports = await ports_with(spec())
    outcome = await call_tool(call(context="refund"), ports)
    assert outcome.error is None and outcome.outcome == "ok"
    assert outcome.result.value == {"paid": True, "name": "pay.send"}
    [record] = ports.call_log.records
    assert (record.tenant_id, record.caller, record.tool, record.version, record.outcome) == \
        ("acme", "agent-1", "pay.send", "1.0.0", "ok")
    assert record.args_sha256 == args_sha256({"amount": 5}) and record.context == "refund"
    assert record.arguments == {"amount": 5}


async def test_an_unknown_tool_is_not_found_on_the_name_and_audited() -> None:
    ports = await ports_with()
    outcome = await call_tool(call("pay.nope"), ports)
    assert (outcome.error.error_type, outcome.error.field) == ("not_found", "name")
    assert ports.call_log.records[0].outcome == "error"


async def test_a_caller_without_the_tools_scope_is_refused_before_the_backend() -> None:
    ports = await ports_with(spec())
    caller = Principal(subject="agent-2", tenant_id="acme", scopes=frozenset({"tools:call"}))
    outcome = await call_tool(call(principal=caller), ports)
    assert outcome.error.error_type == "permission_denied" and "pay:send" in outcome.error.reason
    assert ports.backends.calls == []


async def test_tools_list_hides_tools_whose_scopes_the_caller_lacks() -> None:
    ports = await ports_with(spec(), spec("crm.lookup", scopes=()))
    reader = Principal(subject="r", tenant_id="acme", scopes=frozenset({"tools:read"}))
    assert [s.name for s in await list_current_tools(ports.registry, reader)] == ["crm.lookup"]
    assert [s.name for s in await list_current_tools(ports.registry, AGENT)] == ["crm.lookup", "pay.send"]


async def test_invalid_arguments_are_refused_naming_the_field_and_the_rule() -> None:
    ports = await ports_with(spec())
    outcome = await call_tool(call(arguments={"amount": -3}), ports)
    error = outcome.error
    assert (error.error_type, error.field, error.retryable) == ("validation", "arguments/amount", False)
    assert "-3" in error.reason and "minimum" in error.reason.lower()
    assert ports.backends.calls == []


async def test_past_the_rate_limit_a_call_is_refused_as_retryable_and_never_reaches_the_backend() -> None:
    ports = await ports_with(spec())
    ports.limiter.capacity = 2
    outcomes = [await call_tool(call(), ports) for _ in range(3)]
    assert [o.outcome for o in outcomes] == ["ok", "ok", "error"]
    assert (outcomes[2].error.error_type, outcomes[2].error.retryable) == ("rate_limited", True)
    assert len(ports.backends.calls) == 2


async def test_retryable_failures_are_retried_with_growing_backoff_up_to_the_tools_retries() -> None:
    ports = await ports_with(spec(retries=2), backoff_base=0.1)
    ports.backends.behaviours["pay.send"] = failing(Unavailable("down"), Unavailable("down"))
    outcome = await call_tool(call(), ports)
    assert outcome.outcome == "ok" and outcome.attempts == 3
    assert len(ports.clock.slept) == 2 and all(0 <= s <= 0.1 * 2 ** i for i, s in enumerate(ports.clock.slept))


async def test_a_permanent_failure_is_not_retried() -> None:
    ports = await ports_with(spec(retries=3))
    ports.backends.behaviours["pay.send"] = failing(ValidationFailed("no such account", field="arguments/to"))
    outcome = await call_tool(call(), ports)
    assert outcome.error.error_type == "validation" and len(ports.backends.calls) == 1


async def test_retries_stop_when_exhausted_and_the_last_error_is_returned() -> None:
    ports = await ports_with(spec(retries=1))
    ports.backends.behaviours["pay.send"] = failing(*[Unavailable("down")] * 5)
    outcome = await call_tool(call(), ports)
    assert outcome.error.error_type == "unavailable" and outcome.attempts == 2 and len(ports.backends.calls) == 2


async def test_a_timeout_falls_back_along_the_chain_to_the_first_tool_that_answers() -> None:
    primary = spec("notify.email", fallback=("notify.sms", "notify.chat"), timeout_seconds=0.05, scopes=())
    ports = await ports_with(primary, spec("notify.sms", scopes=()), spec("notify.chat", scopes=()))
    never = asyncio.Event()

    async def hangs(arguments: dict) -> dict:
        await never.wait()
        return {}
    ports.backends.behaviours["notify.email"] = hangs
    ports.backends.behaviours["notify.sms"] = failing(*[Unavailable("sms down")] * 3)
    outcome = await call_tool(call("notify.email"), ports)
    assert (outcome.outcome, outcome.served_by) == ("fallback", "notify.chat")
    assert [name for name, _ in ports.backends.calls] == ["notify.email", "notify.sms", "notify.chat"]
    assert ports.call_log.records[0].outcome == "fallback"


async def test_a_timeout_without_fallback_is_a_retryable_deadline_error() -> None:
    ports = await ports_with(spec(timeout_seconds=0.05))
    never = asyncio.Event()

    async def hangs(arguments: dict) -> dict:
        await never.wait()
        return {}
    ports.backends.behaviours["pay.send"] = hangs
    outcome = await call_tool(call(), ports)
    assert (outcome.outcome, outcome.error.error_type, outcome.error.retryable) == \
        ("timeout", "deadline_exceeded", True)


async def test_the_breaker_opens_after_consecutive_failures_then_half_opens_and_closes_on_a_good_probe() -> None:
    ports = await ports_with(spec())
    ports.backends.behaviours["pay.send"] = failing(*[Unavailable("down")] * 3)
    for _ in range(3):
        assert (await call_tool(call(), ports)).error.error_type == "unavailable"
    refused = await call_tool(call(), ports)
    assert (refused.error.error_type, refused.error.retryable) == ("circuit_open", True)
    assert len(ports.backends.calls) == 3
    ports.clock.now += 11  # past open_seconds: one probe goes through
    assert (await call_tool(call(), ports)).outcome == "ok"
    assert await ports.breakers.state("pay.send@1.0.0") == "closed"


async def test_a_failure_the_caller_caused_does_not_count_against_the_breaker() -> None:
    ports = await ports_with(spec())
    declined = BackendFailed("the upstream tool failed: the user declined")
    declined.caller_side = True  # type: ignore[attr-defined] - as adapters/upstreams.py marks it
    ports.backends.behaviours["pay.send"] = failing(*[declined] * 4)
    outcomes = [await call_tool(call(), ports) for _ in range(4)]
    assert [o.error.error_type for o in outcomes] == ["backend_error"] * 4  # over the 3 failures that open it
    assert await ports.breakers.state("pay.send@1.0.0") == "closed"


async def test_a_result_over_the_cap_is_truncated_and_kept_whole_for_the_caller_tenant() -> None:
    ports = await ports_with(spec(), result_max_bytes=256)
    big = {"rows": [{"id": i, "note": "x" * 20} for i in range(50)]}
    ports.backends.behaviours["pay.send"] = await answering(big)
    outcome = await call_tool(call(), ports)
    assert outcome.result.truncated and outcome.resource_uri == f"mem://step/{outcome.call_id}"
    assert json.loads(ports.results.stored["acme", outcome.call_id]) == big
    assert len(outcome.result.value["preview"].encode()) <= 256


def test_cleaning_drops_nulls_and_noise_fields_and_writes_compact_json() -> None:
    cleaned = clean_result({"a": 1, "b": None, "_links": {"self": "/x"}, "c": [{"d": None, "e": "é"}]}, 1000)
    assert cleaned.text == '{"a":1,"c":[{"e":"é"}]}' and not cleaned.truncated

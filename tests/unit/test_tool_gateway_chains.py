"""Tool chains (requires, resume), status tools on timeout, tasks and cancelled calls, through the pipeline's fakes."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace

import mcp_types as types
import pytest
from gateway_fakes import FakeTasks, fake_ports
from mcp.shared.exceptions import MCPError

from libs.auth import Principal
from libs.errors import DomainError, NotFound, Unavailable, ValidationFailed
from services.tool_gateway.domain import ToolCall, ToolSpec
from services.tool_gateway.domain.chains import Chain, ChainStep, check_requires
from services.tool_gateway.domain.status import DONE, NOT_DONE, RUNNING, status_verdict
from services.tool_gateway.entrypoints.mcp_server import CHAIN_ID_META, chain_id_of
from services.tool_gateway.entrypoints.mcp_tasks import TaskMiddleware
from services.tool_gateway.service_layer import handlers
from services.tool_gateway.service_layer.pipeline import CallPorts, call_tool
from services.tool_gateway.service_layer.tasks import TaskEnded, TaskRunner

AGENT = Principal(subject="agent-1", tenant_id="acme", scopes=frozenset({"tools:call"}))
ANY = {"type": "object"}


def spec(name: str, **changes) -> ToolSpec:
    return replace(ToolSpec(name=name, description=f"The {name} step of a booking.", input_schema=ANY,
                            timeout_seconds=1.0), **changes)


def call(name: str, arguments: dict | None = None, **kw) -> ToolCall:
    return ToolCall(name=name, arguments=arguments or {}, principal=AGENT, **kw)


async def ports_with(*specs: ToolSpec) -> CallPorts:
    ports = fake_ports()
    for s in specs:
        await ports.registry.register(s)

        async def answer(arguments: dict, name: str = s.name) -> dict:
            return {"tool": name, "n": sum(1 for c in ports.backends.calls if c[0] == name)}
        ports.backends.behaviours[s.name] = answer
    return ports


async def slow_job() -> tuple[CallPorts, asyncio.Event]:
    """Ports whose `slow.job` answers {"report": "ready"} once the returned event is set."""
    ports = await ports_with(spec("slow.job", timeout_seconds=30))
    release = asyncio.Event()

    async def slow(arguments: dict) -> dict:
        await release.wait()
        return {"report": "ready"}
    ports.backends.behaviours["slow.job"] = slow
    return ports, release


def hanging():
    never = asyncio.Event()

    async def hangs(arguments: dict) -> dict:
        await never.wait()
        return {}
    return hangs


# Chains -----------------------------------------------------------------------------------------------


async def test_a_tool_whose_requires_are_not_done_in_its_chain_is_refused_then_allowed_once_they_are() -> None:
    ports = await ports_with(spec("trip.quote"), spec("trip.book", requires=("trip.quote",)))
    refused = await call_tool(call("trip.book", chain_id="c-1"), ports)
    assert refused.error.to_dict() == {
        "error_type": "requires_unmet", "field": "chain_id", "retryable": False, "hint": "call trip.quote first with this chain id",
        "reason": "trip.book requires trip.quote done successfully in chain 'c-1' first (no step of this chain is "
                  "known: new, or expired)"}
    assert ports.backends.calls == [] and ports.call_log.records[-1].outcome == "error"
    assert (await call_tool(call("trip.quote", chain_id="c-1"), ports)).outcome == "ok"
    booked = await call_tool(call("trip.book", chain_id="c-1"), ports)
    assert booked.outcome == "ok" and booked.result.value == {"tool": "trip.book", "n": 1}
    # another chain has done nothing
    assert (await call_tool(call("trip.book", chain_id="c-2"), ports)).error.error_type == "requires_unmet"


async def test_a_call_without_a_chain_id_of_a_tool_with_requires_is_refused_naming_the_chain_id() -> None:
    ports = await ports_with(spec("trip.quote"), spec("trip.book", requires=("trip.quote",)))
    refused = await call_tool(call("trip.book"), ports)
    assert (refused.error.error_type, refused.error.field) == ("requires_unmet", "chain_id")
    assert "call trip.quote first" in refused.error.hint


async def test_a_failed_requirement_does_not_count_as_done() -> None:
    ports = await ports_with(spec("trip.quote"), spec("trip.book", requires=("trip.quote",)))

    async def down(arguments: dict) -> dict:
        raise Unavailable("quotes are down")
    ports.backends.behaviours["trip.quote"] = down
    assert (await call_tool(call("trip.quote", chain_id="c-1"), ports)).outcome == "error"
    assert (await call_tool(call("trip.book", chain_id="c-1"), ports)).error.error_type == "requires_unmet"


async def test_a_chain_resumes_after_a_failed_step_without_calling_the_done_steps_again() -> None:
    ports = await ports_with(spec("trip.quote"), spec("trip.hold", requires=("trip.quote",)),
                             spec("trip.pay", requires=("trip.hold",)))
    pay_failures = [Unavailable("payments down")]

    async def pay(arguments: dict) -> dict:
        if pay_failures:
            raise pay_failures.pop()
        return {"paid": arguments["amount"]}
    ports.backends.behaviours["trip.pay"] = pay
    steps = [("trip.quote", {"city": "Oslo"}), ("trip.hold", {"seat": "4A"}), ("trip.pay", {"amount": 90})]
    first = [await call_tool(call(name, args, chain_id="c-9"), ports) for name, args in steps]
    assert [o.outcome for o in first] == ["ok", "ok", "error"]
    again = [await call_tool(call(name, args, chain_id="c-9"), ports) for name, args in steps]
    assert [o.outcome for o in again] == ["replayed", "replayed", "ok"]
    assert [o.replay_of for o in again[:2]] == [first[0].call_id, first[1].call_id]
    assert again[0].result.value == first[0].result.value and again[2].result.value == {"paid": 90}
    assert [name for name, _ in ports.backends.calls] == ["trip.quote", "trip.hold", "trip.pay", "trip.pay"]
    assert [r.outcome for r in ports.call_log.records] == ["ok", "ok", "error", "replayed", "replayed", "ok"]


async def test_a_chain_resumed_twice_calls_each_backend_once_and_keeps_the_first_call() -> None:
    ports = await ports_with(spec("trip.quote"), spec("trip.hold", requires=("trip.quote",)))
    steps = [("trip.quote", {"city": "Oslo"}), ("trip.hold", {"seat": "4A"})]
    first = [await call_tool(call(name, args, chain_id="c-10"), ports) for name, args in steps]
    for _ in range(3):
        again = [await call_tool(call(name, args, chain_id="c-10"), ports) for name, args in steps]
        assert [o.outcome for o in again] == ["replayed", "replayed"]
        assert [o.replay_of for o in again] == [o.call_id for o in first]
    assert [name for name, _ in ports.backends.calls] == ["trip.quote", "trip.hold"]


async def test_a_chain_is_its_callers_own_another_user_of_the_tenant_neither_replays_nor_continues_it() -> None:
    ports = await ports_with(spec("trip.quote"), spec("trip.hold", requires=("trip.quote",)))
    other = Principal(subject="agent-2", tenant_id="acme", scopes=frozenset({"tools:call"}))
    mine = await call_tool(call("trip.quote", {"city": "Oslo"}, chain_id="shared"), ports)
    theirs = await call_tool(ToolCall(name="trip.quote", arguments={"city": "Oslo"}, principal=other,
                                      chain_id="shared"), ports)
    assert (mine.outcome, theirs.outcome, theirs.replay_of) == ("ok", "ok", "")  # not agent-1's kept result
    held = await call_tool(ToolCall(name="trip.hold", arguments={}, principal=replace(other, subject="agent-3"),
                                    chain_id="shared"), ports)
    assert held.error.error_type == "requires_unmet"
    assert (await call_tool(call("trip.quote", {"city": "Oslo"}, chain_id="shared"), ports)).replay_of == mine.call_id


async def test_a_full_chain_refuses_a_new_step_naming_the_chain_but_still_replays_the_steps_it_holds() -> None:
    ports = await ports_with(spec("trip.quote"))
    ports.chains.max_steps = 2
    for city in ("Oslo", "Rome"):
        assert (await call_tool(call("trip.quote", {"city": city}, chain_id="c-full"), ports)).outcome == "ok"
    refused = await call_tool(call("trip.quote", {"city": "Lima"}, chain_id="c-full"), ports)
    assert (refused.error.error_type, refused.error.field, refused.error.retryable) == ("chain_full", "chain_id", False)
    assert "'c-full'" in refused.error.reason and "new chain id" in refused.error.hint
    assert len(ports.backends.calls) == 2  # refused before the backend
    assert (await call_tool(call("trip.quote", {"city": "Rome"}, chain_id="c-full"), ports)).outcome == "replayed"
    assert (await call_tool(call("trip.quote", {"city": "Lima"}, chain_id="c-other"), ports)).outcome == "ok"


async def test_the_same_tool_with_other_arguments_runs_again_in_the_chain() -> None:
    ports = await ports_with(spec("trip.quote"))
    await call_tool(call("trip.quote", {"city": "Oslo"}, chain_id="c-3"), ports)
    other = await call_tool(call("trip.quote", {"city": "Rome"}, chain_id="c-3"), ports)
    assert other.outcome == "ok" and len(ports.backends.calls) == 2


async def test_a_step_whose_kept_result_expired_runs_again() -> None:
    ports = await ports_with(spec("trip.quote"))
    await call_tool(call("trip.quote", chain_id="c-4"), ports)
    ports.results.stored.clear()
    assert (await call_tool(call("trip.quote", chain_id="c-4"), ports)).outcome == "ok"
    assert len(ports.backends.calls) == 2


def test_check_requires_names_the_first_missing_tool_and_ignores_failed_steps() -> None:
    chain = Chain("c", (ChainStep("a.one", "h", "1", "ok", "1"), ChainStep("a.two", "h", "2", "timeout")))
    check_requires(spec("a.three", requires=("a.one",)), "c", chain)
    with pytest.raises(Exception) as refused:
        check_requires(spec("a.three", requires=("a.one", "a.two")), "c", chain)
    assert refused.value.hint == "call a.two first with this chain id"


# Status tools on timeout -----------------------------------------------------------------------------


def test_status_verdicts() -> None:
    assert [status_verdict(a) for a in ({"status": "completed"}, {"state": "in-progress"}, {"done": True},
                                        {"status": "not_found"}, {})] == [DONE, RUNNING, DONE, NOT_DONE, NOT_DONE]


async def status_ports(status: dict | Exception) -> CallPorts:
    ports = await ports_with(spec("pay.send", timeout_seconds=0.05, retries=2, status_tool="pay.status",
                                  fallback=("pay.other",)),
                             spec("pay.status"), spec("pay.other"))
    ports.backends.behaviours["pay.send"] = hanging()

    async def answer(arguments: dict) -> dict:
        if isinstance(status, Exception):
            raise status
        return status
    ports.backends.behaviours["pay.status"] = answer
    return ports


async def test_a_timed_out_call_whose_status_says_done_answers_its_result_without_a_retry() -> None:
    ports = await status_ports({"status": "completed", "result": {"transfer": "t-1"}})
    outcome = await call_tool(call("pay.send", {"amount": 5}), ports)
    assert (outcome.outcome, outcome.served_by, outcome.result.value) == ("ok", "pay.status", {"transfer": "t-1"})
    assert ports.backends.calls == [("pay.send", {"amount": 5}), ("pay.status", {"amount": 5})]


async def test_a_timed_out_call_whose_status_says_running_is_not_retried_nor_falls_back() -> None:
    ports = await status_ports({"status": "pending"})
    outcome = await call_tool(call("pay.send", {"amount": 5}), ports)
    assert (outcome.outcome, outcome.error.error_type, outcome.error.retryable) == ("timeout", "deadline_exceeded", False)
    assert "still running" in outcome.error.reason and "ask pay.status" in outcome.error.hint
    assert [n for n, _ in ports.backends.calls] == ["pay.send", "pay.status"]


async def test_a_timed_out_call_whose_status_cannot_answer_is_not_retried() -> None:
    ports = await status_ports(Unavailable("status down"))
    outcome = await call_tool(call("pay.send", {"amount": 5}), ports)
    assert outcome.error.retryable is False and "unknown" in outcome.error.reason
    assert [n for n, _ in ports.backends.calls] == ["pay.send", "pay.status"]


@pytest.mark.parametrize("status", [{"status": "running"}, {"status": "pending"}, Unavailable("status down")])
async def test_get_call_answers_unknown_not_failed_for_a_timed_out_call_that_may_have_happened(status) -> None:
    ports = await status_ports(status)
    outcome = await call_tool(call("pay.send", {"amount": 5}, chain_id="pay-1"), ports)
    assert (outcome.outcome, outcome.error.retryable) == ("timeout", False)
    for key in (outcome.call_id, "pay-1"):
        state = await handlers.get_call("acme", key, ports.call_log, ports.results)
        assert (state.state, state.record.outcome) == ("unknown", "timeout")


async def test_get_call_answers_failed_for_a_call_that_did_not_happen() -> None:
    ports = await ports_with(spec("pay.plain", timeout_seconds=0.05))
    ports.backends.behaviours["pay.plain"] = hanging()
    outcome = await call_tool(call("pay.plain", {"amount": 5}, chain_id="pay-2"), ports)
    assert (outcome.outcome, outcome.error.retryable) == ("timeout", True)
    assert (await handlers.get_call("acme", "pay-2", ports.call_log, ports.results)).state == "failed"


async def test_the_status_tool_is_asked_only_for_a_caller_allowed_to_call_it() -> None:
    ports = await status_ports({"status": "completed", "result": {"transfer": "t-1"}})
    await ports.registry.register(spec("pay.status", version="2.0.0", scopes=("payments:audit",)))
    outcome = await call_tool(call("pay.send", {"amount": 5}), ports)
    assert (outcome.outcome, outcome.error.retryable) == ("timeout", False)  # not the status tool's result
    assert "permission_denied" in outcome.error.reason and "unknown" in outcome.error.reason
    assert [n for n, _ in ports.backends.calls] == ["pay.send"]
    allowed = replace(AGENT, scopes=frozenset({"tools:call", "payments:audit"}))
    confirmed = await call_tool(ToolCall(name="pay.send", arguments={"amount": 5}, principal=allowed), ports)
    assert (confirmed.outcome, confirmed.result.value) == ("ok", {"transfer": "t-1"})


async def test_a_status_result_that_does_not_match_the_tools_output_schema_leaves_the_state_unknown() -> None:
    ports = await status_ports({"status": "completed", "result": {"transfer": 7}})
    await ports.registry.register(spec("pay.send", version="2.0.0", timeout_seconds=0.05, status_tool="pay.status",
                                       output_schema={"type": "object", "required": ["transfer"],
                                                      "properties": {"transfer": {"type": "string"}}}))
    ports.backends.behaviours["pay.send"] = hanging()
    outcome = await call_tool(call("pay.send", {"amount": 5}), ports)
    assert (outcome.outcome, outcome.error.retryable) == ("timeout", False)
    assert "does not match the output schema of pay.send" in outcome.error.reason
    assert "transfer" in outcome.error.reason


async def test_a_tool_naming_a_status_tool_that_is_not_registered_is_refused_at_registration() -> None:
    ports = await ports_with()
    with pytest.raises(ValidationFailed) as refused:
        await handlers.register_tool(spec("pay.send", status_tool="pay.status"), ports.registry)
    assert refused.value.field == "status_tool" and "register pay.status first" in refused.value.hint
    await handlers.register_tool(spec("pay.status"), ports.registry)
    assert (await handlers.register_tool(spec("pay.send", status_tool="pay.status"), ports.registry)).name == "pay.send"


async def test_a_timed_out_call_whose_status_says_not_done_is_retried_after_each_check() -> None:
    ports = await status_ports({"status": "not_found"})
    outcome = await call_tool(call("pay.send", {"amount": 5}), ports)
    assert [n for n, _ in ports.backends.calls] == ["pay.send", "pay.status"] * 3 + ["pay.other"]
    assert (outcome.outcome, outcome.served_by) == ("fallback", "pay.other")


# Cancellation and tasks -------------------------------------------------------------------------------


async def test_a_cancelled_call_is_audited_as_cancelled() -> None:
    ports = await ports_with(spec("slow.job", timeout_seconds=30))
    ports.backends.behaviours["slow.job"] = hanging()
    running = asyncio.create_task(call_tool(call("slow.job", chain_id="c-5"), ports))
    await asyncio.sleep(0.05)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    await asyncio.sleep(0)
    [record] = ports.call_log.records
    assert (record.tool, record.outcome, record.error["error_type"], record.chain_id) == \
        ("slow.job", "cancelled", "cancelled", "c-5")


async def test_a_task_answers_working_then_completed_with_the_calls_outcome() -> None:
    ports, release = await slow_job()
    runner = TaskRunner(ports, FakeTasks())
    started = await runner.start(call("slow.job"))
    assert (await runner.get(AGENT, started["task_id"]))["state"] == "working"
    release.set()
    ended = await runner.wait(AGENT, started["task_id"], poll_seconds=0.01)
    assert ended["state"] == "completed" and ended["outcome"]["result"] == {"report": "ready"}
    assert ports.call_log.records[0].call_id == ended["outcome"]["call_id"]
    with pytest.raises(NotFound):
        await runner.get(replace(AGENT, tenant_id="other-tenant"), started["task_id"])


async def test_a_task_still_running_when_the_runner_closes_ends_cancelled_and_its_call_is_audited() -> None:
    ports = await ports_with(spec("slow.job", timeout_seconds=30))
    ports.backends.behaviours["slow.job"] = hanging()
    runner = TaskRunner(ports, FakeTasks())
    started = await runner.start(call("slow.job"))
    await asyncio.sleep(0.05)
    await runner.close()
    assert (await runner.get(AGENT, started["task_id"]))["state"] == "cancelled"
    assert [r.outcome for r in ports.call_log.records] == ["cancelled"]


async def test_a_working_task_whose_lease_lapsed_answers_failed_as_lost() -> None:
    ports = await ports_with(spec("slow.job", timeout_seconds=30))
    ports.backends.behaviours["slow.job"] = hanging()
    store = FakeTasks()
    runner = TaskRunner(ports, store)
    started = await runner.start(call("slow.job"))
    assert (await runner.get(AGENT, started["task_id"]))["state"] == "working"
    store.leases.clear()  # as when the replica running it died: nobody renews it
    lost = await runner.get(AGENT, started["task_id"])
    assert lost["state"] == "failed" and lost["lost"] and "stopped before it ended" in lost["status_message"]
    await runner.close()


async def test_a_cancelled_task_ends_cancelled_and_cannot_be_cancelled_again() -> None:
    ports = await ports_with(spec("slow.job", timeout_seconds=30))
    ports.backends.behaviours["slow.job"] = hanging()
    runner = TaskRunner(ports, FakeTasks())
    started = await runner.start(call("slow.job"))
    await asyncio.sleep(0.05)
    cancelled = await runner.cancel_task(AGENT, started["task_id"])
    assert cancelled["state"] == "cancelled"
    await asyncio.sleep(0)
    assert [r.outcome for r in ports.call_log.records] == ["cancelled"]
    with pytest.raises(TaskEnded):
        await runner.cancel_task(AGENT, started["task_id"])


async def test_a_task_is_its_callers_another_user_of_the_tenant_or_a_token_without_tools_call_cannot_see_it() -> None:
    ports = await ports_with(spec("slow.job", timeout_seconds=30))
    ports.backends.behaviours["slow.job"] = hanging()
    runner = TaskRunner(ports, FakeTasks())
    task_id = (await runner.start(call("slow.job")))["task_id"]
    for stranger in (replace(AGENT, subject="agent-2"), replace(AGENT, scopes=frozenset({"tools:read"}))):
        for ask in (runner.get(stranger, task_id), runner.wait(stranger, task_id, timeout_seconds=0),
                    runner.cancel_task(stranger, task_id)):
            with pytest.raises(NotFound) as refused:
                await ask
            assert refused.value.field == "task_id"
    assert (await runner.get(AGENT, task_id))["state"] == "working"  # not cancelled by the stranger
    admin = Principal(subject="ops", tenant_id="acme", scopes=frozenset({"tools:call", "tools:admin"}))
    assert (await runner.get(admin, task_id))["caller"] == "agent-1"
    await runner.close()


@pytest.mark.parametrize("task_id", ["", "x" * 32, "ABCDEF" + "0" * 26, "0" * 31, "0" * 32 + ".lease", "../0"])
async def test_a_task_id_that_is_not_one_is_refused_naming_the_field(task_id: str) -> None:
    runner = TaskRunner(await ports_with(), FakeTasks())
    with pytest.raises(ValidationFailed) as refused:
        await runner.get(AGENT, task_id)
    assert refused.value.field == "task_id"


async def test_a_task_answered_lost_stays_failed_when_its_replica_ends_it_later() -> None:
    ports, release = await slow_job()
    store = FakeTasks()
    runner = TaskRunner(ports, store)
    task_id = (await runner.start(call("slow.job")))["task_id"]
    store.leases.clear()  # the lease lapsed (the replica was cut off from Redis for a while)
    assert (await runner.get(AGENT, task_id))["lost"] is True
    release.set()
    await asyncio.sleep(0.05)  # the call ends, and its replica tries to save "completed"
    ended = await runner.get(AGENT, task_id)
    assert (ended["state"], ended["lost"]) == ("failed", True) and "outcome" not in ended
    assert [r.outcome for r in ports.call_log.records] == ["ok"]  # the call itself is audited all the same


async def test_a_task_call_refused_before_its_backend_is_refused_at_once_with_no_task_made() -> None:
    ports = await ports_with(spec("slow.job", input_schema={"type": "object", "required": ["month"]}),
                             spec("admin.job", scopes=("ops:run",)))
    store = FakeTasks()
    runner = TaskRunner(ports, store)
    for refused_call, error_type in ((call("no.such"), "not_found"), (call("slow.job", {}), "validation"),
                                     (call("admin.job", {}), "permission_denied")):
        with pytest.raises(DomainError) as refused:
            await runner.start(refused_call)
        assert refused.value.error_type == error_type
    ports.limiter.capacity = 0
    with pytest.raises(DomainError) as limited:
        await runner.start(call("slow.job", {"month": "2026-11"}))
    assert limited.value.error_type == "rate_limited"
    assert store.saved == {} and ports.backends.calls == []
    assert [r.outcome for r in ports.call_log.records] == ["error"] * 4  # refusals audited as for CallTool


async def test_a_caller_may_have_so_many_working_tasks_at_once_others_are_not_counted() -> None:
    ports = await ports_with(spec("slow.job", timeout_seconds=30))
    ports.backends.behaviours["slow.job"] = hanging()
    store = FakeTasks()
    runner = TaskRunner(ports, store, max_working_per_caller=2)
    first = await runner.start(call("slow.job"))
    await runner.start(call("slow.job"))
    with pytest.raises(DomainError) as full:
        await runner.start(call("slow.job"))
    assert (full.value.error_type, full.value.field) == ("rate_limited", "as_task")
    assert "2 working tasks" in full.value.reason
    other = Principal(subject="agent-2", tenant_id="acme", scopes=frozenset({"tools:call"}))
    assert (await runner.start(ToolCall(name="slow.job", arguments={}, principal=other)))["state"] == "working"
    assert (await runner.cancel_task(AGENT, first["task_id"]))["state"] == "cancelled"
    assert (await runner.start(call("slow.job")))["state"] == "working"  # one ended: room again
    await runner.close()


@pytest.mark.parametrize("value", ["a\u200bb", "a\x07", "x" * 129, 7])
def test_an_mcp_chain_id_follows_the_identifier_rule_of_grpc(value) -> None:
    params = types.CallToolRequestParams(name="trip.quote", arguments={}, _meta={CHAIN_ID_META: value})
    with pytest.raises(ValidationFailed) as refused:
        chain_id_of(params)
    assert refused.value.field == "_meta/mnemesh/chain_id"


def test_an_mcp_chain_id_that_grpc_takes_is_taken_too() -> None:
    value = "trip\u00a01"  # a no-break space: an identifier for gRPC (check_identifier), not str.isprintable
    params = types.CallToolRequestParams(name="trip.quote", arguments={}, _meta={CHAIN_ID_META: value})
    assert chain_id_of(params) == value


async def test_a_malformed_task_call_is_refused_with_a_structured_error_naming_the_field() -> None:
    middleware = TaskMiddleware(TaskRunner(await ports_with(), FakeTasks()), lambda ctx: AGENT, chain_id_of,
                                lambda error: None)
    ctx = SimpleNamespace(method="tools/call", protocol_version="2025-11-25",
                          params={"name": "trip.quote", "arguments": ["not", "an", "object"], "task": {"ttl": 1000}})
    with pytest.raises(MCPError) as refused:
        await middleware(ctx, None)
    assert refused.value.error.data["error_type"] == "validation"
    assert refused.value.error.data["field"] == "params/arguments"
    assert "pydantic" not in refused.value.error.message.lower()

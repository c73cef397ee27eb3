"""One run at a time per chain step: a step running now refuses the same step of its chain, through the pipeline's
fakes; the hold is let go whatever the outcome; over gRPC the refusal is ABORTED."""

from __future__ import annotations

import asyncio

import grpc
from test_tool_gateway_chains import call, ports_with, spec

from libs.errors import Unavailable
from libs.rpc.status import status_for
from services.tool_gateway.domain.chains import step_running
from services.tool_gateway.service_layer.pipeline import call_tool


async def test_a_step_running_now_refuses_the_same_step_of_the_chain_which_then_replays_once_it_ended() -> None:
    ports = await ports_with(spec("trip.pay"))
    release = asyncio.Event()

    async def pay(arguments: dict) -> dict:
        if arguments["amount"] == 90:
            await release.wait()
        return {"paid": arguments["amount"]}
    ports.backends.behaviours["trip.pay"] = pay
    running = asyncio.create_task(call_tool(call("trip.pay", {"amount": 90}, chain_id="c-11"), ports))
    await asyncio.sleep(0)
    while not ports.backends.calls:
        await asyncio.sleep(0.01)
    twice = await call_tool(call("trip.pay", {"amount": 90}, chain_id="c-11"), ports)
    assert twice.error is not None and twice.error.error_type == "step_running" and twice.error.retryable
    assert twice.error.field == "chain_id" and "trip.pay" in twice.error.reason
    other = await call_tool(call("trip.pay", {"amount": 91}, chain_id="c-11"), ports)  # another step: not held
    assert other.outcome == "ok" and other.result.value == {"paid": 91}
    release.set()
    first = await running
    assert first.outcome == "ok" and ports.chains.held == {}
    again = await call_tool(call("trip.pay", {"amount": 90}, chain_id="c-11"), ports)
    assert again.outcome == "replayed" and again.replay_of == first.call_id
    assert [args for name, args in ports.backends.calls if name == "trip.pay"].count({"amount": 90}) == 1


async def test_a_refused_or_failed_step_lets_go_of_its_hold() -> None:
    ports = await ports_with(spec("trip.pay"))

    async def down(arguments: dict) -> dict:
        raise Unavailable("payments down")
    ports.backends.behaviours["trip.pay"] = down
    failed = await call_tool(call("trip.pay", {"amount": 90}, chain_id="c-12"), ports)
    assert failed.outcome == "error" and ports.chains.held == {}
    ports.limiter.capacity = 0  # every call is rate limited now
    refused = await call_tool(call("trip.pay", {"amount": 90}, chain_id="c-12"), ports)
    assert refused.error is not None and refused.error.error_type == "rate_limited" and ports.chains.held == {}


def test_a_running_step_is_answered_aborted_over_grpc_with_its_error_detail() -> None:
    code, message, trailers = status_for(step_running("c-1", "trip.pay"))
    assert code == grpc.StatusCode.ABORTED and message.startswith("chain_id: ") and trailers

"""The orchestrator's loop against the real tool-gateway (gRPC, PostgreSQL, Redis) and a real HTTP backend:
a timed-out tool call is verified with the gateway's record of it (GetCall by the step id the orchestrator
gave it as chain id) before anything is retried.

"The answer was lost, not the work" is made real with a TCP proxy between the orchestrator and the
gateway that delivers the gateway's answer late: the orchestrator's gRPC deadline passes, the gateway
finished the call. The sessions live in PostgreSQL (the event store), as in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
import grpc
import httpx2
import pytest
import test_mcp
from lossy_proxy import LossyProxy, lossy_proxy
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from test_mcp import Gateway, register

from libs.auth import issue_token
from libs.db import Database
from libs.eventstore import EventStore
from libs.http import serve_asgi
from libs.outbox import Outbox
from libs.snapshots import SnapshotStore
from mnemesh.infra import free_port
from services.orchestrator.adapters.grpc_ports import GrpcToolGateway
from services.orchestrator.adapters.local import LocalMemory
from services.orchestrator.adapters.repository import EventSourcedSessions
from services.orchestrator.adapters.rules_file import RulesFile
from services.orchestrator.domain import ActionFinished, ActionStarted, Outcome, Session, State, TaskEnded
from services.orchestrator.service_layer.agent import Agent
from services.orchestrator.service_layer.handlers import SendMessage, send_message

pytestmark = pytest.mark.integration
gateway = test_mcp.gateway
DEADLINE = 0.5  # the orchestrator's tool deadline; its gRPC deadline is this + 1 s
ORDER_INPUT = {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}


@dataclass
class Orders:
    """A real HTTP order service; the first `slow_first` calls take `slow_seconds`."""

    port: int
    calls: list[str] = field(default_factory=list)
    slow_first: int = 0
    slow_seconds: float = 0.0
    hang: bool = False  # answer only when the caller has gone (then record that it went)
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    refuse: bool = False  # answer 403: the gateway's backend_error, not retryable

    @property
    def backend(self) -> str:
        return f"http:GET http://127.0.0.1:{self.port}/orders/{{order_id}}"


@pytest.fixture
async def orders() -> AsyncIterator[Orders]:
    state = Orders(free_port())

    async def order(request: Request) -> JSONResponse:
        state.calls.append(request.path_params["order_id"])
        if state.refuse:
            return JSONResponse({"error": "this order belongs to another customer"}, 403)
        while state.hang:  # the upstream of a call the caller cancels: it sees the connection go
            if await request.is_disconnected():
                state.gone.set()
                return JSONResponse({}, 499)
            await asyncio.sleep(0.02)
        if len(state.calls) <= state.slow_first:
            await asyncio.sleep(state.slow_seconds)
        return JSONResponse({"order_id": request.path_params["order_id"], "status": "shipped", "eta": "2026-03-14"})

    app = Starlette(routes=[Route("/orders/{order_id}", order), Route("/up", lambda _r: JSONResponse({}))])
    task = asyncio.create_task(serve_asgi(app, host="127.0.0.1", port=state.port, port_setting="test orders"))
    async with httpx2.AsyncClient(timeout=2) as http:
        with anyio.fail_after(20):
            while True:
                with contextlib.suppress(httpx2.TransportError):
                    await http.get(f"http://127.0.0.1:{state.port}/up")
                    break
                await anyio.sleep(0.05)
    yield state
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@dataclass
class Loop:
    agent: Agent
    sessions: EventSourcedSessions
    proxy: LossyProxy
    port: GrpcToolGateway

    async def say(self, text: str, session_id: str) -> Session:
        return await send_message(SendMessage("acme", "u1", session_id, "web", text), self.sessions, self.agent)

    async def events(self, session_id: str, kind: type) -> list:
        return [v.event for v in await self.sessions.history("acme", session_id) if isinstance(v.event, kind)]


@pytest.fixture
async def loop(gateway: Gateway, orders: Orders, db: Database) -> AsyncIterator[Loop]:
    await register(gateway, "orders.get_status", input_schema=ORDER_INPUT, backend=orders.backend, timeout_seconds=60)
    sessions = EventSourcedSessions(db, EventStore(db, stream_poll_seconds=0.2), Outbox(db), SnapshotStore(100))
    memory = LocalMemory()

    def issue(tenant_id: str, scopes: list[str]) -> str:
        return issue_token(gateway.settings, subject="orchestrator", tenant_id=tenant_id, scopes=scopes)

    async with lossy_proxy(gateway.grpc) as proxy, grpc.aio.insecure_channel(proxy.address) as ch:
        port = GrpcToolGateway(ch, issue)
        assert "orders.get_status" in [t.name for t in await port.list_tools("acme")]  # the channel is up
        agent = Agent(sessions, RulesFile(), memory, port, memory, tool_deadline_seconds=DEADLINE,
                      lease_seconds=30, verify_seconds=3)
        yield Loop(agent, sessions, proxy, port)


async def test_a_call_whose_answer_was_lost_is_found_done_at_the_gateway_and_not_called_again(
        loop: Loop, orders: Orders) -> None:
    # The gateway's answer reaches the orchestrator 2 s late: after its gRPC deadline (0.5 + 1 s).
    loop.proxy.hold("responses", delay=2.0, window=1.0)
    session = await loop.say("Where is order A12345?", "lost-answer")

    assert orders.calls == ["A12345"]  # the work was done once, and never repeated
    [started] = await loop.events("lost-answer", ActionStarted)
    [finished] = await loop.events("lost-answer", ActionFinished)
    assert (finished.action_id, finished.outcome) == (started.action_id, Outcome.OK)
    assert finished.reason == "timed out; the backend's status says done"  # it did time out, then was verified
    assert json.loads(finished.result_json)["status"] == "shipped"
    assert session.state == State.IDLE
    assert session.messages[-1].text == "Order A12345 is shipped; expected delivery 2026-03-14."
    # What the orchestrator read is the gateway's own record of the call under the step id.
    status = await loop.port.status("acme", started.action_id)
    assert (status.state, status.result["order_id"]) == ("done", "A12345")


async def test_a_call_the_gateway_says_failed_is_retried_once_verified(loop: Loop, orders: Orders) -> None:
    # The first call outlives the deadline at the gateway: it times out there, and GetCall says failed.
    orders.slow_first, orders.slow_seconds = 1, 1.5
    session = await loop.say("Where is order B24680?", "failed-call")

    first, second = await loop.events("failed-call", ActionFinished)
    assert (first.outcome, first.reason) == (Outcome.TIMEOUT, "timed out; the backend's status says failed")
    assert (second.outcome, second.reason) == (Outcome.OK, "tool answered")
    assert orders.calls == ["B24680", "B24680"]  # retried only after the gateway said the first one failed
    assert (await loop.port.status("acme", first.action_id)).state == "failed"
    assert session.messages[-1].text == "Order B24680 is shipped; expected delivery 2026-03-14."


async def test_a_call_the_gateway_says_is_not_retryable_is_handed_to_a_person_not_called_again(
        loop: Loop, orders: Orders) -> None:
    orders.refuse = True  # the backend refuses: a 4xx, which the gateway maps to a non-retryable backend_error
    session = await loop.say("Where is order C13579?", "refused-call")

    assert orders.calls == ["C13579"]  # once: neither the gateway nor the orchestrator called it again
    [finished] = await loop.events("refused-call", ActionFinished)
    assert finished.outcome == Outcome.ERROR and finished.do_not_retry  # read back from PostgreSQL
    [ended] = await loop.events("refused-call", TaskEnded)
    assert ended.outcome == Outcome.ESCALATED and "orders.get_status must not be called again" in ended.reason
    assert session.state == State.ESCALATE_TO_HUMAN


async def test_a_call_with_no_record_at_the_gateway_is_not_taken_for_done(loop: Loop) -> None:
    status = await loop.port.status("acme", "no-such-step")
    assert status.state == "unknown" and status.result == {}


@pytest.mark.parametrize("stop", ["forget it", "算了"])
async def test_a_hard_stop_from_another_device_cancels_the_call_in_flight_down_to_the_upstream(
        loop: Loop, orders: Orders, stop: str) -> None:
    orders.hang = True
    loop.agent.tool_deadline_seconds = 20  # the call would run long; only the stop ends it
    turn = asyncio.create_task(loop.say("Where is order A12345?", "stopped"))
    with anyio.fail_after(10):
        while not orders.calls:  # the call reached the upstream through the gateway
            await anyio.sleep(0.02)
    stopped = await send_message(SendMessage("acme", "u1", "stopped", "phone", stop), loop.sessions, loop.agent)
    with anyio.fail_after(3):  # well before any deadline (the tool's 60 s, the call's 20 s)
        await orders.gone.wait()  # the cancellation reached the gateway, and from it the upstream
        session = await turn
    assert stopped.state == session.state == State.IDLE and session.task is None
    [finished] = await loop.events("stopped", ActionFinished)
    [ended] = await loop.events("stopped", TaskEnded)
    assert finished.outcome == Outcome.CANCELLED and ended.outcome == Outcome.CANCELLED
    assert orders.calls == ["A12345"]  # and nothing called it again
    assert (await loop.port.status("acme", finished.action_id)).state != "done"

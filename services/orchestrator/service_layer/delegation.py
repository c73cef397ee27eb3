"""Agent to agent: a call to another agent with an expected outcome, verified, and compensated on a mismatch.

The caller records the outcome it expects as a memory first and sends that memory's id with the call
(`mnemesh.expected_memory_id`); the callee records its actual outcome as a memory derived from the
expectation and answers with its id (`mnemesh.actual_memory_id`). The caller compares the two; a mismatch,
an unrecorded outcome or no answer at all runs the compensation the call declared (a tool, through the
gateway). Every step is an event of the caller's session: DelegationStarted, DelegationAnswered,
DelegationChecked, CompensationFinished.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, TypeVar

from libs.errors import ValidationFailed
from libs.validation import check_session_id, check_tenant_id
from services.orchestrator.domain import (
    CompensationFinished,
    DelegationAnswered,
    DelegationChecked,
    DelegationStarted,
    Session,
    SessionEvent,
)
from services.orchestrator.service_layer.ports import MemoryWriter, SessionRepository, ToolGateway

__all__ = ["DEPTH_KEY", "EXPECTED_KEY", "MAX_DEPTH", "AgentAnswer", "AgentClient", "Compensation", "Delegate",
           "Delegated", "Expectation", "OutcomeRecorder", "delegate", "delegation_depth", "until_stopped"]

EXPECTED_KEY = "mnemesh.expected_memory_id"
ACTUAL_KEY = "mnemesh.actual_memory_id"
# How many delegations deep the turn being served is (0: a user's own message): sent along +1 with each
# delegation, and an agent refuses a message deeper than MAX_DEPTH, so agents that delegate to each other
# (or one to itself, by a rules mistake) cannot call round forever.
DEPTH_KEY = "mnemesh.delegation_depth"
MAX_DEPTH = 3
delegation_depth: ContextVar[int] = ContextVar("delegation_depth", default=0)
T = TypeVar("T")


@dataclass(frozen=True)
class AgentAnswer:
    reply: str
    metadata: dict[str, Any] = field(default_factory=dict)


class AgentClient(Protocol):
    """Another agent (A2A): send one message in a context, get its answer and metadata back."""

    async def send(self, agent: str, tenant_id: str, context_id: str, text: str,
                   metadata: dict[str, Any]) -> AgentAnswer: ...


@dataclass(frozen=True)
class Expectation:
    state: str = "IDLE"                      # the callee's session state after the turn (IDLE: it finished)
    reply_contains: tuple[str, ...] = ()     # facts the reply must carry

    def problems(self, actual: dict[str, Any]) -> list[str]:
        found = []
        if self.state and actual.get("state") != self.state:
            found.append(f"state is {actual.get('state') or 'unknown'}, expected {self.state}")
        reply = str(actual.get("reply", ""))
        found += [f"the reply does not carry {fact!r}" for fact in self.reply_contains if fact not in reply]
        return found


@dataclass(frozen=True)
class Compensation:
    tool: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Delegate:
    tenant_id: str
    user_id: str
    session_id: str          # the caller's session: where the steps are recorded
    agent: str               # the callee's A2A URL
    text: str
    expected: Expectation
    compensation: Compensation
    context_id: str = ""     # the callee's context (its session); empty: one per delegation


@dataclass(frozen=True)
class Delegated:
    delegation_id: str
    matched: bool
    reasons: tuple[str, ...] = ()
    compensated: str = ""    # the compensation's outcome when it ran: ok, error, timeout
    taken_over: bool = False  # another runner took the turn over meanwhile: this one stopped recording


def _check(cmd: Delegate) -> None:
    check_tenant_id(cmd.tenant_id, "tenant_id")
    check_session_id(cmd.session_id, "session_id")
    if not cmd.agent.startswith(("http://", "https://")):
        raise ValidationFailed("must be the callee's A2A URL (http:// or https://)", field="agent")
    if not cmd.text.strip():
        raise ValidationFailed("must not be empty", field="text")
    if not cmd.compensation.tool:
        raise ValidationFailed("a delegation declares its compensation tool", field="compensation.tool",
                               hint="name the tool that undoes or reports a failed delegation")


async def delegate(cmd: Delegate, sessions: SessionRepository, memory: MemoryWriter, agents: AgentClient,
                   gateway: ToolGateway, deadline_seconds: float = 10.0,
                   stopped: Callable[[], Awaitable[None]] | None = None, answer_seconds: float = 30.0) -> Delegated:
    """`stopped`, when given, returns when the caller's task is stopped (a hard stop): the call to the agent is
    then cancelled, and since what the agent did is unknown, the compensation runs. The agent has
    `answer_seconds` to answer (else it did not answer); the compensation, `deadline_seconds`.

    A runner whose turn another runner took over (its lease ran out: a TurnRecovered of the task) stops where it
    is: it appends nothing more and runs no compensation; the runner that took over hands the task to a person."""
    _check(cmd)
    delegation_id = str(uuid.uuid4())
    expected_json = json.dumps(asdict(cmd.expected), ensure_ascii=False, sort_keys=True)
    expected_id = await memory.record_outcome(
        cmd.tenant_id, cmd.user_id, cmd.session_id, f"expected outcome of {cmd.agent}: {expected_json}",
        tags=("a2a:expected",), derived_from=(), idempotency_key=f"{delegation_id}:expected")
    session = await sessions.load(cmd.tenant_id, cmd.session_id)
    task_id = session.task.task_id if session.task else ""
    lease = _Lease(task_id, session.task.recoveries if session.task else 0)

    async def record(event: SessionEvent) -> None:
        await sessions.update(cmd.tenant_id, cmd.session_id, lease.guard(event))
        if lease.lost:
            raise _LeaseLost

    try:
        return await _run(cmd, delegation_id, expected_id, expected_json, task_id, record, agents, gateway,
                          deadline_seconds, stopped, answer_seconds)
    except _LeaseLost:
        return Delegated(delegation_id, False, ("another runner took the turn over (its lease ran out)",),
                         taken_over=True)


async def _run(cmd: Delegate, delegation_id: str, expected_id: str, expected_json: str, task_id: str,
               record: Callable[[SessionEvent], Awaitable[None]], agents: AgentClient, gateway: ToolGateway,
               deadline_seconds: float, stopped: Callable[[], Awaitable[None]] | None,
               answer_seconds: float) -> Delegated:
    await record(DelegationStarted(delegation_id, task_id, cmd.agent, cmd.text, expected_json, expected_id,
                                   json.dumps(asdict(cmd.compensation), ensure_ascii=False, sort_keys=True)))
    sending = agents.send(cmd.agent, cmd.tenant_id, cmd.context_id or delegation_id, cmd.text,
                          {EXPECTED_KEY: expected_id, DEPTH_KEY: delegation_depth.get() + 1})
    try:
        async with asyncio.timeout(answer_seconds):
            answer = await until_stopped(sending, stopped)
    except TimeoutError:
        reasons = [f"the agent did not answer within {answer_seconds:g} s"]
        await record(DelegationAnswered(delegation_id, "", reason=reasons[0]))
    except (OSError, RuntimeError, ValueError) as exc:
        reasons = [f"the agent did not answer: {exc}"[:500]]
        await record(DelegationAnswered(delegation_id, "", reason=reasons[0]))
    else:
        if answer is None:
            reasons = ["the agent did not answer: the task was stopped while the agent worked: the call was cancelled"]
            await record(DelegationAnswered(delegation_id, "", reason=reasons[0]))
        else:
            actual = {"state": answer.metadata.get("mnemesh.state", ""), "reply": answer.reply}
            actual_id = str(answer.metadata.get(ACTUAL_KEY, ""))
            await record(DelegationAnswered(delegation_id, answer.reply, json.dumps(actual, ensure_ascii=False),
                                            actual_id))
            reasons = cmd.expected.problems(actual)
            if not actual_id:
                reasons.append("the agent recorded no actual outcome")
    await record(DelegationChecked(delegation_id, not reasons, "; ".join(reasons) or "as expected"))
    if not reasons:
        return Delegated(delegation_id, True)
    result = await gateway.call(cmd.tenant_id, cmd.user_id, cmd.session_id, cmd.compensation.tool,
                                cmd.compensation.arguments, f"{delegation_id}:compensation", deadline_seconds)
    outcome = "ok" if result.ok else "timeout" if result.timed_out else "error"
    await record(CompensationFinished(delegation_id, cmd.compensation.tool, outcome,
                                      json.dumps(result.result, ensure_ascii=False, sort_keys=True), result.reason))
    return Delegated(delegation_id, False, tuple(reasons), outcome)


@dataclass
class _Lease:
    """The task this runner delegates for and how many take-overs it has seen: a take-over since means it lost
    the turn. (No task: a delegation outside the loop, recorded as it goes; a task that ended meanwhile, by a
    stop, keeps its delegation's steps recorded.)"""

    task_id: str
    recoveries: int
    lost: bool = False

    def guard(self, event: SessionEvent) -> Callable[[Session], list[SessionEvent]]:
        def decide(current: Session) -> list[SessionEvent]:
            task = current.task
            self.lost = bool(self.task_id) and task is not None and task.task_id == self.task_id \
                and task.recoveries != self.recoveries
            return [] if self.lost else [event]
        return decide


class _LeaseLost(Exception):
    pass


async def until_stopped(call: Awaitable[T], stopped: Callable[[], Awaitable[None]] | None) -> T | None:
    """The call's result, or None when `stopped` returned first (the call is then cancelled). Shared by the
    agent's tool calls and its delegations: whatever the session says stops a step cancels the work in flight."""
    calling = asyncio.ensure_future(call)
    if stopped is None:
        return await calling
    watching = asyncio.ensure_future(stopped())
    try:
        await asyncio.wait({calling, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for job in (calling, watching):
            if not job.done():
                job.cancel()
        await asyncio.gather(calling, watching, return_exceptions=True)
    if calling.cancelled() or (watching.done() and not watching.cancelled()):
        return None
    return calling.result()


class OutcomeRecorder:
    """The callee's side: its actual outcome, recorded as a memory derived from the caller's expectation."""

    def __init__(self, memory: MemoryWriter) -> None:
        self.memory = memory

    async def record_actual(self, tenant_id: str, user_id: str, session_id: str, expected_memory_id: str,
                            session: Session) -> str:
        reply = next((m.text for m in reversed(session.messages) if m.role == "assistant"), "")
        actual = json.dumps({"state": str(session.state), "reply": reply, "version": session.version},
                            ensure_ascii=False, sort_keys=True)
        return await self.memory.record_outcome(
            tenant_id, user_id, session_id, f"actual outcome: {actual}", tags=("a2a:actual",),
            derived_from=(expected_memory_id[:128],), idempotency_key=f"{expected_memory_id[:100]}:actual")

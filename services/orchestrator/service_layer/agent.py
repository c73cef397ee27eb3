"""The agent loop: drive a session's task through its states, one step per state, each step an append.

A step does its I/O (rules, memory, tools, a model) outside the session lock, then appends its
events only if the session is still on the same task in the same state (`busy_with`): an
interrupt that arrived meanwhile wins and the step's work is dropped. A tool call is raced
against the session's own stream, so a hard stop appended by any replica, on any device,
cancels the call in flight (the cancellation reaches the gateway as a gRPC cancel).

A turn outlives the request that started it: `run_turn` keeps running when the caller goes away
(a cancelled Send), and a turn whose runner died with its process is taken over by the next
runner that finds it stalled for longer than `lease_seconds` (`_recover`, a `TurnRecovered` event).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from libs.logs import get_logger
from libs.tokens import packaged_tokenizer
from services.orchestrator.domain import (
    ActionFinished,
    ActionStarted,
    DecisionMade,
    Handling,
    MessageAppended,
    Outcome,
    Session,
    SessionEvent,
    SlotFilled,
    State,
    StateChanged,
    TaskEnded,
    TurnRecovered,
)
from services.orchestrator.domain.context import Budget, ContextInput, TokenCounter, build_context
from services.orchestrator.domain.grounding import Source, check_reply
from services.orchestrator.domain.interrupts import InterruptDetector
from services.orchestrator.domain.rulebook import RuleBook
from services.orchestrator.service_layer.delegation import (
    AgentClient,
    until_stopped,
)
from services.orchestrator.service_layer.delegation_routing import DelegationRouting
from services.orchestrator.service_layer.planner import DECISION_PROMPT, decide_open_question
from services.orchestrator.service_layer.ports import (
    CallStatus,
    DecisionMaker,
    MemoryWriter,
    Retriever,
    SessionRepository,
    ToolGateway,
    ToolResult,
)
from services.orchestrator.service_layer.slot_confirmation import CONFIRMED, SlotConfirmation
from services.orchestrator.service_layer.templating import fill as _fill
from services.orchestrator.service_layer.templating import plain as _plain

__all__ = ["MAX_TRIES", "Agent"]

log = get_logger(__name__)
MAX_TRIES = 3
_MAX_STEPS = 64  # a task that has not settled after this many steps is a bug, not a loop to keep running


@dataclass
class Agent(SlotConfirmation, DelegationRouting):
    sessions: SessionRepository
    rules: Callable[[], RuleBook]
    retriever: Retriever
    gateway: ToolGateway
    memory: MemoryWriter
    llm: DecisionMaker | None = None
    tool_deadline_seconds: float = 10.0
    lease_seconds: float = 60.0  # a busy turn that has not moved for this long has lost its runner
    # A timed-out call the gateway says is still running is asked about again for this long before it
    # counts as not done (and may be retried).
    verify_seconds: float = 5.0
    agents: AgentClient | None = None  # other agents (A2A) a rule or a decision may delegate to
    delegation_seconds: float = 30.0  # how long an agent delegated to has to answer (then its compensation runs)
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep  # with `clock`: a test's own time
    counter: TokenCounter = field(default_factory=packaged_tokenizer)  # a real tokenizer, from a package
    budget: Budget = field(default_factory=Budget)
    _detector: tuple[RuleBook, InterruptDetector] | None = field(default=None, repr=False)
    _turns: set[asyncio.Task] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        if self.lease_seconds <= self.tool_deadline_seconds + self.verify_seconds:
            raise ValueError(f"lease_seconds ({self.lease_seconds}) must exceed the tool deadline "
                             f"({self.tool_deadline_seconds}) plus verify_seconds ({self.verify_seconds}): a call "
                             "in flight or being verified would look like a dead runner")
        if self.agents is not None and self.lease_seconds <= self.delegation_seconds + self.tool_deadline_seconds:
            raise ValueError(f"lease_seconds ({self.lease_seconds}) must exceed delegation_seconds "
                             f"({self.delegation_seconds}) plus the compensation's deadline, the tool deadline "
                             f"({self.tool_deadline_seconds}): a delegation in flight would look like a dead runner")

    async def run_turn(self, tenant_id: str, session_id: str, user_id: str = "") -> Session:
        """`advance`, carried on to its end even when the caller stops waiting (a client cancelling Send)."""
        turn = asyncio.ensure_future(self.advance(tenant_id, session_id, user_id))
        self._turns.add(turn)
        turn.add_done_callback(self._turn_done)
        return await asyncio.shield(turn)

    def _turn_done(self, turn: asyncio.Task) -> None:
        self._turns.discard(turn)
        if not turn.cancelled() and turn.exception() is not None:  # retrieved here when nobody awaits it
            log.error("a turn failed after its caller left; the lease recovers it",
                      error=f"{type(turn.exception()).__name__}: {turn.exception()}")

    async def drain(self, grace_seconds: float = 10.0) -> None:
        """At shutdown: let running turns finish for a while, then stop them (the lease recovers them)."""
        if not self._turns:
            return
        _done, pending = await asyncio.wait(set(self._turns), timeout=grace_seconds)
        for turn in pending:
            turn.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def detector(self) -> InterruptDetector:
        """The interrupt detector of the current rule book (phrases reload with the rules)."""
        book = self.rules()
        if self._detector is None or self._detector[0] is not book:
            self._detector = (book, InterruptDetector(book.phrases))
        return self._detector[1]

    async def advance(self, tenant_id: str, session_id: str, user_id: str = "") -> Session:
        """Run the session's open task (and then any queued message) until it waits for the user."""
        session = await self.sessions.load(tenant_id, session_id)
        for _ in range(_MAX_STEPS):
            if session.stalled(self.clock(), self.lease_seconds) is not None:
                session = await self._recover(session, user_id)
                continue
            if session.task is None:
                if not session.queue or session.state != State.IDLE:
                    return session
                session = await self.sessions.update(tenant_id, session_id, lambda s: s.next_queued())
                continue
            step = {State.PARSING: self._parse, State.ROUTING: self._route, State.LLM_DECIDE: self._llm_decide,
                    State.FALLBACK: self._fallback, State.GENERATING: self._generate}.get(session.state)
            if step is None:  # IDLE waiting for an answer, PAUSED, ESCALATE_TO_HUMAN: the user moves next
                return session
            before = session.version
            session = await step(session, user_id)
            if session.version == before:  # the step found nothing to do: someone else moved the session
                return session
        raise RuntimeError(f"session {session_id}: the task did not settle in {_MAX_STEPS} steps")

    async def _commit(self, session: Session, events: list[SessionEvent], *states: State) -> Session:
        """Append `events` if the session is still on this task in one of `states` (else drop them)."""
        task_id = session.task.task_id if session.task else ""
        allowed = states or (session.state,)

        def decide(current: Session) -> list[SessionEvent]:
            return events if current.busy_with(task_id, *allowed) else []

        return await self.sessions.update(session.tenant_id, session.session_id, decide)

    # --- recovery: a turn whose runner stopped ----------------------------------------------------------------

    async def _recover(self, session: Session, user_id: str) -> Session:
        """Take over a stalled turn: record it, settle the calls its runner left open by asking the
        gateway (a call is never assumed done, nor blindly repeated), and carry on from its state."""
        task, idle = session.task, session.stalled(self.clock(), self.lease_seconds) or 0.0
        events: list[SessionEvent] = [TurnRecovered(
            task.task_id, session.state, round(idle, 3),
            f"the turn had not moved for {idle:.1f} s (lease {self.lease_seconds:g} s): its runner stopped")]
        settled = []
        intent = self.rules().intents.get(task.decision.intent) if task.decision else None
        verify = intent.verify_field if intent else ""
        for action in task.pending():
            status = await self.gateway.status(session.tenant_id, action.action_id)
            if status.state == "done" and (not verify or status.result.get(verify)):
                result_json = json.dumps(status.result, ensure_ascii=False, sort_keys=True)
                events.append(ActionFinished(action.action_id, task.task_id, Outcome.OK, result_json,
                                             "its runner stopped; the backend's status says done"))
                settled.append((action, result_json))
            else:  # running or uncertain: it may have happened, so it is not made again (a person takes over)
                events.append(ActionFinished(action.action_id, task.task_id, Outcome.TIMEOUT,
                                             reason=f"its runner stopped; the backend's status says {status.state}",
                                             do_not_retry=status.state in ("running", "uncertain")))
        if task.pending() and session.state == State.ROUTING:
            verified = bool(settled)
            events.append(StateChanged(State.ROUTING, State.GENERATING, "tool result verified", task_id=task.task_id)
                          if verified else
                          StateChanged(State.ROUTING, State.FALLBACK,
                                       f"try {task.failures() + 1}: the call's runner stopped", task_id=task.task_id))
        moved_at = session.step_at

        def decide(current: Session) -> list[SessionEvent]:  # nobody took it over or moved it meanwhile
            return events if current.busy_with(task.task_id, session.state) and current.step_at == moved_at else []

        after = await self.sessions.update(session.tenant_id, session.session_id, decide)
        if after.version > session.version and after.step_at != moved_at:
            for action, result_json in settled:
                await self._remember(session, user_id, action.action_id, action.tool, result_json)
        return after

    # --- PARSING: rules first; slots from the message or the user's answers ----------------------------------

    async def _parse(self, session: Session, user_id: str) -> Session:
        task, book = session.task, self.rules()
        if task.decision is not None:  # the user answered a question: parse it into the missing slots
            events = self._answer_slots(session, book)
            after = await self._commit(session, [*events, StateChanged(State.PARSING, State.ROUTING, "answer parsed",
                                                                       task_id=task.task_id)])
            if after.version > session.version:
                for e in events:
                    if isinstance(e, SlotFilled) and e.source.startswith(CONFIRMED):
                        await self._confirm_memory(session, user_id, e.source[len(CONFIRMED):], e.name)
            return after
        rule = book.match(task.text)
        if rule is None:
            return await self._commit(session, [StateChanged(State.PARSING, State.LLM_DECIDE, "no rule matched",
                                                             task_id=task.task_id)])
        intent = book.intents.get(rule.intent)
        arguments = "{}"
        if rule.action == "delegate":  # what the agent is asked, decided now (replay never re-decides it)
            spec = book.agents[rule.agent]
            asked = _fill(spec.text, {"message": task.text, "rest": rule.rest(task.text)})
            arguments = json.dumps({"agent": rule.agent, "text": asked}, ensure_ascii=False)
        events: list[SessionEvent] = [DecisionMade(task.task_id, f"rule:{rule.name}", rule.action, rule.intent,
                                                   intent.tool if intent else "", arguments, text=rule.reply)]
        for slot in intent.slots if intent else ():
            value, _refused = slot.validator.extract(task.text)
            if value is not None:
                events.append(SlotFilled(task.task_id, slot.name, value, "message"))
        events.append(StateChanged(State.PARSING, State.ROUTING, f"rule {rule.name} matched", task_id=task.task_id))
        return await self._commit(session, events)

    # --- ROUTING: carry out the decision ---------------------------------------------------------------------

    async def _route(self, session: Session, user_id: str) -> Session:
        task, book = session.task, self.rules()
        decision = task.decision
        tid = task.task_id
        if decision.action == "human":
            return await self._commit(session, [self._say(session, book.template("human"), Handling.REPLY),
                                                TaskEnded(tid, Outcome.ESCALATED, decision.decided_by),
                                                StateChanged(State.ROUTING, State.ESCALATE_TO_HUMAN,
                                                             f"{decision.decided_by}: a person must answer")])
        if decision.action == "block":
            return await self._commit(session, [self._say(session, book.template("block"), Handling.REPLY),
                                                TaskEnded(tid, Outcome.BLOCKED, decision.decided_by),
                                                StateChanged(State.ROUTING, State.IDLE,
                                                             f"risk block by {decision.decided_by}")])
        if decision.action == "delegate":
            return await self._delegate(session, user_id)
        if decision.action in ("reply", "ask"):
            return await self._commit(session, [StateChanged(State.ROUTING, State.GENERATING,
                                                             f"{decision.action} decided by {decision.decided_by}",
                                                             task_id=tid)])
        if any(a.outcome == Outcome.OK for a in task.actions):
            return await self._commit(session, [StateChanged(State.ROUTING, State.GENERATING, "tool result verified",
                                                             task_id=tid)])
        if task.pending():
            return session  # a call from before a pause is still running; its runner carries on
        final = task.not_to_retry()
        if final is not None:  # resumed after a call that must not run again: the fallback hands it over
            return await self._commit(session, [StateChanged(State.ROUTING, State.FALLBACK,
                                                             f"{final.tool} must not be called again",
                                                             task_id=tid)])
        intent = book.intents.get(decision.intent)
        if intent is not None:
            missing = await self._missing_slot(session, intent, user_id)
            if missing is not None:
                return missing
            values = {k: v[0] for k, v in session.task.slots.items()}
            arguments = {k: _fill(v, values) for k, v in intent.arguments.items()}
        else:
            arguments = json.loads(decision.arguments_json)
        return await self._call(session, decision.tool, arguments, user_id, intent.verify_field if intent else "")

    async def _ask(self, session: Session, question: str, reason: str, citations: tuple[str, ...] = (),
                   *first: SessionEvent) -> Session:
        return await self._commit(session, [*first, self._say(session, question, Handling.QUESTION, citations),
                                             StateChanged(State.ROUTING, State.IDLE, reason,
                                                          task_id=session.task.task_id)])

    async def _call(self, session: Session, tool: str, arguments: dict, user_id: str, verify_field: str) -> Session:
        task = session.task
        action_id = str(uuid.uuid4())
        attempt = task.failures() + 1
        started = await self._commit(session, [ActionStarted(action_id, task.task_id, tool,
                                                             json.dumps(arguments, ensure_ascii=False), attempt)])
        if started.task is None or action_id not in {a.action_id for a in started.task.actions}:
            return started  # interrupted, or another runner got there first
        result = await until_stopped(  # None: the session cancelled it (hard stop, redirect) while in flight
            self.gateway.call(session.tenant_id, user_id, session.session_id, tool, arguments, action_id,
                              self.tool_deadline_seconds),
            lambda: self._cancelled(started, task.task_id, action_id))
        if result is None:
            return await self.sessions.load(session.tenant_id, session.session_id)  # cancelled by an interrupt
        outcome, reason, final = Outcome.OK, "tool answered", False
        if result.timed_out:  # the answer was lost, not necessarily the work: ask before retrying
            status = await self._verify(session.tenant_id, action_id)
            if status.state == "done":
                result, reason = ToolResult(True, status.result), "timed out; the backend's status says done"
            else:
                outcome, reason = Outcome.TIMEOUT, f"timed out; the backend's status says {status.state}"
                # Only a call the backend says failed may run again, and only if the error allows it: "unknown",
                # "uncertain" and "running" mean it may have happened (a second call could charge twice).
                final = status.state != "failed" or not result.retryable
                if not result.retryable and result.reason:
                    reason += f" ({result.reason})"[:300]
        elif not result.ok:
            outcome, reason = Outcome.ERROR, result.reason or "the tool failed"
            final = not result.retryable
        if outcome == Outcome.OK and verify_field and not result.result.get(verify_field):
            outcome, reason = Outcome.ERROR, f"the result was not verified: {verify_field!r} is missing"
        if final:
            reason += "; not retryable: handed to a person"
        result_json = json.dumps(result.result, ensure_ascii=False, sort_keys=True)
        events: list[SessionEvent] = [ActionFinished(action_id, task.task_id, outcome, result_json, reason,
                                                     do_not_retry=final)]
        if outcome == Outcome.OK:
            await self._remember(session, user_id, action_id, tool, result_json)
            events.append(StateChanged(State.ROUTING, State.GENERATING, "tool result verified", task_id=task.task_id))
        else:
            events.append(StateChanged(State.ROUTING, State.FALLBACK, f"try {attempt}: {reason}",
                                       task_id=task.task_id))
        after = await self._commit(started, events[:1], *State)  # the result is kept even when paused
        return await self._commit(after, events[1:], State.ROUTING)

    async def _verify(self, tenant_id: str, call_id: str) -> CallStatus:
        """How a timed-out call really ended, by the gateway's record of its chain id: asked again while the
        gateway says it is still running (the work may yet finish), for at most `verify_seconds`."""
        give_up, pause = self.clock() + self.verify_seconds, 0.05
        while True:
            status = await self.gateway.status(tenant_id, call_id)
            if status.state != "running" or self.clock() + pause > give_up:
                return status
            await self.sleep(pause)
            pause = min(pause * 2, 0.5)

    async def _cancelled(self, session: Session, task_id: str, action_id: str) -> None:
        async for item in self.sessions.follow(session.tenant_id, session.session_id, session.version):
            e = item.event
            if isinstance(e, TaskEnded) and e.task_id == task_id:
                return
            if isinstance(e, ActionFinished) and e.action_id == action_id and e.outcome == Outcome.CANCELLED:
                return

    async def _remember(self, session: Session, user_id: str, step_id: str, tool: str, result_json: str) -> None:
        try:
            await self.memory.write_step(session.tenant_id, user_id, session.session_id, step_id, tool, result_json,
                                         f"task {session.task.task_id}: {session.task.text}")
        except (OSError, ValueError, RuntimeError) as exc:  # memory is advisory here; the turn goes on
            log.warning("the step result was not written to memory", step_id=step_id, error=str(exc))

    # --- FALLBACK: retry, or after three tries hand over ----------------------------------------------------

    async def _fallback(self, session: Session, user_id: str) -> Session:
        task, book = session.task, self.rules()
        final = task.not_to_retry()
        if final is not None:  # never called again: a person decides what happened
            why = f"{final.tool} must not be called again: {final.reason}"[:500]
            return await self._commit(session, [self._say(session, book.template("not_retried"), Handling.REPLY),
                                                TaskEnded(task.task_id, Outcome.ESCALATED, why),
                                                StateChanged(State.FALLBACK, State.ESCALATE_TO_HUMAN, why)])
        if task.failures() >= MAX_TRIES:
            return await self._commit(session, [self._say(session, book.template("failed"), Handling.REPLY),
                                                TaskEnded(task.task_id, Outcome.ESCALATED, f"{MAX_TRIES} tries failed"),
                                                StateChanged(State.FALLBACK, State.ESCALATE_TO_HUMAN,
                                                             f"{MAX_TRIES} tries failed")])
        return await self._commit(session, [StateChanged(State.FALLBACK, State.ROUTING,
                                                         f"retry {task.failures() + 1} of {MAX_TRIES}",
                                                         task_id=task.task_id)])

    # --- LLM_DECIDE: what the rules leave open ---------------------------------------------------------------

    async def _llm_decide(self, session: Session, user_id: str) -> Session:
        task, book = session.task, self.rules()
        memories = await self.retriever.search(session.tenant_id, user_id, session.session_id, task.text)
        tools = await self.gateway.list_tools(session.tenant_id) if self.llm is not None else []
        context = build_context(ContextInput(
            system=DECISION_PROMPT, task="\n".join([task.text, *task.answers]),
            tools=[(t.name, t.description) for t in tools],
            steps=[(a.action_id, a.tool, a.result_json) for a in task.actions if a.outcome == Outcome.OK],
            memories=[(m.memory_id, m.content) for m in memories],
            history=[(m.role, m.text) for m in session.messages if m.task_id != task.task_id]),
            self.counter, self.budget)
        if context.compress_history:
            await self._compress(session, user_id)
        offered = [t for t in tools if t.name in context.tools]
        planned = await decide_open_question(task.task_id, context.messages, memories, offered, book, self.llm)
        reason = f"decided by {planned.decision.decided_by}"
        if planned.problems:
            reason += f" after refusing: {'; '.join(planned.problems)}"
        return await self._commit(session, [planned.decision, StateChanged(State.LLM_DECIDE, State.ROUTING, reason,
                                                                           task_id=task.task_id)])

    async def _compress(self, session: Session, user_id: str) -> None:
        """The history outgrew its part: the memory-writer summarises the turns it holds not yet covered by a
        summary once they fill its trigger's share of that part (advisory: a failure is logged)."""
        try:
            summary = await self.memory.compress(session.tenant_id, user_id, session.session_id, self.budget.history)
        except (OSError, ValueError, RuntimeError) as exc:
            log.warning("the session's history was not compressed", session_id=session.session_id, error=str(exc))
            return
        if summary:
            log.info("the session's history was compressed", session_id=session.session_id, summary=summary)

    async def _record_turn(self, session: Session, user_id: str, reply: str) -> None:
        """The task's request and its reply as session-layer turns: what compression summarises."""
        task = session.task
        turns = [("user", "\n".join([task.text, *task.answers]), f"{task.task_id}:user"),
                 ("assistant", reply, f"{task.task_id}:reply")]
        try:
            await self.memory.write_turns(session.tenant_id, user_id, session.session_id, turns)
        except (OSError, ValueError, RuntimeError) as exc:  # memory is advisory here; the turn is kept
            log.warning("the turn was not written to memory", task_id=task.task_id, error=str(exc))

    # --- GENERATING: a grounded reply -------------------------------------------------------------------------

    async def _generate(self, session: Session, user_id: str) -> Session:
        task, book = session.task, self.rules()
        decision = task.decision
        if decision.action == "delegate":
            return await self._generate_delegated(session, user_id)
        intent = book.intents.get(decision.intent)
        done = [a for a in task.actions if a.outcome == Outcome.OK]
        sources = [Source(a.action_id, a.result_json) for a in done]
        sources += [Source(s["ref"], s["text"]) for s in json.loads(decision.arguments_json).get("sources", [])]
        sources += [Source(source.rsplit(":", 1)[-1], value) for value, source in task.slots.values()
                    if source.startswith("memory:")]  # a value taken from memory cites that memory
        result = json.loads(done[-1].result_json) if done else {}
        values = {**{k: v[0] for k, v in task.slots.items()}, **{k: _plain(v) for k, v in result.items()}}
        if intent is not None:
            reply, must = _fill(intent.reply, values), [str(values.get(f, "")) for f in intent.must_carry]
        else:
            reply, must = decision.text or book.template("unknown"), []
        problems = check_reply(reply, sources, must, book.max_reply_chars)
        reason = "replied"
        if problems:  # never sent: the template states only what the sources say
            reason = f"reply replaced by a template: {'; '.join(problems)}"
            reply = _fill(book.template("ungrounded"), {"result": done[-1].result_json}) if done \
                else book.template("unknown")
        handling = Handling.QUESTION if decision.action == "ask" else Handling.REPLY
        events: list[SessionEvent] = [self._say(session, reply, handling, tuple(s.ref for s in sources))]
        if decision.action == "ask":
            events.append(StateChanged(State.GENERATING, State.IDLE, "asked the user", task_id=task.task_id))
        else:
            events += [TaskEnded(task.task_id, Outcome.DONE, reason),
                       StateChanged(State.GENERATING, State.IDLE, reason)]
        after = await self._commit(session, events)
        if after.version > session.version and decision.action != "ask":
            await self._record_turn(session, user_id, reply)
        return after

    @staticmethod
    def _say(session: Session, text: str, handling: Handling, citations: tuple[str, ...] = ()) -> MessageAppended:
        return MessageAppended("", "orchestrator", "assistant", text, handling=handling,
                               task_id=session.task.task_id if session.task else "", citations=citations)

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
import string
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
    SlotDeclined,
    SlotFilled,
    SlotOffered,
    State,
    StateChanged,
    TaskEnded,
    TurnRecovered,
)
from services.orchestrator.domain.context import Budget, ContextInput, TokenCounter, build_context
from services.orchestrator.domain.grounding import Source, check_reply
from services.orchestrator.domain.interrupts import Interrupt, InterruptDetector, Kind
from services.orchestrator.domain.rulebook import RuleBook
from services.orchestrator.service_layer.delegation import (
    AgentClient,
    Compensation,
    Delegate,
    Expectation,
    delegate,
    until_stopped,
)
from services.orchestrator.service_layer.planner import DECISION_PROMPT, decide_open_question
from services.orchestrator.service_layer.ports import (
    CallStatus,
    DecisionMaker,
    MemoryHit,
    MemoryWriter,
    Retriever,
    SessionRepository,
    ToolGateway,
    ToolResult,
)

__all__ = ["MAX_TRIES", "Agent"]

log = get_logger(__name__)
MAX_TRIES = 3
_CONFIRMED = "memory:L2-confirmed:"  # the source of a slot filled from an L2 memory the user confirmed
_MAX_STEPS = 64  # a task that has not settled after this many steps is a bug, not a loop to keep running


@dataclass
class Agent:
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

    def unless_answering(self, session: Session, text: str, interrupt: Interrupt | None) -> Interrupt | None:
        """The interrupt, unless the message answers the offer of a remembered value: "no, not that one" and
        "no, it is B54321" open like a redirect ("no, ...") but answer the question ("shall I use A12345?").
        A redirect whose rest is a request a rule recognises ("不对，先查发票 B54321") stays a redirect."""
        task = session.task
        if interrupt is None or interrupt.kind != Kind.REDIRECT or task is None or not task.offers \
                or session.state != State.IDLE or task.decision is None:
            return interrupt
        book = self.rules()
        intent = book.intents.get(task.decision.intent)
        validators = [s.validator for s in intent.slots if s.name in task.offers] if intent else []
        if book.confirm.classify(text) is not None and (
                book.confirm.classify(interrupt.rest) is not None  # "no, not that one"
                or (any(v.extract(interrupt.rest)[0] is not None for v in validators)  # "no, it is B54321"
                    and book.match(interrupt.rest) is None)):  # ...and not "no, check the invoice of B54321"
            return None
        return interrupt

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
            else:  # still running: it may yet happen, so it is not made again (a person takes over)
                events.append(ActionFinished(action.action_id, task.task_id, Outcome.TIMEOUT,
                                             reason=f"its runner stopped; the backend's status says {status.state}",
                                             do_not_retry=status.state == "running"))
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
                    if isinstance(e, SlotFilled) and e.source.startswith(_CONFIRMED):
                        await self._confirm_memory(session, user_id, e.source[len(_CONFIRMED):], e.name)
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

    def _answer_slots(self, session: Session, book: RuleBook) -> list[SessionEvent]:
        task = session.task
        intent = book.intents.get(task.decision.intent)
        events = []
        for slot in intent.slots if intent else ():
            if slot.name in task.slots:
                continue
            value = next((v for v in (slot.validator.extract(a)[0] for a in task.answers) if v is not None), None)
            offer = task.offers.get(slot.name)
            if offer is not None:  # an L2 memory's value awaits the user's yes or no
                offered, memory_id = offer
                said = book.confirm.classify(task.answers[-1]) if task.answers else None
                if value is not None and value != offered:
                    events.append(SlotDeclined(task.task_id, slot.name, memory_id, "the user gave another value"))
                elif value is not None or said == "yes":
                    events.append(SlotFilled(task.task_id, slot.name, offered, f"{_CONFIRMED}{memory_id}"))
                    continue
                elif said == "no":
                    events.append(SlotDeclined(task.task_id, slot.name, memory_id,
                                               f"the user said no: {task.answers[-1][:200]!r}"))
                    continue
                else:
                    continue  # neither yes nor no: the question is asked again
            if value is not None:
                events.append(SlotFilled(task.task_id, slot.name, value, "answer"))
        return events

    async def _confirm_memory(self, session: Session, user_id: str, memory_id: str, slot: str) -> None:
        """The user confirmed an L2 memory: it becomes L1, used without asking from then on (advisory)."""
        try:
            await self.memory.confirm(session.tenant_id, user_id, memory_id,
                                      f"confirmed by the user as {slot} in session {session.session_id}")
        except (OSError, ValueError, RuntimeError) as exc:
            log.warning("the confirmed memory was not promoted", memory_id=memory_id, error=str(exc))

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

    async def _missing_slot(self, session: Session, intent, user_id: str) -> Session | None:
        task = session.task
        book = self.rules()
        for slot in intent.slots:
            if slot.name in task.slots:
                continue
            label = slot.name.replace("_", " ")
            if slot.name in task.offers:  # offered, and the answer was neither yes nor no
                value, memory_id = task.offers[slot.name]
                return await self._ask(session, _fill(book.template("confirm_again"), {"value": value, "slot": label}),
                                       f"slot {slot.name}: the offered memory awaits yes or no", (memory_id,))
            if slot.memory_key:  # a memory under the key, found by what the user asked and the key's words
                found = await self._from_memory(session, slot, user_id)
                if found is not None and found[0].strong:  # L1: used without asking
                    return await self._commit(session, [SlotFilled(task.task_id, slot.name, found[1],
                                                                   f"memory:L1:{found[0].memory_id}")])
                if found is not None:  # L2: confirm before use
                    hit, value = found
                    return await self._ask(
                        session, _fill(book.template("confirm_slot"), {"value": value, "slot": label}),
                        f"slot {slot.name} offered from L2 memory {hit.memory_id}: confirm before use",
                        (hit.memory_id,), SlotOffered(task.task_id, slot.name, value, hit.memory_id))
            _, refused = slot.validator.extract(" ".join([task.text, *task.answers]))
            question = f"{refused[0].upper()}{refused[1:]}. {slot.question}" if refused else slot.question
            return await self._ask(session, question, f"slot {slot.name} missing")
        return None

    async def _from_memory(self, session: Session, slot, user_id: str) -> tuple[MemoryHit, str] | None:
        """The best memory under the slot's key holding a valid value: an L1 one first, else an L2 one ("confirm
        before use") the user has not declined in this task; L3 memories are advisory and never fill a slot."""
        task = session.task
        query = f"{task.text} {slot.memory_key.replace('_', ' ')}"
        hits = await self.retriever.search(session.tenant_id, user_id, session.session_id, query, 10)
        usable = []
        for hit in hits:
            if hit.key != slot.memory_key or hit.memory_id in task.declined or not (hit.strong or hit.must_confirm):
                continue
            value = slot.validator.extract(hit.content)[0]
            if value is not None:
                usable.append((hit, value))
        return next((u for u in usable if u[0].strong), usable[0] if usable else None)

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
                # Only a call the backend says failed may run again, and only if the error allows it: "unknown"
                # and "running" mean it may have happened (a second call could charge twice).
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

    # --- ROUTING a delegation: another agent, its outcome checked, compensated on a mismatch ------------------

    async def _delegate(self, session: Session, user_id: str) -> Session:
        task, book = session.task, self.rules()
        asked = json.loads(task.decision.arguments_json)
        spec = book.agents.get(asked.get("agent", ""))
        if task.delegation is None:
            if spec is None or self.agents is None:
                why = "no agent client is configured" if spec is not None else \
                    f"agent {asked.get('agent')!r} is no longer declared in the rules"
                return await self._hand_over(session, book.template("human"), f"cannot delegate: {why}")
            done = await delegate(Delegate(session.tenant_id, user_id, session.session_id, spec.url, asked["text"],
                                    Expectation(spec.expect_state, spec.reply_contains),
                                    Compensation(spec.compensation_tool, spec.compensation_arguments)),
                           self.sessions, self.memory, self.agents, self.gateway, self.tool_deadline_seconds,
                           stopped=lambda: self._cancelled(session, task.task_id, ""),
                           answer_seconds=self.delegation_seconds)
            if done.taken_over:  # this runner lost its lease: the one that took over carries the task on
                return session
            session = await self.sessions.load(session.tenant_id, session.session_id)
            if not session.busy_with(task.task_id, State.ROUTING):
                return session  # interrupted meanwhile: the delegation's steps are recorded, the task is gone
        d = session.task.delegation
        name = spec.name if spec else asked.get("agent", "")
        if d is None or not d.settled():  # its runner stopped half-way: what the agent did cannot be known here
            return await self._hand_over(session, _fill(book.template("delegation_unsettled"), {"agent": name}),
                                         f"the delegation to {name} was left unfinished")
        if d.matched:
            return await self._commit(session, [StateChanged(State.ROUTING, State.GENERATING,
                                                             f"the delegation to {name} delivered what was expected",
                                                             task_id=task.task_id)])
        if d.compensation == "ok":
            return await self._commit(session, [StateChanged(State.ROUTING, State.GENERATING,
                                                             f"the delegation to {name} mismatched ({d.reason}); "
                                                             "compensated", task_id=task.task_id)])
        return await self._hand_over(session, _fill(book.template("delegation_unsettled"), {"agent": name}),
                                     f"the delegation to {name} mismatched ({d.reason}) and its compensation "
                                     f"ended {d.compensation}")

    async def _hand_over(self, session: Session, text: str, reason: str) -> Session:
        tid = session.task.task_id
        return await self._commit(session, [self._say(session, text, Handling.REPLY),
                                            TaskEnded(tid, Outcome.ESCALATED, reason),
                                            StateChanged(session.state, State.ESCALATE_TO_HUMAN, reason)])

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

    async def _generate_delegated(self, session: Session, user_id: str) -> Session:
        """The agent's own reply when it delivered what was expected; else what went wrong and what undid it."""
        task, book = session.task, self.rules()
        d = task.delegation
        agent = json.loads(task.decision.arguments_json).get("agent", "")
        if d.matched:
            reply, sources, outcome = d.reply, [Source(d.actual_memory_id or d.delegation_id, d.reply)], Outcome.DONE
            reason = f"replied with the answer of {agent}"
        else:
            tool = next((a.compensation_tool for a in book.agents.values() if a.name == agent), "") or "its compensation"
            reply = _fill(book.template("delegation_failed"), {"agent": agent, "reason": d.reason, "tool": tool})
            sources, outcome = [Source(d.delegation_id, f"{agent} {d.reason} {tool}")], Outcome.COMPENSATED
            reason = f"the delegation to {agent} mismatched ({d.reason}); compensated"
        problems = check_reply(reply, sources, [], book.max_reply_chars)
        if problems:
            reply, reason = book.template("unknown"), f"reply replaced by a template: {'; '.join(problems)}"
        after = await self._commit(session, [self._say(session, reply, Handling.REPLY, tuple(s.ref for s in sources)),
                                              TaskEnded(task.task_id, outcome, reason),
                                              StateChanged(State.GENERATING, State.IDLE, reason)])
        if after.version > session.version:
            await self._record_turn(session, user_id, reply)
        return after

    @staticmethod
    def _say(session: Session, text: str, handling: Handling, citations: tuple[str, ...] = ()) -> MessageAppended:
        return MessageAppended("", "orchestrator", "assistant", text, handling=handling,
                               task_id=session.task.task_id if session.task else "", citations=citations)


def _plain(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _fill(template: str, values: dict) -> str:
    """Fill `{name}` fields; an unknown field stays visible as `{name}` rather than failing the turn."""
    names = {name for _, name, _, _ in string.Formatter().parse(template) if name}
    return template.format_map({n: values.get(n, "{" + n + "}") for n in names})

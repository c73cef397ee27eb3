"""A session as an event-sourced aggregate: state is what its events say. No I/O here.

`apply` is the only place state changes, and it reads nothing but the event: decisions that
depend on configuration (is this message an interrupt? which rule matched?) are taken when
the event is created and recorded in it, so replaying a session never decides anything again
and gives the same state whatever the configuration is today.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from libs.errors import ValidationFailed
from libs.validation import check_text, visible
from services.orchestrator.domain.events import (
    BUSY,
    ActionFinished,
    ActionStarted,
    CompensationFinished,
    DecisionMade,
    DelegationAnswered,
    DelegationChecked,
    DelegationStarted,
    Handling,
    MessageAppended,
    Outcome,
    SessionEvent,
    SlotDeclined,
    SlotFilled,
    SlotOffered,
    State,
    StateChanged,
    TaskEnded,
    TaskStarted,
    TurnRecovered,
    Versioned,
)
from services.orchestrator.domain.interrupts import Interrupt, Kind

__all__ = ["SNAPSHOT_SCHEMA", "Action", "Delegation", "Session", "Task"]

MAX_TEXT_CHARS = 8_000
# Bump when the shape of Session.to_dict changes: older snapshots are then ignored (full replay).
SNAPSHOT_SCHEMA = "session/3"


@dataclass
class Action:
    action_id: str
    tool: str
    arguments_json: str
    attempt: int
    outcome: str = ""  # "" while in flight
    result_json: str = "{}"
    reason: str = ""
    do_not_retry: bool = False  # see ActionFinished


@dataclass
class Delegation:
    """A task's call to another agent, as its events tell it (see service_layer/delegation.py)."""

    delegation_id: str
    agent: str
    reply: str = ""
    actual_memory_id: str = ""
    answered: bool = False
    checked: bool = False
    matched: bool = False
    reason: str = ""
    compensation: str = ""  # the compensation's outcome once it ran: ok | error | timeout

    def settled(self) -> bool:
        """Checked, and when it did not match, compensated (whatever the compensation's outcome)."""
        return self.checked and (self.matched or bool(self.compensation))


@dataclass
class Task:
    task_id: str
    text: str
    message_version: int
    decision: DecisionMade | None = None
    slots: dict[str, list[str]] = field(default_factory=dict)  # name -> [value, source]
    actions: list[Action] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)  # user answers to the task's questions, not yet parsed
    offers: dict[str, list[str]] = field(default_factory=dict)  # slot -> [value, memory id] awaiting a yes/no
    declined: list[str] = field(default_factory=list)  # memory ids the user did not confirm
    delegation: Delegation | None = None
    # How many times another runner took the task over (TurnRecovered): a runner that saw fewer lost its lease
    # and appends nothing more.
    recoveries: int = 0

    def pending(self) -> list[Action]:
        return [a for a in self.actions if not a.outcome]

    def not_to_retry(self) -> Action | None:
        """The finished call that must not be made again (its tool is never called again in this task)."""
        return next((a for a in self.actions if a.outcome and a.do_not_retry), None)

    def failures(self) -> int:
        return sum(1 for a in self.actions if a.outcome in (Outcome.ERROR, Outcome.TIMEOUT))


@dataclass
class Session:
    tenant_id: str
    session_id: str
    version: int = 0
    state: State = State.IDLE
    messages: list[MessageAppended] = field(default_factory=list)
    task: Task | None = None
    queue: list[tuple[int, str]] = field(default_factory=list)  # (version, text) of messages waiting their turn
    paused_from: State | None = None
    tasks_ended: int = 0
    # When the turn last moved (epoch seconds of the last event that was not a user's message): a busy
    # turn that stops moving for longer than its lease has lost its runner (see `stalled`).
    step_at: float = 0.0

    # --- replay ----------------------------------------------------------------------------------------------

    @classmethod
    def replay(cls, tenant_id: str, session_id: str, history: list[Versioned],
               start: Session | None = None) -> Session:
        """The state after `history`; from `start` (a snapshot) when given, so snapshot + tail = full replay."""
        session = start if start is not None else cls(tenant_id, session_id)
        for item in history:
            if item.version <= session.version:
                continue  # already in the snapshot
            session.apply(item)
        return session

    def apply(self, item: Versioned) -> None:
        e, self.version = item.event, item.version
        if not (isinstance(e, MessageAppended) and e.role == "user"):
            self.step_at = item.occurred_at.timestamp()
        if isinstance(e, MessageAppended):
            self.messages.append(e)
            if e.handling == Handling.QUEUED:
                self.queue.append((item.version, e.text))
            elif e.handling == Handling.STOP:
                self.queue.clear()
            elif e.handling == Handling.ANSWER and self.task is not None:
                self.task.answers.append(e.text)
        elif isinstance(e, StateChanged):
            if e.to_state == State.PAUSED:
                self.paused_from = e.from_state
            elif e.from_state == State.PAUSED:
                self.paused_from = None
            self.state = e.to_state
        elif isinstance(e, TaskStarted):
            self.task = Task(e.task_id, e.text, e.message_version)
            self.queue = [q for q in self.queue if q[0] != e.message_version]
        elif isinstance(e, TaskEnded):
            if self.task is not None and self.task.task_id == e.task_id:
                self.task = None
                self.tasks_ended += 1
        elif isinstance(e, DelegationAnswered | DelegationChecked | CompensationFinished):
            self._apply_delegation(e)
        elif self.task is None or self.task.task_id != e.task_id:
            return  # a late event of a task that ended: it changes nothing
        elif isinstance(e, DecisionMade):
            self.task.decision = e
        elif isinstance(e, SlotFilled):
            self.task.slots[e.name] = [e.value, e.source]
            self.task.offers.pop(e.name, None)
            self.task.answers.clear()
        elif isinstance(e, SlotOffered):
            self.task.offers[e.name] = [e.value, e.memory_id]
            self.task.answers.clear()
        elif isinstance(e, SlotDeclined):
            self.task.offers.pop(e.name, None)
            self.task.declined.append(e.memory_id)
            self.task.answers.clear()
        elif isinstance(e, DelegationStarted):
            self.task.delegation = Delegation(e.delegation_id, e.agent)
        elif isinstance(e, TurnRecovered):
            self.task.recoveries += 1
        elif isinstance(e, ActionStarted):
            self.task.actions.append(Action(e.action_id, e.tool, e.arguments_json, e.attempt))
        elif isinstance(e, ActionFinished):
            for action in self.task.actions:
                if action.action_id == e.action_id and not action.outcome:
                    action.outcome, action.result_json, action.reason = e.outcome, e.result_json, e.reason
                    action.do_not_retry = e.do_not_retry

    def _apply_delegation(self, e: DelegationAnswered | DelegationChecked | CompensationFinished) -> None:
        d = self.task.delegation if self.task is not None else None
        if d is None or d.delegation_id != e.delegation_id:
            return  # a delegation outside the loop (or of a task that ended): recorded, changes nothing
        if isinstance(e, DelegationAnswered):
            d.answered, d.reply, d.actual_memory_id = True, e.reply, e.actual_memory_id
            d.reason = e.reason
        elif isinstance(e, DelegationChecked):
            d.checked, d.matched, d.reason = True, e.matched, e.reason
        else:
            d.compensation = e.outcome

    # --- snapshots -------------------------------------------------------------------------------------------

    def copy(self) -> Session:
        """An independent copy (events are immutable and shared; everything `apply` mutates is copied)."""
        task = self.task
        if task is not None:
            task = Task(task.task_id, task.text, task.message_version, task.decision,
                        {k: list(v) for k, v in task.slots.items()}, [replace(a) for a in task.actions],
                        list(task.answers), {k: list(v) for k, v in task.offers.items()}, list(task.declined),
                        replace(task.delegation) if task.delegation is not None else None, task.recoveries)
        return Session(self.tenant_id, self.session_id, self.version, self.state, list(self.messages), task,
                       list(self.queue), self.paused_from, self.tasks_ended, self.step_at)

    def to_dict(self) -> dict:
        """The state as JSON-ready values (what a snapshot stores). Written out rather than `asdict`, which
        walks every message field by field: this runs in the appending transaction of long sessions."""
        return {"tenant_id": self.tenant_id, "session_id": self.session_id, "version": self.version,
                "state": self.state, "messages": [dict(vars(m)) for m in self.messages],
                "task": asdict(self.task) if self.task is not None else None,
                "queue": [list(q) for q in self.queue], "paused_from": self.paused_from,
                "tasks_ended": self.tasks_ended, "step_at": self.step_at}

    @classmethod
    def from_dict(cls, data: dict) -> Session:
        task = data["task"]
        if task is not None:
            decision = DecisionMade(**task["decision"]) if task["decision"] else None
            delegation = Delegation(**task["delegation"]) if task["delegation"] else None
            task = Task(task["task_id"], task["text"], task["message_version"], decision,
                        {k: list(v) for k, v in task["slots"].items()},
                        [Action(**a) for a in task["actions"]], list(task["answers"]),
                        {k: list(v) for k, v in task["offers"].items()}, list(task["declined"]), delegation,
                        task.get("recoveries", 0))
        messages = [MessageAppended(**{**m, "citations": tuple(m["citations"])}) for m in data["messages"]]
        return cls(data["tenant_id"], data["session_id"], data["version"], State(data["state"]), messages, task,
                   [(q[0], q[1]) for q in data["queue"]], State(data["paused_from"]) if data["paused_from"] else None,
                   data["tasks_ended"], data["step_at"])

    # --- decisions -------------------------------------------------------------------------------------------

    def receive(self, user_id: str, device_id: str, text: str, interrupt: Interrupt | None,
                event_id: str = "") -> list[SessionEvent]:
        """The events of a user message arriving. Interrupts are handled before anything else."""
        text = check_text(text, "text", MAX_TEXT_CHARS).strip()
        if not visible(text):
            raise ValidationFailed("must not be empty (it has no visible characters)", field="text",
                                   hint="send what the user said")
        if not device_id:
            raise ValidationFailed("is required", field="device_id", hint="name the device, e.g. web-1")
        version = self.version + 1

        def message(handling: Handling) -> MessageAppended:
            return MessageAppended(user_id, device_id, "user", text, event_id, handling,
                                   self.task.task_id if self.task else "")

        kind = interrupt.kind if interrupt else None
        if kind == Kind.HARD:
            if self.task is None and self.state == State.IDLE and not self.queue:
                return [message(Handling.NOTED)]
            return [message(Handling.STOP), *self._drop_task(Outcome.CANCELLED, f"hard stop: {text!r}"),
                    *self._move(State.IDLE, f"hard stop: {text!r}")]
        if kind == Kind.SOFT:
            if self.state in BUSY or (self.state == State.IDLE and self.task is not None):
                return [message(Handling.PAUSE), *self._move(State.PAUSED, f"soft pause: {text!r}")]
            return [message(Handling.NOTED)]
        if kind == Kind.RESUME and self.state == State.PAUSED:
            back = self.paused_from if self.paused_from in BUSY else State.PARSING
            if self.paused_from == State.IDLE:  # paused while waiting for an answer: wait again
                back = State.IDLE
            return [message(Handling.RESUME), *self._move(back, f"resumed: {text!r}")]
        if kind == Kind.REDIRECT:
            task_id = f"task-{version}"
            return [message(Handling.REDIRECT), *self._drop_task(Outcome.DROPPED, f"redirect: {text!r}"),
                    TaskStarted(task_id, interrupt.rest, version),
                    *self._move(State.PARSING, f"redirect to {interrupt.rest!r}", task_id)]
        if self.state == State.ESCALATE_TO_HUMAN:
            return [message(Handling.NOTED)]  # a human has the session; it is kept for them
        if self.state in BUSY:
            return [message(Handling.QUEUED)]
        if self.state == State.IDLE and self.task is not None:
            return [message(Handling.ANSWER),
                    *self._move(State.PARSING, "the user answered the open question", self.task.task_id)]
        task_id = f"task-{version}"
        dropped = self._drop_task(Outcome.DROPPED, "a new request after a pause") if self.task else []
        return [message(Handling.TASK), *dropped, TaskStarted(task_id, text, version),
                *self._move(State.PARSING, f"message from {device_id}", task_id)]

    def next_queued(self) -> list[SessionEvent]:
        """An idle session with waiting messages starts the oldest one."""
        if self.state != State.IDLE or self.task is not None or not self.queue:
            return []
        version, text = self.queue[0]
        task_id = f"task-{version}"
        return [TaskStarted(task_id, text, version),
                *self._move(State.PARSING, f"the queued message of version {version}", task_id)]

    def _drop_task(self, outcome: Outcome, reason: str) -> list[SessionEvent]:
        if self.task is None:
            return []
        tid = self.task.task_id
        return [*(ActionFinished(a.action_id, tid, Outcome.CANCELLED, reason=reason) for a in self.task.pending()),
                TaskEnded(tid, outcome, reason)]

    def _move(self, to: State, reason: str, task_id: str = "") -> list[SessionEvent]:
        if to == self.state:
            return []
        return [StateChanged(self.state, to, reason, task_id=task_id or (self.task.task_id if self.task else ""))]

    def stalled(self, now: float, lease_seconds: float) -> float | None:
        """How long a busy turn has not moved, when that is longer than its lease (else None).

        A runner moves its turn at least once per lease (the lease outlasts a tool call's deadline),
        so a turn that has not is one whose runner died or was stopped; anyone may take it over."""
        if self.task is None or self.state not in BUSY:
            return None
        idle = now - self.step_at
        return idle if idle > lease_seconds else None

    def busy_with(self, task_id: str, *states: State) -> bool:
        """Whether the session is still working on `task_id` in one of `states` (a step's guard)."""
        return self.task is not None and self.task.task_id == task_id and self.state in states

"""The events of a session. Every change of a session is one of these; state is what they say."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

__all__ = ["BUSY", "ActionFinished", "ActionStarted", "DecisionMade", "Handling", "MessageAppended", "Outcome",
           "SessionEvent", "SlotDeclined", "SlotFilled", "SlotOffered", "State", "StateChanged", "TaskEnded", "TaskStarted", "TurnRecovered", "Versioned"]


class State(StrEnum):
    IDLE = "IDLE"
    PARSING = "PARSING"
    ROUTING = "ROUTING"
    LLM_DECIDE = "LLM_DECIDE"
    GENERATING = "GENERATING"
    FALLBACK = "FALLBACK"
    ESCALATE_TO_HUMAN = "ESCALATE_TO_HUMAN"
    PAUSED = "PAUSED"


# A task is being worked on in these states; a new ordinary message waits in the queue.
BUSY = frozenset({State.PARSING, State.ROUTING, State.LLM_DECIDE, State.GENERATING, State.FALLBACK})


class Handling(StrEnum):
    """What the session did with a user message, decided when it arrived (so replay never re-decides)."""

    TASK = "task"            # started a new task
    QUEUED = "queued"        # a task was running: waits its turn
    ANSWER = "answer"        # answers the open task's clarifying question
    PAUSE = "pause"          # soft interrupt
    RESUME = "resume"
    STOP = "stop"            # hard interrupt: every pending action and queued message cancelled
    REDIRECT = "redirect"    # drop the task, start the one in the rest of the message
    NOTED = "noted"          # kept, nothing to do (an interrupt with nothing running; a message for the human)
    REPLY = "reply"          # an assistant reply
    QUESTION = "question"    # an assistant clarifying question


class Outcome(StrEnum):
    DONE = "done"
    CANCELLED = "cancelled"
    DROPPED = "dropped"
    ESCALATED = "escalated"
    BLOCKED = "blocked"
    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    COMPENSATED = "compensated"  # a delegation did not do what was expected; its compensation ran


@dataclass(frozen=True)
class MessageAppended:
    user_id: str
    device_id: str
    role: str
    text: str
    event_id: str = ""
    handling: str = ""
    task_id: str = ""
    citations: tuple[str, ...] = ()  # step ids / memory ids the reply's facts come from


@dataclass(frozen=True)
class StateChanged:
    from_state: State
    to_state: State
    reason: str
    event_id: str = ""
    task_id: str = ""


@dataclass(frozen=True)
class TaskStarted:
    task_id: str
    text: str
    message_version: int  # the user message it answers
    event_id: str = ""


@dataclass(frozen=True)
class TaskEnded:
    task_id: str
    outcome: str
    reason: str
    event_id: str = ""


@dataclass(frozen=True)
class SlotFilled:
    task_id: str
    name: str
    value: str
    source: str  # message | answer | memory:L1:<memory id> | memory:L2-confirmed:<memory id>
    event_id: str = ""


@dataclass(frozen=True)
class SlotOffered:
    """An L2 memory ("confirm before use") holds a value for a missing slot: it is offered to the user, who
    must confirm it before it fills the slot."""

    task_id: str
    name: str
    value: str
    memory_id: str
    event_id: str = ""


@dataclass(frozen=True)
class SlotDeclined:
    """The user did not confirm an offered memory value: the slot stays open and that memory is not offered
    again for this task."""

    task_id: str
    name: str
    memory_id: str
    reason: str
    event_id: str = ""


@dataclass(frozen=True)
class DecisionMade:
    """What to do for a task, and who decided (a rule, the planner or the LLM), validated before it is recorded."""

    task_id: str
    decided_by: str      # rule:<name> | planner | llm
    action: str          # tool | reply | ask | human | block | delegate (arguments_json: {"agent", "text"})
    intent: str = ""
    tool: str = ""
    arguments_json: str = "{}"
    text: str = ""       # a reply or a question the decider wrote
    event_id: str = ""


@dataclass(frozen=True)
class ActionStarted:
    action_id: str
    task_id: str
    tool: str
    arguments_json: str
    attempt: int
    event_id: str = ""


@dataclass(frozen=True)
class ActionFinished:
    action_id: str
    task_id: str
    outcome: str         # ok | error | timeout | cancelled
    result_json: str = "{}"
    reason: str = ""
    event_id: str = ""
    # Not to be called again: the error said so (not retryable), or the call may have happened (its outcome
    # is unknown, or it was still running when verification gave up). The task goes to a person instead.
    do_not_retry: bool = False


@dataclass(frozen=True)
class TurnRecovered:
    """A busy turn that had not moved for longer than its lease was taken over by another runner
    (the one running it died, or was stopped); the task goes on from `state`."""

    task_id: str
    state: str
    idle_seconds: float
    reason: str
    event_id: str = ""


@dataclass(frozen=True)
class DelegationStarted:
    """A call to another agent began; the expected outcome was recorded in memory first."""

    delegation_id: str
    task_id: str
    agent: str
    text: str
    expected_json: str
    expected_memory_id: str
    compensation_json: str
    event_id: str = ""


@dataclass(frozen=True)
class DelegationAnswered:
    delegation_id: str
    reply: str
    actual_json: str = "{}"
    actual_memory_id: str = ""
    reason: str = ""     # why there is no answer (the call failed)
    event_id: str = ""


@dataclass(frozen=True)
class DelegationChecked:
    delegation_id: str
    matched: bool
    reason: str
    event_id: str = ""


@dataclass(frozen=True)
class CompensationFinished:
    delegation_id: str
    tool: str
    outcome: str         # ok | error | timeout
    result_json: str = "{}"
    reason: str = ""
    event_id: str = ""


SessionEvent = (MessageAppended | StateChanged | TaskStarted | TaskEnded | SlotFilled | SlotOffered | SlotDeclined
                | DecisionMade
                | ActionStarted | ActionFinished | TurnRecovered | DelegationStarted | DelegationAnswered
                | DelegationChecked | CompensationFinished)


@dataclass(frozen=True)
class Versioned:
    version: int
    event: SessionEvent
    occurred_at: datetime = field(default_factory=lambda: datetime.now(UTC))

"""A session as an event-sourced aggregate: state is what its events say. No I/O here."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

from libs.errors import ValidationFailed
from libs.validation import check_text, visible

__all__ = ["MessageAppended", "Session", "SessionEvent", "State", "StateChanged", "Versioned"]

MAX_TEXT_CHARS = 8_000


class State(StrEnum):
    IDLE = "IDLE"
    PARSING = "PARSING"
    ROUTING = "ROUTING"
    LLM_DECIDE = "LLM_DECIDE"
    GENERATING = "GENERATING"
    FALLBACK = "FALLBACK"
    ESCALATE_TO_HUMAN = "ESCALATE_TO_HUMAN"
    PAUSED = "PAUSED"


@dataclass(frozen=True)
class MessageAppended:
    user_id: str
    device_id: str
    role: str
    text: str
    event_id: str = ""


@dataclass(frozen=True)
class StateChanged:
    from_state: State
    to_state: State
    reason: str
    event_id: str = ""


SessionEvent = MessageAppended | StateChanged


@dataclass(frozen=True)
class Versioned:
    version: int
    event: SessionEvent
    occurred_at: datetime = field(default_factory=lambda: datetime.now(UTC))


@dataclass
class Session:
    tenant_id: str
    session_id: str
    version: int = 0
    state: State = State.IDLE
    messages: list[MessageAppended] = field(default_factory=list)

    @classmethod
    def replay(cls, tenant_id: str, session_id: str, history: list[Versioned]) -> Session:
        session = cls(tenant_id, session_id)
        for item in history:
            session.apply(item.event)
            session.version = item.version
        return session

    def apply(self, event: SessionEvent) -> None:
        if isinstance(event, MessageAppended):
            self.messages.append(event)
        else:
            self.state = event.to_state

    def send(self, user_id: str, device_id: str, text: str, event_id: str = "") -> list[SessionEvent]:
        """The events of a user message arriving from a device (the state machine grows from here)."""
        text = check_text(text, "text", MAX_TEXT_CHARS).strip()
        if not visible(text):
            raise ValidationFailed("must not be empty (it has no visible characters)", field="text",
                                   hint="send what the user said")
        if not device_id:
            raise ValidationFailed("is required", field="device_id", hint="name the device, e.g. web-1")
        return [MessageAppended(user_id=user_id, device_id=device_id, role="user", text=text, event_id=event_id)]

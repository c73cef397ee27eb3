from services.orchestrator.domain.session import (
    MessageAppended,
    Session,
    SessionEvent,
    State,
    StateChanged,
    Versioned,
)

__all__ = ["MessageAppended", "Session", "SessionEvent", "State", "StateChanged", "Versioned"]

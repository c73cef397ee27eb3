"""The session repository port: an event-sourced store with optimistic appends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from services.orchestrator.domain import SessionEvent, Versioned

__all__ = ["SessionRepository"]


class SessionRepository(Protocol):
    async def history(self, tenant_id: str, session_id: str) -> list[Versioned]: ...

    async def append(self, tenant_id: str, session_id: str, expected_version: int,
                     events: list[SessionEvent]) -> int:
        """Append after `expected_version`; Conflict when the session moved; return the new version."""
        ...

    def follow(self, tenant_id: str, session_id: str, after_version: int) -> AsyncIterator[Versioned]:
        """Catch up after `after_version`, then follow live."""
        ...

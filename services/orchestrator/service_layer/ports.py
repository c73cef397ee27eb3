"""The session repository port: an event-sourced store with optimistic appends."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Protocol

from services.orchestrator.domain import SessionEvent, Versioned

__all__ = ["SessionRepository"]


class SessionRepository(Protocol):
    async def history(self, tenant_id: str, session_id: str) -> list[Versioned]: ...

    async def update(self, tenant_id: str, session_id: str,
                     decide: Callable[[list[Versioned]], list[SessionEvent]]) -> list[Versioned]:
        """With no other writer of the session in between: load its history, append the events `decide`
        returns for it (none: nothing), and return the history after the append.

        Sessions are serialised per session, so a send never fails because another device
        sent at the same time; `decide` raises to refuse (a stale expected version, say)."""
        ...

    def follow(self, tenant_id: str, session_id: str, after_version: int) -> AsyncIterator[Versioned]:
        """Catch up after `after_version`, then follow live."""
        ...

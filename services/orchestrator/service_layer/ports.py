"""The orchestrator's ports: the session store, and the services it talks to over gRPC (or fakes in tests)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from services.orchestrator.domain import Session, SessionEvent, Versioned

__all__ = ["CallStatus", "DecisionMaker", "MemoryHit", "MemoryWriter", "Retriever", "SessionRepository",
           "ToolGateway", "ToolInfo", "ToolResult"]


class SessionRepository(Protocol):
    async def history(self, tenant_id: str, session_id: str) -> list[Versioned]:
        """Every event of the session, in order (replay)."""
        ...

    async def load(self, tenant_id: str, session_id: str) -> Session:
        """The current state (from a snapshot and the events after it, when there is one)."""
        ...

    async def update(self, tenant_id: str, session_id: str,
                     decide: Callable[[Session], list[SessionEvent]]) -> Session:
        """With no other writer of the session in between: load it, append the events `decide` returns
        for it (none: nothing), and return the state after the append.

        Writers are serialised per session, so a send never fails because another device sent at the
        same time; `decide` raises to refuse (a stale expected version, say)."""
        ...

    def follow(self, tenant_id: str, session_id: str, after_version: int) -> AsyncIterator[Versioned]:
        """Catch up after `after_version`, then follow live."""
        ...


@dataclass(frozen=True)
class MemoryHit:
    memory_id: str
    content: str
    key: str = ""
    score: float = 0.0
    must_confirm: bool = False  # L2: confirm with the user before use
    strong: bool = False        # L1: use without asking


class Retriever(Protocol):
    async def search(self, tenant_id: str, user_id: str, session_id: str, query: str,
                     limit: int = 5) -> list[MemoryHit]: ...


class MemoryWriter(Protocol):
    async def write_step(self, tenant_id: str, user_id: str, session_id: str, step_id: str, tool: str,
                         content: str, trigger: str) -> None:
        """Store a tool result in the step layer under its step id, with the condition that triggered it."""
        ...

    async def write_turns(self, tenant_id: str, user_id: str, session_id: str,
                          turns: list[tuple[str, str, str]]) -> None:
        """Store conversation turns (role, text, idempotency key) in the session layer: what compression
        summarises."""
        ...

    async def record_outcome(self, tenant_id: str, user_id: str, session_id: str, content: str, *,
                             tags: tuple[str, ...], derived_from: tuple[str, ...], idempotency_key: str) -> str:
        """Record an outcome (expected or actual, of a call between agents) as a step memory; its id."""
        ...

    async def confirm(self, tenant_id: str, user_id: str, memory_id: str, reason: str) -> None:
        """The user confirmed an L2 memory: it becomes L1 (used without asking from then on)."""
        ...

    async def compress(self, tenant_id: str, user_id: str, session_id: str, window_tokens: int) -> str:
        """Summarise the session's turns not yet covered into one memory when they fill enough of a window of
        `window_tokens` (the memory-writer's trigger); the summary's id, or "" when nothing was due."""
        ...


@dataclass(frozen=True)
class ToolInfo:
    name: str
    description: str
    input_schema: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolResult:
    ok: bool
    result: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    retryable: bool = True
    timed_out: bool = False


@dataclass(frozen=True)
class CallStatus:
    """What the backend says about a call whose answer was lost (a timeout): done (with its result), still
    running (ask again), failed (it did not happen), uncertain (it was recorded and may have happened, e.g. it
    timed out and its status tool could not say: never made again), or unknown (nothing recorded under that
    id, or the gateway could not be asked): only `done` counts as a result."""

    state: str  # done | running | failed | uncertain | unknown
    result: dict[str, Any] = field(default_factory=dict)


class ToolGateway(Protocol):
    async def call(self, tenant_id: str, user_id: str, session_id: str, tool: str, arguments: dict[str, Any],
                   call_id: str, deadline_seconds: float) -> ToolResult:
        """Call a tool. Cancelling the awaiting task cancels the call at the gateway (and its upstream)."""
        ...

    async def status(self, tenant_id: str, call_id: str) -> CallStatus: ...

    async def list_tools(self, tenant_id: str) -> list[ToolInfo]: ...


class DecisionMaker(Protocol):
    """An LLM behind an OpenAI-compatible endpoint: returns the decision it wrote (unvalidated)."""

    async def decide(self, messages: list[dict[str, str]], tools: list[ToolInfo]) -> dict[str, Any]: ...

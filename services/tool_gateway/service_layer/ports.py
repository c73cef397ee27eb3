"""The tool-gateway's ports: the registry, and what the call pipeline needs around it."""

from __future__ import annotations

from typing import Any, Protocol

from services.tool_gateway.domain import ToolSpec
from services.tool_gateway.domain.calls import CallRecord

__all__ = ["Backends", "Breakers", "CallLog", "RateLimiter", "Registry", "ResultStore"]


class Registry(Protocol):
    async def register(self, spec: ToolSpec) -> bool:
        """Store `spec` and announce it, atomically; False when that name and version already exist."""
        ...

    async def list(self) -> list[ToolSpec]:
        """Every registered tool, newest version first within a name."""
        ...

    async def versions(self, name: str) -> list[ToolSpec]:
        """Every registered version of `name` (a direct lookup, no scan); empty when there is none."""
        ...


class RateLimiter(Protocol):
    async def acquire(self, buckets: list[tuple[str, float]]) -> float:
        """Take one token from each (key, calls per second) bucket, all or none.

        0 when granted, otherwise the seconds until every bucket has a token again.
        """
        ...


class Breakers(Protocol):
    async def admit(self, tool: str, probe_seconds: float) -> tuple[bool, str, float]:
        """(admitted, state, retry_after): closed admits; open refuses until its time is up, then
        half-open admits one probe at a time (a probe lost for `probe_seconds` is replaced)."""
        ...

    async def record(self, tool: str, ok: bool) -> str:
        """Count a call's outcome; returns the state after it."""
        ...

    async def state(self, tool: str) -> str:
        ...


class Backends(Protocol):
    async def call(self, spec: ToolSpec, arguments: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Run the tool; raise a DomainError (retryable or not) mapped from the backend's failure."""
        ...


class CallLog(Protocol):
    async def record(self, record: CallRecord) -> None:
        """The audit row and the tool.called event, in one transaction of the caller's tenant."""
        ...


class ResultStore(Protocol):
    async def put(self, tenant_id: str, step_id: str, text: str) -> None:
        ...

    async def get(self, tenant_id: str, step_id: str) -> str | None:
        ...

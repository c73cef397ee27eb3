"""The tool-gateway's ports: the registry, and what the call pipeline needs around it."""

from __future__ import annotations

from typing import Any, Protocol

from services.tool_gateway.domain import ToolSpec
from services.tool_gateway.domain.calls import CallRecord
from services.tool_gateway.domain.chains import Chain, ChainStep
from services.tool_gateway.domain.experience import Experience
from services.tool_gateway.domain.rollout import ArmCounts, Rollout

__all__ = ["Backends", "Breakers", "CallLog", "CanaryCounters", "ChainStore", "ExperienceStore", "Gate", "RateLimiter",
           "Registry", "ResultStore", "TaskStore"]


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

    async def lookup(self, name: str) -> tuple[list[ToolSpec], Rollout | None]:
        """`versions(name)` and the tool's rollout, in one round trip (the call path)."""
        ...

    async def remove(self, name: str, version: str = "") -> list[str]:
        """Remove one version (or all) and announce it; the versions removed."""
        ...

    async def rollouts(self) -> dict[str, Rollout]:
        ...

    async def save_rollout(self, rollout: Rollout, expect_canary: str | None = None) -> bool:
        """Store `rollout`; with `expect_canary`, only while that canary still runs (False otherwise)."""
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

    def succeeded(self, tool: str) -> None:
        """Count a success of a call its closed breaker admitted; it may be applied a few ms later (in a
        batch), but before any later outcome of the same tool recorded through this port."""
        ...

    async def state(self, tool: str) -> str:
        ...


class Gate(Protocol):
    async def admit(self, buckets: list[tuple[str, float]], tool: str,
                    probe_seconds: float) -> tuple[float, bool, str, float]:
        """RateLimiter.acquire, then (when granted) Breakers.admit, in one step:
        (wait, admitted, state, retry_after); a call the rate limit refuses (wait > 0) takes no probe."""
        ...


class Backends(Protocol):
    async def call(self, spec: ToolSpec, arguments: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Run the tool; raise a DomainError (retryable or not) mapped from the backend's failure."""
        ...


class CallLog(Protocol):
    async def record(self, record: CallRecord) -> None:
        """The audit row and the tool.called event, in one transaction of the caller's tenant."""
        ...

    async def find(self, tenant_id: str, call_id: str) -> CallRecord | None:
        """The call with this id, or the newest whose chain id it is."""
        ...


class CanaryCounters(Protocol):
    async def record(self, tool: str, epoch: str, arm: str, ok: bool) -> ArmCounts:
        """Count one call of a canary's `arm` ("stable" or "canary"); the counts after it (shared)."""
        ...


class ExperienceStore(Protocol):
    async def load(self, tenant_id: str, tool: str, context: str) -> Experience | None:
        ...

    async def save(self, tenant_id: str, exp: Experience) -> None:
        ...

    async def find(self, tenant_id: str, names: list[str], context: str) -> list[Experience]:
        """The experiences of `names` (every tool when empty) for one context key."""
        ...


class ResultStore(Protocol):
    async def put(self, tenant_id: str, step_id: str, text: str) -> None:
        ...

    async def mark_running(self, tenant_id: str, chain_id: str, seconds: float) -> None:
        """A call of this chain id is under way (for at most `seconds`)."""
        ...

    async def running(self, tenant_id: str, chain_id: str) -> bool:
        ...

    async def get(self, tenant_id: str, step_id: str) -> str | None:
        ...


class ChainStore(Protocol):
    """Each chain's steps, shared by every replica, living a TTL after the chain's last step. A chain belongs to
    its caller (tenant and subject): another caller's chain of the same id is another chain. A chain holds at
    most `max_steps` steps."""

    max_steps: int

    async def load(self, tenant_id: str, subject: str, chain_id: str) -> Chain | None:
        """The chain's steps; None when it has none (new, or expired)."""
        ...

    async def record(self, tenant_id: str, subject: str, chain_id: str, step: ChainStep) -> None:
        """Keep `step` (one per tool and arguments hash: only a step run anew replaces a done one; a failure or a
        replay does not) and renew the TTL; a new step past `max_steps` is not kept (ChainFull)."""
        ...

    async def claim(self, tenant_id: str, subject: str, chain_id: str, key: str, owner: str, seconds: float) -> bool:
        """Hold the chain's step `key` (step_key) for the call `owner` for at most `seconds`; False when another
        call holds it."""
        ...

    async def release(self, tenant_id: str, subject: str, chain_id: str, key: str, owner: str) -> None:
        """Let go of the step `key` if `owner` holds it (else nothing)."""
        ...


class TaskStore(Protocol):
    """The state of calls run as tasks, shared by every replica, for a TTL."""

    async def save(self, tenant_id: str, task_id: str, state: dict[str, Any]) -> None:
        ...

    async def load(self, tenant_id: str, task_id: str) -> dict[str, Any] | None:
        ...

    async def begin(self, tenant_id: str, task_id: str, state: dict[str, Any], lease_seconds: float,
                    max_working: int) -> int:
        """Save a new working task (`state["caller"]` its caller) with its lease, unless that caller has
        `max_working` working tasks already (those whose lease lapsed do not count): how many the caller has
        with it (> 0), or minus how many it has (<= 0: not saved)."""
        ...

    async def end(self, tenant_id: str, task_id: str, state: dict[str, Any]) -> bool:
        """Save the final `state` only while the stored one is "working" (compare-and-set): False when it had
        ended already (a final state is never replaced)."""
        ...

    async def hold(self, tenant_id: str, subject: str, task_id: str, seconds: float) -> None:
        """The replica running the task (of caller `subject`) is alive for `seconds` more (renewed while it
        runs)."""
        ...

    async def held(self, tenant_id: str, task_id: str) -> bool:
        ...

    async def list(self, tenant_id: str, subject: str, after: str, limit: int) -> tuple[list[dict[str, Any]], str]:
        """Caller `subject`'s tasks still kept, oldest first, at most `limit` of them after the cursor `after`
        ("": from the first), and the cursor to go on from ("" when no task follows; a page may be short when
        many expired tasks had to be passed over)."""
        ...

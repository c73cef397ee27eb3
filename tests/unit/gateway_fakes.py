"""Fakes behind the tool-gateway's call-pipeline ports, with a manual clock (no sleeps)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fakes import FakeRegistry

from services.tool_gateway.domain import CallRecord, ToolSpec
from services.tool_gateway.domain.chains import Chain, ChainStep, chain_full, step_key
from services.tool_gateway.domain.rollout import ArmCounts
from services.tool_gateway.service_layer.pipeline import CallPolicy, CallPorts

__all__ = ["Clock", "FakeBackends", "FakeBreakers", "FakeCallLog", "FakeCanaries", "FakeChains", "FakeLimiter",
           "FakeResults", "FakeTasks", "fake_ports"]


@dataclass
class Clock:
    now: float = 1000.0
    slept: list[float] = field(default_factory=list)

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class FakeLimiter:
    """Every bucket holds `capacity` tokens and never refills (the clock does not matter here)."""

    def __init__(self, capacity: int = 1_000_000) -> None:
        self.capacity, self.taken = capacity, {}

    async def acquire(self, buckets: list[tuple[str, float]]) -> float:
        if any(self.taken.get(key, 0) >= self.capacity for key, _ in buckets):
            return 1.0
        for key, _ in buckets:
            self.taken[key] = self.taken.get(key, 0) + 1
        return 0.0


class FakeBreakers:
    """The Redis breaker's rules (consecutive failures only), on the manual clock."""

    def __init__(self, clock: Clock, failures: int = 3, open_seconds: float = 10.0) -> None:
        self.clock, self.max_failures, self.open_seconds = clock, failures, open_seconds
        self.states: dict[str, dict[str, Any]] = {}

    def _get(self, tool: str) -> dict[str, Any]:
        return self.states.setdefault(tool, {"state": "closed", "failures": 0, "opened_at": 0.0, "probe_until": 0.0})

    async def admit(self, tool: str, probe_seconds: float) -> tuple[bool, str, float]:
        b = self._get(tool)
        if b["state"] == "open":
            left = b["opened_at"] + self.open_seconds - self.clock()
            if left > 0:
                return False, "open", left
            b.update(state="half_open", probe_until=self.clock() + probe_seconds)
            return True, "half_open", 0.0
        if b["state"] == "half_open":
            if b["probe_until"] > self.clock():
                return False, "half_open", b["probe_until"] - self.clock()
            b["probe_until"] = self.clock() + probe_seconds
        return True, b["state"], 0.0

    async def record(self, tool: str, ok: bool) -> str:
        b = self._get(tool)
        if b["state"] == "half_open":
            b.update(state="closed" if ok else "open", failures=0, opened_at=self.clock())
        elif b["state"] == "closed":
            b["failures"] = 0 if ok else b["failures"] + 1
            if b["failures"] >= self.max_failures:
                b.update(state="open", opened_at=self.clock(), failures=0)
        return b["state"]

    def succeeded(self, tool: str) -> None:
        b = self._get(tool)
        if b["state"] == "closed":
            b["failures"] = 0

    async def state(self, tool: str) -> str:
        return self._get(tool)["state"]


Behaviour = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class FakeBackends:
    """Each tool name answers through its behaviour; every call is recorded."""

    def __init__(self) -> None:
        self.behaviours: dict[str, Behaviour] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def call(self, spec: ToolSpec, arguments: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.calls.append((spec.name, arguments))
        return await self.behaviours[spec.name](arguments)


class FakeCallLog:
    def __init__(self) -> None:
        self.records: list[CallRecord] = []

    async def record(self, record: CallRecord) -> None:
        self.records.append(record)

    async def find(self, tenant_id: str, call_id: str) -> CallRecord | None:
        found = [r for r in self.records if r.tenant_id == tenant_id and call_id in (r.call_id, r.chain_id)]
        return found[-1] if found else None


class FakeCanaries:
    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], dict[str, int]] = {}

    async def record(self, tool: str, epoch: str, arm: str, ok: bool) -> ArmCounts:
        c = self.counts.setdefault((tool, epoch), {})
        c[f"{arm}_calls"] = c.get(f"{arm}_calls", 0) + 1
        if not ok:
            c[f"{arm}_errors"] = c.get(f"{arm}_errors", 0) + 1
        return ArmCounts(**c)


class FakeResults:
    def __init__(self) -> None:
        self.stored: dict[tuple[str, str], str] = {}
        self.marks: set[tuple[str, str]] = set()

    async def mark_running(self, tenant_id: str, chain_id: str, seconds: float) -> None:
        self.marks.add((tenant_id, chain_id))

    async def running(self, tenant_id: str, chain_id: str) -> bool:
        return (tenant_id, chain_id) in self.marks

    async def put(self, tenant_id: str, step_id: str, text: str) -> None:
        self.stored[tenant_id, step_id] = text

    async def get(self, tenant_id: str, step_id: str) -> str | None:
        return self.stored.get((tenant_id, step_id))


class FakeChains:
    """The Redis chain store's rules: one step per (tool, arguments hash); only a step run anew replaces a done one
    (a failure or a replay never does)."""

    def __init__(self, max_steps: int = 256) -> None:
        self.chains: dict[tuple[str, str, str], dict[str, ChainStep]] = {}
        self.held: dict[tuple[str, str, str, str], str] = {}  # a running step -> the call id holding it
        self.max_steps = max_steps

    async def load(self, tenant_id: str, subject: str, chain_id: str) -> Chain | None:
        steps = self.chains.get((tenant_id, subject, chain_id))
        return Chain(chain_id, tuple(sorted(steps.values(), key=lambda s: s.at))) if steps else None

    async def record(self, tenant_id: str, subject: str, chain_id: str, step: ChainStep) -> None:
        steps = self.chains.setdefault((tenant_id, subject, chain_id), {})
        key = step_key(step.tool, step.args_sha256)
        if key not in steps and len(steps) >= self.max_steps:
            raise chain_full(chain_id, self.max_steps)
        if step.fresh or key not in steps or not steps[key].done:
            steps[key] = step

    async def claim(self, tenant_id: str, subject: str, chain_id: str, key: str, owner: str, seconds: float) -> bool:
        return self.held.setdefault((tenant_id, subject, chain_id, key), owner) == owner

    async def release(self, tenant_id: str, subject: str, chain_id: str, key: str, owner: str) -> None:
        if self.held.get((tenant_id, subject, chain_id, key)) == owner:
            del self.held[(tenant_id, subject, chain_id, key)]


class FakeTasks:
    """The task store (RedisTaskStore) in memory; `listed` keeps each caller's tasks in the order begun."""

    def __init__(self) -> None:
        self.saved: dict[tuple[str, str], dict] = {}
        self.leases: set[tuple[str, str]] = set()
        self.listed: dict[tuple[str, str], list[str]] = {}

    async def save(self, tenant_id: str, task_id: str, state: dict) -> None:
        self.saved[tenant_id, task_id] = state

    async def load(self, tenant_id: str, task_id: str) -> dict | None:
        return self.saved.get((tenant_id, task_id))

    async def begin(self, tenant_id: str, task_id: str, state: dict, lease_seconds: float, max_working: int) -> int:
        working = sum(1 for (t, i), st in self.saved.items() if t == tenant_id and st["caller"] == state["caller"]
                      and st["state"] == "working" and (t, i) in self.leases)
        if working >= max_working:
            return -working
        self.saved[tenant_id, task_id] = state
        self.leases.add((tenant_id, task_id))
        self.listed.setdefault((tenant_id, state["caller"]), []).append(task_id)
        return working + 1

    async def end(self, tenant_id: str, task_id: str, state: dict) -> bool:
        held = self.saved.get((tenant_id, task_id))
        if held is None or held["state"] != "working":
            return False
        self.saved[tenant_id, task_id] = state
        return True

    async def hold(self, tenant_id: str, subject: str, task_id: str, seconds: float) -> None:
        self.leases.add((tenant_id, task_id))

    async def held(self, tenant_id: str, task_id: str) -> bool:
        return (tenant_id, task_id) in self.leases

    async def list(self, tenant_id: str, subject: str, after: str, limit: int) -> tuple[list[dict], str]:
        cursors = [f"{k:013d}:{k:012d}:{task_id}" for k, task_id in enumerate(self.listed.get((tenant_id, subject), []))]
        following = [c for c in cursors if c > after]
        page = following[:limit]
        states = [self.saved[tenant_id, c.rpartition(":")[2]] for c in page]
        return states, (page[-1] if len(following) > limit else "")


def fake_ports(**policy: Any) -> CallPorts:
    clock = Clock()
    return CallPorts(registry=FakeRegistry(), limiter=FakeLimiter(), breakers=FakeBreakers(clock),
                     backends=FakeBackends(), call_log=FakeCallLog(), results=FakeResults(),
                     canaries=FakeCanaries(), policy=CallPolicy(**policy), clock=clock, sleep=clock.sleep,
                     chains=FakeChains())

"""The call path's shortcuts keep the pipeline's guarantees: audit rows batched but never lost, registry reads
cached but never stale past a change, each stats row folded once per batch, lookups by name only."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime

import anyio
import asyncpg
import pytest
from fakes import FakeRegistry
from gateway_fakes import fake_ports

from libs.auth import Principal
from services.tool_gateway.adapters.audit_buffer import BufferedCallLog
from services.tool_gateway.adapters.registry_cache import CachedRegistry
from services.tool_gateway.domain import CallRecord, ToolCall, ToolSpec
from services.tool_gateway.domain.registry import input_validator
from services.tool_gateway.domain.experience import Experience, Observation
from services.tool_gateway.service_layer.experience import record_calls
from services.tool_gateway.service_layer.pipeline import call_tool

AGENT = Principal(subject="agent-1", tenant_id="acme", scopes=frozenset({"tools:call"}))
SPEC = ToolSpec(name="crm.lookup", description="Look a customer up by id.",
                input_schema={"type": "object", "properties": {"id": {"type": "string"}}})


def record(i: int, tenant: str = "acme") -> CallRecord:
    return CallRecord(call_id=f"c{i}", tenant_id=tenant, caller="agent-1", tool="crm.lookup", version="1.0.0",
                      args_sha256="0" * 64, outcome="ok", error=None, latency_ms=1.0, trace_id="")


class FlakyWriter:
    """Fails its first `failures` writes as PostgreSQL going away does; keeps what committed."""

    def __init__(self, failures: int = 0) -> None:
        self.failures, self.rows, self.batches = failures, [], []

    def prepare(self, r: CallRecord):
        return r, None, datetime.now(UTC)

    async def write(self, prepared) -> None:
        if self.failures:
            self.failures -= 1
            raise asyncpg.PostgresConnectionError("connection lost")
        self.batches.append(len(prepared))
        self.rows += [r.call_id for r, _, _ in prepared]

    async def find(self, tenant_id: str, call_id: str):
        return next((r for r in self.rows if r == call_id), None)


async def test_audit_rows_are_written_in_batches_in_order_and_survive_a_database_outage() -> None:
    writer = FlakyWriter(failures=2)
    log = BufferedCallLog(writer, flush_seconds=0.001, batch=50, retry_cap_seconds=0.01)
    for i in range(120):
        await log.record(record(i))
    with anyio.fail_after(5):
        while len(writer.rows) < 120:
            await anyio.sleep(0.005)
    assert writer.rows == [f"c{i}" for i in range(120)]  # each once, in order, after two failed writes
    assert len(writer.batches) < 120 and max(writer.batches) <= 50
    await log.close()


async def test_closing_the_call_log_writes_what_is_still_queued() -> None:
    writer = FlakyWriter()
    log = BufferedCallLog(writer, flush_seconds=60, batch=1_000)  # nothing would flush on its own
    for i in range(7):
        await log.record(record(i))
    assert writer.rows == []
    await log.close()
    assert writer.rows == [f"c{i}" for i in range(7)]
    await log.record(record(7))  # a late call after close is written at once, not queued for nobody
    assert writer.rows[-1] == "c7"


async def test_get_call_sees_a_call_of_this_replica_at_once() -> None:
    log = BufferedCallLog(FlakyWriter(), flush_seconds=60)
    await log.record(record(1))
    assert await log.find("acme", "c1") == "c1"
    await log.close()


async def test_a_full_audit_queue_makes_calls_wait_then_fail_transiently_never_drops_a_row() -> None:
    writer = FlakyWriter(failures=10**6)  # the database stays away
    log = BufferedCallLog(writer, flush_seconds=0.001, capacity=3, full_wait_seconds=0.05, retry_cap_seconds=0.01)
    for i in range(3):
        await log.record(record(i))
    with pytest.raises(TimeoutError):
        await log.record(record(3))
    assert log.queued == 3
    log._task.cancel()
    await asyncio.gather(log._task, return_exceptions=True)


class ManualNotifier:
    def __init__(self) -> None:
        self.generation, self.listening = 0, asyncio.Event()
        self.listening.set()

    def mark(self) -> int:
        return self.generation

    async def close(self) -> None:
        pass


class CountingRegistry(FakeRegistry):
    def __init__(self) -> None:
        super().__init__()
        self.lookups = 0

    async def lookup(self, name: str):
        self.lookups += 1
        return await super().lookup(name)


async def test_registry_reads_are_cached_until_a_change_anywhere_or_a_lost_listener() -> None:
    inner, notifier = CountingRegistry(), ManualNotifier()
    registry = CachedRegistry(inner, notifier)
    assert (await registry.lookup("crm.lookup"))[0] == []
    await registry.register(SPEC)  # through this replica: seen at once
    assert (await registry.lookup("crm.lookup"))[0] == [SPEC]
    assert (await registry.lookup("crm.lookup"))[0] == [SPEC] and inner.lookups == 2
    await inner.register(replace(SPEC, version="2.0.0"))  # another replica; its NOTIFY arrives:
    notifier.generation += 1
    assert len((await registry.lookup("crm.lookup"))[0]) == 2 and inner.lookups == 3
    notifier.listening.clear()  # not listening: every read goes to the database
    await registry.lookup("crm.lookup")
    await registry.lookup("crm.lookup")
    assert inner.lookups == 5


async def test_a_call_finds_its_tool_by_name_without_listing_the_registry() -> None:
    ports = fake_ports()
    await ports.registry.register(SPEC)

    async def no_scan():
        raise AssertionError("the call path listed the whole registry")

    ports.registry.list = no_scan
    ports.backends.behaviours[SPEC.name] = lambda arguments: asyncio.sleep(0, {"id": arguments["id"]})
    outcome = await call_tool(ToolCall(name=SPEC.name, arguments={"id": "c-1"}, principal=AGENT), ports)
    assert outcome.error is None and outcome.result.value == {"id": "c-1"}


def test_a_validator_is_compiled_once_per_tool_version_and_rebuilt_when_its_schema_changes() -> None:
    same = replace(SPEC, input_schema=dict(SPEC.input_schema))  # equal, read again from the registry
    assert input_validator(SPEC) is input_validator(same)
    changed = replace(SPEC, input_schema={"type": "object", "required": ["id"]})
    assert input_validator(changed) is not input_validator(SPEC)


class MemoryStore:
    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], Experience] = {}
        self.loads = self.saves = 0

    async def load(self, tenant_id: str, tool: str, context: str):
        self.loads += 1
        return self.rows.get((tool, context))

    async def save(self, tenant_id: str, exp: Experience) -> None:
        self.saves += 1
        self.rows[exp.tool, exp.context] = exp


async def test_a_batch_of_calls_folds_into_each_stats_row_once() -> None:
    store = MemoryStore()
    calls = [("crm.lookup", "refund" if i % 2 else "", Observation(ok=i % 3 != 0, latency_ms=5.0 + i))
             for i in range(30)]
    await record_calls("acme", calls, store)
    overall = store.rows["crm.lookup", ""]
    assert (overall.calls, overall.failures) == (30, 10)
    assert store.loads == 2 and store.saves == 2  # the overall row and the "refund" context's row

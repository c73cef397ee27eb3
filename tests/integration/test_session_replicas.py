"""Sessions in the real event store: the agent loop, snapshots, and a Jepsen-style history checker of device
replicas (read-your-writes, monotonic reads, convergence, no lost or duplicated write)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

import anyio
import pytest

from libs.db import Database
from libs.eventstore import EventStore
from libs.outbox import Outbox
from libs.snapshots import SnapshotStore
from services.orchestrator.adapters.local import LocalMemory, LocalTools
from services.orchestrator.adapters.repository import EventSourcedSessions, stream_id
from services.orchestrator.adapters.rules_file import RulesFile
from services.orchestrator.domain import SNAPSHOT_SCHEMA, MessageAppended, Session, State, Versioned
from services.orchestrator.service_layer.agent import Agent
from services.orchestrator.service_layer.handlers import SendMessage, replay_session, send_message

pytestmark = pytest.mark.integration


def make(db: Database, every: int = 100) -> tuple[EventSourcedSessions, Agent, LocalTools]:
    store = EventStore(db, stream_poll_seconds=1.0)
    sessions = EventSourcedSessions(db, store, Outbox(db), SnapshotStore(every))
    tools, memory = LocalTools(), LocalMemory()
    return sessions, Agent(sessions, RulesFile(), memory, tools, memory), tools


async def test_a_turn_through_the_real_store_replays_to_the_live_state_and_a_snapshot_plus_tail_equals_it(
        db: Database) -> None:
    sessions, agent, tools = make(db, every=7)
    for text in ("where is my order?", "A12345", "hello", "我要退款", "取消", "check invoice for B99999"):
        await send_message(SendMessage("acme", "u1", "s1", "web", text), sessions, agent)

    fresh = EventSourcedSessions(db, sessions.store, sessions.outbox, SnapshotStore(7), cache_size=0)
    live = await fresh.load("acme", "s1")  # from the latest snapshot + the events after it (no cached state)
    full = await replay_session("acme", "s1", sessions)
    async with db.transaction("acme") as conn:
        snapshot = await SnapshotStore.load(conn, stream_id("acme", "s1"), SNAPSHOT_SCHEMA)
    assert snapshot is not None and 0 < snapshot.version <= live.version
    assert live.to_dict() == full.to_dict()
    assert live.state == State.IDLE and "invoice for order B99999" in live.messages[-1].text
    assert len(tools.calls) == 2


async def test_a_snapshot_of_another_shape_is_ignored_and_the_session_replays_in_full(db: Database) -> None:
    sessions, agent, _ = make(db, every=1)
    await send_message(SendMessage("acme", "u1", "s1", "web", "hello"), sessions, agent)
    async with db.transaction("acme") as conn:
        await conn.execute("UPDATE snapshots SET schema = 'session/0', state = '{}'::jsonb")
    fresh = EventSourcedSessions(db, sessions.store, sessions.outbox, SnapshotStore(1), cache_size=0)
    assert (await fresh.load("acme", "s1")).to_dict() == (await replay_session("acme", "s1", sessions)).to_dict()


# --- the history checker -------------------------------------------------------------------------------------


@dataclass
class Device:
    name: str
    replica: list[Versioned] = field(default_factory=list)  # what this device has seen, in order
    connected: asyncio.Task | None = None
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    @property
    def version(self) -> int:
        return self.replica[-1].version if self.replica else 0

    async def run(self, sessions: EventSourcedSessions) -> None:
        async for item in sessions.follow("acme", "hist", self.version):
            assert item.version == self.version + 1, f"{self.name}: gap or repeat at {item.version}"
            async with self.changed:
                self.replica.append(item)
                self.changed.notify_all()

    def connect(self, sessions: EventSourcedSessions) -> None:
        self.connected = asyncio.create_task(self.run(sessions))

    async def disconnect(self) -> None:
        if self.connected is not None:
            self.connected.cancel()
            await asyncio.gather(self.connected, return_exceptions=True)
            self.connected = None

    async def wait_for(self, version: int) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: self.version >= version)


async def test_history_checker_five_devices_a_thousand_operations_with_disconnects(db: Database) -> None:
    """Every operation is recorded as (device, op, values); the checks run on the recorded history."""
    sessions = EventSourcedSessions(db, EventStore(db, stream_poll_seconds=1.0), Outbox(db))
    rng = random.Random(20260311)
    devices = [Device(f"d{i}") for i in range(5)]
    history: list[tuple[str, str, tuple]] = []
    sent: dict[str, int] = {}  # text -> version the store gave it (acknowledged writes)

    async def device_loop(device: Device, operations: int) -> None:
        device.connect(sessions)
        last_write = 0
        for n in range(operations):
            roll = rng.random()
            if roll < 0.45:
                text = f"{device.name}-{n}"
                session = await send_message(SendMessage("acme", "u1", "hist", device.name, text), sessions)
                version = next(i for i, m in enumerate(session.messages) if m.text == text)  # kept
                assert version >= 0
                sent[text] = session.version
                last_write = max(last_write, session.version)
                history.append((device.name, "write", (text, session.version)))
            elif roll < 0.55:
                await device.disconnect()
                history.append((device.name, "disconnect", (device.version,)))
                await asyncio.sleep(0)  # let other devices write while this one is away
                device.connect(sessions)
                history.append((device.name, "reconnect", (device.version,)))
            else:
                if device.connected is None:
                    device.connect(sessions)
                await device.wait_for(last_write)  # the session guarantee a device gives its user
                texts = {e.event.text for e in device.replica if isinstance(e.event, MessageAppended)}
                history.append((device.name, "read", (device.version, frozenset(texts))))

    with anyio.fail_after(120):
        await asyncio.gather(*(device_loop(d, 200) for d in devices))
        final = await sessions.history("acme", "hist")
        for device in devices:
            if device.connected is None:
                device.connect(sessions)
            await device.wait_for(final[-1].version)
    for device in devices:
        await device.disconnect()

    assert len(history) >= 1_000
    # read-your-writes: a read shows every write the same device made before it
    # monotonic reads: the versions one device reads never go back, across reconnects
    for device in devices:
        own: set[str] = set()
        seen = 0
        for name, op, values in history:
            if name != device.name:
                continue
            if op == "write":
                own.add(values[0])
            elif op == "read":
                version, texts = values
                assert own <= texts, f"{name} did not read its own writes {sorted(own - texts)[:3]}"
                assert version >= seen, f"{name} read version {version} after {seen}"
                seen = version
    # convergence: every replica is the store's history, in the same order; no write lost or doubled
    for device in devices:
        assert [(v.version, v.event) for v in device.replica] == [(v.version, v.event) for v in final]
    texts = [v.event.text for v in final if isinstance(v.event, MessageAppended)]
    assert sorted(texts) == sorted(sent) and len(texts) == len(set(texts))
    assert Session.replay("acme", "hist", final).version == final[-1].version

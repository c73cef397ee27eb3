"""`mnemesh bench sessions`: device replicas of one session, and the deterministic planner's turn latency.

Two phases, each through a real gRPC Orchestrator server on the real event store (the path devices take):

- convergence: `devices` devices subscribe to one session (gRPC Subscribe) and write to it (gRPC Send,
  expected version -1) at `rate` events/s in total for `seconds` (open loop: a send leaves at its time,
  answered or not; concurrent sends to the session are group-committed). An event's convergence lag is the time
  from its append being acknowledged to the device that wrote it until the last device saw it (0 when
  every device saw it before the writer's acknowledgement arrived, which NOTIFY makes possible).
  The writers' server appends messages only (no agent): this phase measures replication, not turns.
  It runs twice in one run: first the baseline (a transaction per update, a store reader per device),
  then the current repository (group commit, one shared reader); the ratios compare them.
- turns: `repetitions` messages on the rule path ("where is my order A…?": rule → slot → tool from the
  local fixture → grounded reply), each timed from Send until Send answers (Send returns after the reply
  event is committed), `warmup` untimed first; then the same for the planner path (no rule matches:
  LLM_DECIDE → the deterministic planner), reported apart from the summary.

The final JSON line's `summary` has exactly the keys the issue names.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field

import asyncpg

from libs.bench import percentile
from libs.auth import TokenVerifier, issue_token
from libs.config import Settings
from libs.db import Database, apply_migrations, load_migrations
from libs.eventstore import EventStore
from libs.outbox import Outbox
from libs.protogen.mnemesh.v1 import common_pb2, sessions_pb2, sessions_pb2_grpc
from libs.rpc import GrpcServer, channel
from libs.snapshots import SnapshotStore
from services.orchestrator.adapters.local import LocalMemory, LocalTools
from services.orchestrator.adapters.repository import EventSourcedSessions
from services.orchestrator.adapters.rules_file import RulesFile
from services.orchestrator.entrypoints import grpc_api
from services.orchestrator.service_layer.agent import Agent

__all__ = ["bench_sessions"]

TENANT = "bench"
_IN_FLIGHT = 16  # unanswered sends a writing device may have




def _stats(samples: list[float]) -> dict:
    return {"p50_ms": round(statistics.median(samples), 3) if samples else 0.0,
            "p95_ms": round(percentile(samples, 0.95), 3), "p99_ms": round(percentile(samples, 0.99), 3),
            "max_ms": round(max(samples), 3) if samples else 0.0, "samples": len(samples)}


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class _Device:
    name: str
    seen: dict[int, float] = field(default_factory=dict)  # version -> when this device received it
    version: int = 0
    moved: asyncio.Event = field(default_factory=asyncio.Event)

    async def follow(self, stub: sessions_pb2_grpc.OrchestratorStub, session_id: str) -> None:
        async for event in stub.Subscribe(sessions_pb2.SubscribeRequest(session_id=session_id, from_version=0)):
            self.seen[event.version] = time.perf_counter()
            self.version = event.version
            self.moved.set()

    async def reach(self, version: int) -> None:
        while self.version < version:
            self.moved.clear()
            await self.moved.wait()


async def _server(settings: Settings, db: Database, agent: bool, baseline: bool = False) -> tuple[GrpcServer, str]:
    from mnemesh.infra import free_port

    sessions = EventSourcedSessions(db, EventStore(db), Outbox(db), SnapshotStore(),
                                    **({"max_group": 1, "shared_reader": False} if baseline else {}))
    runner = None
    if agent:
        memory = LocalMemory()
        runner = Agent(sessions, RulesFile(), memory, LocalTools(), memory)
    port = free_port()
    server = GrpcServer("127.0.0.1", port, [grpc_api.registration(sessions, runner)], TokenVerifier(settings))
    await server.start()
    return server, f"127.0.0.1:{port}"


def _send(session_id: str, device: str, text: str) -> sessions_pb2.SendRequest:
    return sessions_pb2.SendRequest(tenant=common_pb2.TenantContext(user_id="u1"), session_id=session_id,
                                    device_id=device, text=text, expected_version=-1)


async def _convergence(address: str, token: str, devices: int, rate: float, seconds: float) -> dict:
    session_id = f"conv-{uuid.uuid4().hex[:8]}"
    acked: dict[int, float] = {}  # version -> when its writer got the acknowledgement
    async with channel(address, token) as ch:
        stub = sessions_pb2_grpc.OrchestratorStub(ch)
        replicas = [_Device(f"device-{i}") for i in range(devices)]
        following = [asyncio.create_task(d.follow(stub, session_id)) for d in replicas]
        try:
            per_writer = rate / devices
            writes = int(per_writer * seconds)
            start = time.perf_counter() + 0.2  # every follower is subscribed before the first write

            async def send(device: _Device, n: int) -> None:
                reply = await stub.Send(_send(session_id, device.name, f"{device.name} message {n} 你好"), timeout=10)
                acked.setdefault(reply.version, time.perf_counter())

            async def writer(i: int, device: _Device) -> None:
                """Open loop: each send leaves at its time whether the ones before it were answered or not, so
                the offered load is the rate (a writer waiting for each answer offers only 1/latency), up to
                `_IN_FLIGHT` unanswered sends a device: a server slower than the rate slows the writers
                down instead of piling up sends until they time out."""
                sending, slots = [], asyncio.Semaphore(_IN_FLIGHT)

                async def paced(n: int) -> None:
                    try:
                        await send(device, n)
                    finally:
                        slots.release()

                for n in range(writes):
                    due = start + (n + i / devices) / per_writer
                    delay = due - time.perf_counter()
                    if delay > 0:  # pacing to the rate, not waiting for a condition
                        await asyncio.sleep(delay)
                    await slots.acquire()
                    sending.append(asyncio.ensure_future(paced(n)))
                await asyncio.gather(*sending)

            began = time.perf_counter()
            await asyncio.gather(*(writer(i, d) for i, d in enumerate(replicas)))
            elapsed = time.perf_counter() - max(began, start)
            last = max(acked)
            await asyncio.wait_for(asyncio.gather(*(d.reach(last) for d in replicas)), timeout=60)
        finally:
            for task in following:
                task.cancel()
            await asyncio.gather(*following, return_exceptions=True)
    lags = []
    for version, ack in acked.items():
        everyone = max(d.seen[version] for d in replicas)
        lags.append(max(0.0, (everyone - ack) * 1000))
    # Every version reached every device (a version seen by all, none missing): the convergence check.
    complete = all(set(range(1, last + 1)) <= d.seen.keys() for d in replicas)
    return {"devices": devices, "seconds": round(elapsed, 2), "events": last, "sends": len(acked),
            "events_per_s": round(last / elapsed, 1), "target_rate": rate, "converged": complete,
            "lag": _stats(lags)}


async def _turns(address: str, token: str, repetitions: int, warmup: int, text: str) -> dict:
    samples = []
    async with channel(address, token) as ch:
        stub = sessions_pb2_grpc.OrchestratorStub(ch)
        session_id = ""
        for i in range(warmup + repetitions):
            if i % 20 == 0:  # a fresh session now and then: a turn's cost, not a growing history's
                session_id = f"turn-{uuid.uuid4().hex[:8]}"
            started = time.perf_counter()
            reply = await stub.Send(_send(session_id, "bench", text.format(n=10_000 + i)), timeout=10)
            if i >= warmup:
                samples.append((time.perf_counter() - started) * 1000)
            if reply.state != "IDLE":
                raise RuntimeError(f"a turn ended in {reply.state}, not IDLE: the benchmark's path is broken")
    return _stats(samples)


async def bench_sessions(settings: Settings, repetitions: int, warmup: int, seconds: float = 30.0,
                         rate: float = 200.0, devices: int = 5) -> dict:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    await apply_migrations(settings.database_url, schema, load_migrations())
    db = Database(settings.database_url, schema, max_size=16)
    await db.open()
    token = issue_token(settings, subject="bench", tenant_id=TENANT, scopes=["*"], ttl_seconds=3600)
    servers = []
    try:
        runs = {}
        for name, baseline in (("baseline", True), ("current", False)):
            server, address = await _server(settings, db, agent=False, baseline=baseline)
            servers.append(server)
            _say(f"convergence ({name}: {'a transaction an update, a reader a device' if baseline else 'group commit, one reader'}): "
                 f"{devices} devices, {rate:.0f} events/s for {seconds:.0f} s ...")
            runs[name] = await _convergence(address, token, devices, rate, seconds)
            _say(f"  {runs[name]['events_per_s']} events/s, lag p50 {runs[name]['lag']['p50_ms']} ms, "
                 f"p99 {runs[name]['lag']['p99_ms']} ms, converged: {runs[name]['converged']}")
        convergence, before = runs["current"], runs["baseline"]
        ratios = {"events_per_s": round(convergence["events_per_s"] / max(before["events_per_s"], 1e-9), 2),
                  "lag_p99": round(convergence["lag"]["p99_ms"] / max(before["lag"]["p99_ms"], 1e-9), 2)}
        _say(f"  current / baseline: events/s x{ratios['events_per_s']}, lag p99 x{ratios['lag_p99']}")
        server, address = await _server(settings, db, agent=True)
        servers.append(server)
        rule = await _turns(address, token, repetitions, warmup, "where is my order A{n}?")
        _say(f"turns, rule path: p50 {rule['p50_ms']} ms, p95 {rule['p95_ms']} ms")
        planner = await _turns(address, token, repetitions, warmup, "what do you remember about topic {n}?")
        _say(f"turns, planner path: p50 {planner['p50_ms']} ms, p95 {planner['p95_ms']} ms")
    finally:
        for server in servers:
            await server.stop(0)
        await db.close()
        conn = await asyncpg.connect(settings.database_url)
        try:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        finally:
            await conn.close()
    summary = {
        "events_per_s": convergence["events_per_s"],
        "devices": devices,
        "convergence_p50_ms": convergence["lag"]["p50_ms"],
        "convergence_p99_ms": convergence["lag"]["p99_ms"],
        "turn_p50_ms": rule["p50_ms"],
        "turn_p95_ms": rule["p95_ms"],
    }
    return {"results": [{"convergence": convergence, "convergence_baseline": before, "ratios": ratios,
                         "turn_rule_path": rule, "turn_planner_path": planner}],
            "summary": summary}

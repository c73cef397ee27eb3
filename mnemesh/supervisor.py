"""`mnemesh run`: infrastructure, then the five services as supervised child processes.

Children run in sessions of their own, so a Ctrl-C reaches the supervisor alone
and the stop is ordered: services first (they drain and close their
connections), infrastructure last. A service that exits on its own is restarted
with exponential backoff. Every child dies with the supervisor (see
mnemesh/processes.py), so a killed supervisor leaves no orphan behind. One data
folder serves one `mnemesh run` at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from libs.config import SERVICES, Settings, redacted
from mnemesh.infra import Infrastructure, InfrastructureError, free_port, port_free, start_infrastructure
from mnemesh.processes import DataFolderBusy, data_folder_lock, guarded
from mnemesh.watchdog import Watchdog

__all__ = ["check_health", "mcp_url", "print_table", "run_mesh", "status_file"]

# A service stops within 0.5 s (health drain) + its grace + 2.5 s (consumers finish in-flight
# events); the supervisor allows that plus half a second before it kills.
SERVICE_STOP_OVERHEAD = 3.5
HEALTH_TIMEOUT = 180.0


def status_file(settings: Settings) -> Path:
    return settings.data_dir.resolve() / "run" / "status.json"


async def check_health(address: str, timeout: float = 2.0) -> bool:
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.aio.AioRpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def mcp_url(settings: Settings) -> str:
    return f"http://{settings.host}:{settings.mcp_http_port}/mcp"


def check_ports(settings: Settings) -> None:
    ports: list[tuple[str, int, str]] = []
    for name in SERVICES:
        key = name.upper().replace("-", "_")
        ports += [(name, settings.grpc_port(name), f"MNEMESH_{key}_GRPC_PORT"),
                  (name, settings.metrics_port(name), f"MNEMESH_{key}_METRICS_PORT")]
    ports.append(("the MCP endpoint (tool-gateway)", settings.mcp_http_port, "MNEMESH_MCP_HTTP_PORT"))
    for name, port, setting in ports:
        if port and not port_free(port, settings.host):
            raise InfrastructureError(f"port {port} for {name} is in use: stop what holds it, or set "
                                      f"{setting} to a free port")


@dataclass
class Child:
    name: str
    address: str
    metrics: str
    log: Path
    service: str = ""  # what it serves (`name` unless it is an extra worker, e.g. memory-writer.2)
    env: dict[str, str] = field(default_factory=dict)  # its own settings (a worker's replica and ports)
    process: subprocess.Popen | None = None
    restarts: int = 0
    started_at: float = 0.0
    restart_at: float | None = None
    healthy: bool = False


@dataclass
class Supervisor:
    settings: Settings
    env: dict[str, str]
    watchdog: Watchdog | None = None
    children: dict[str, Child] = field(default_factory=dict)

    def __post_init__(self) -> None:
        logs = self.settings.data_dir.resolve() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        host = self.settings.host
        for name in SERVICES:
            self.children[name] = Child(
                name, f"{host}:{self.settings.grpc_port(name)}",
                f"http://{host}:{self.settings.metrics_port(name)}/metrics", logs / f"{name}.log", service=name)
        # More memory-writer processes: each consumes the commands stream as a replica of its own (a stream
        # batch is CPU-bound Python; one process uses one core), on ports of its own, which nobody needs to know.
        replica = self.settings.replica or socket.gethostname()
        for k in range(2, self.settings.memory_writer_workers + 1):
            name = f"memory-writer.{k}"
            self.children[name] = Child(name, "", "", logs / f"{name}.log", service="memory-writer",
                                        env={"MNEMESH_REPLICA": f"{replica}.{k}"[-64:]})

    def _worker_ports(self, child: Child) -> None:
        """Free ports for an extra worker, chosen at each start (a port free at the last may be taken now)."""
        host, grpc_port = self.settings.host, free_port(self.settings.host)
        metrics = self.settings.metrics_enabled and self.settings.metrics_port(child.service) != 0
        metrics_port = free_port(self.settings.host) if metrics else 0
        child.env |= {"MNEMESH_MEMORY_WRITER_GRPC_PORT": str(grpc_port),
                      "MNEMESH_MEMORY_WRITER_METRICS_PORT": str(metrics_port)}
        child.address = f"{host}:{grpc_port}"
        child.metrics = f"http://{host}:{metrics_port}/metrics" if metrics_port else ""

    def spawn(self, child: Child) -> None:
        if child.service != child.name:
            self._worker_ports(child)
        env = {**self.mesh_addresses(), **os.environ, **self.env, **child.env,
               "MNEMESH_DATA_DIR": str(self.settings.data_dir.resolve())}
        with child.log.open("ab") as out:
            child.process = subprocess.Popen(
                guarded([sys.executable, "-m", "mnemesh", "serve", child.service]), env=env, stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        child.started_at, child.healthy, child.restart_at = time.monotonic(), False, None

    def mesh_addresses(self) -> dict[str, str]:
        """The orchestrator calls this mesh's retriever, memory-writer and tool-gateway, and serves A2A (a
        setting in the environment wins)."""
        host = self.settings.host
        return {**{f"MNEMESH_ORCHESTRATOR_{name.upper().replace('-', '_')}": f"{host}:{self.settings.grpc_port(name)}"
                   for name in ("retriever", "memory-writer", "tool-gateway")},
                "MNEMESH_ORCHESTRATOR_HTTP_PORT": "8055"}  # its A2A card and endpoint

    def tail(self, child: Child, lines: int = 12) -> str:
        try:
            return "\n".join(child.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    async def wait_healthy(self, stop: asyncio.Event) -> Child | None:
        """Wait until every child is SERVING; return the first that died or timed out instead."""
        deadline = time.monotonic() + HEALTH_TIMEOUT
        while not stop.is_set():
            for child in self.children.values():
                if child.process and child.process.poll() is not None:
                    return child
                if not child.healthy and await check_health(child.address):
                    child.healthy = True
                    print(f"  {child.name} is serving on {child.address} "
                          f"({time.monotonic() - child.started_at:.1f} s)", flush=True)
            if all(c.healthy for c in self.children.values()):
                return None
            if time.monotonic() > deadline:
                return next(c for c in self.children.values() if not c.healthy)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.3)
        return None

    async def supervise(self, stop: asyncio.Event, infra: Infrastructure | None = None) -> None:
        """Restart children that exit on their own, each on its own backoff: 1, 2, 4 ... 30 s.

        The embedded servers are watched too (mnemesh/watchdog.py), and every 2 s the dependencies
        are probed and the status file rewritten with what was found.
        """
        next_probe = 0.0
        while not stop.is_set():
            now = time.monotonic()
            if self.watchdog is not None:
                self.watchdog.check_processes()
                if now >= next_probe and infra is not None:
                    before = dict(self.watchdog.problems)
                    problems = await self.watchdog.probe()
                    for name in problems.keys() - before.keys():
                        print(f"  {name} is unreachable: {problems[name]}", flush=True)
                    for name in before.keys() - problems.keys():
                        print(f"  {name} answers again", flush=True)
                    self.write_status(infra)
                    next_probe = time.monotonic() + 2.0
            for child in self.children.values():
                if child.restart_at is not None:
                    if now >= child.restart_at:
                        self.spawn(child)
                elif child.process and child.process.poll() is not None:
                    # A child that ran a good while had a fresh failure, not a crash loop.
                    delay = 1.0 if now - child.started_at > 60 else min(30.0, 2.0 ** min(child.restarts, 5))
                    child.restarts += 1
                    child.restart_at = now + delay
                    print(f"  {child.name} exited with code {child.process.returncode}; restart {child.restarts} "
                          f"in {delay:.0f} s (log: {child.log})", flush=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)

    async def stop_all(self) -> None:
        running = [c for c in self.children.values() if c.process and c.process.poll() is None]
        for child in running:
            child.process.send_signal(signal.SIGTERM)
        allowed = self.settings.shutdown_grace_seconds + SERVICE_STOP_OVERHEAD
        deadline = time.monotonic() + allowed
        while time.monotonic() < deadline and any(c.process.poll() is None for c in running):
            await asyncio.sleep(0.1)
        for child in running:
            if child.process.poll() is None:
                print(f"  {child.name} did not stop in {allowed:.1f} s; killing it", flush=True)
                child.process.kill()
                child.process.wait()

    def write_status(self, infra: Infrastructure) -> None:
        path = status_file(self.settings)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "supervisor_pid": os.getpid(),
            "infrastructure": {"redis": redacted(infra.redis_url), "postgres": redacted(infra.database_url),
                               "qdrant": redacted(infra.qdrant)},
            "dependencies": self.watchdog.status() if self.watchdog else {},
            "mcp": mcp_url(self.settings),
            "services": {c.name: {"grpc": c.address, "metrics": c.metrics, "log": str(c.log),
                                  "pid": c.process.pid if c.process else None} for c in self.children.values()},
        }, indent=2))


def print_table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  " + "  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)).rstrip(), flush=True)


async def _start_infrastructure(settings: Settings, stop: asyncio.Event) -> Infrastructure | None:
    """Start the infrastructure, or give up cleanly (None) when asked to stop meanwhile."""
    starting = asyncio.create_task(start_infrastructure(settings, say=lambda m: print(m, flush=True)))
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not starting.done():
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        return None
    return starting.result()


async def _serve(settings: Settings, infra: Infrastructure, stop: asyncio.Event) -> int:
    sup = Supervisor(settings, infra.env(), Watchdog(infra, say=lambda m: print(m, flush=True)))
    code = 0
    try:
        print(f"  starting {', '.join(sup.children)}...", flush=True)
        for child in sup.children.values():
            sup.spawn(child)
        failed = await sup.wait_healthy(stop)
        if failed is not None:
            state = "exited" if failed.process.poll() is not None else f"was not healthy after {HEALTH_TIMEOUT:.0f} s"
            print(f"\n{failed.name} {state}; the end of its log ({failed.log}):\n{sup.tail(failed)}\n"
                  "fix the cause above (a setting, a port in use, unreachable infrastructure) and run again",
                  file=sys.stderr, flush=True)
            code = 1
        elif not stop.is_set():
            sup.write_status(infra)
            print("\nThe mesh is up:", flush=True)
            print_table([(c.name, c.address, c.metrics, str(c.log)) for c in sup.children.values()],
                        ("service", "gRPC", "metrics", "log"))
            print(f"\n  MCP for agents (tool-gateway, Streamable HTTP): {mcp_url(settings)}", flush=True)
            print("\n  `mnemesh status` shows this again; Ctrl-C stops everything.", flush=True)
            await sup.supervise(stop, infra)
    finally:
        print("Stopping the mesh...", flush=True)
        await sup.stop_all()
        await sup.watchdog.aclose()
        status_file(settings).unlink(missing_ok=True)
    return code


async def run_mesh(settings: Settings) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    print(f"Mnemesh: starting the mesh (data folder {settings.data_dir.resolve()})", flush=True)
    try:
        with data_folder_lock(settings.data_dir):
            check_ports(settings)
            infra = await _start_infrastructure(settings, stop)
            if infra is None:
                print("Stopped before the mesh was up.", flush=True)
                return 130
            try:
                return await _serve(settings, infra, stop)
            finally:
                await asyncio.to_thread(infra.stop)
                print("Stopped.", flush=True)
    except (InfrastructureError, DataFolderBusy) as exc:
        print(f"cannot start the mesh: {exc}", file=sys.stderr, flush=True)
        return 1

"""`mnemesh run`: infrastructure, then the five services as supervised child processes.

Children run in sessions of their own, so a Ctrl-C reaches the supervisor alone
and the stop is ordered: services first (they drain and close their
connections), infrastructure last. A service that exits on its own is restarted
with exponential backoff. Each child gets the parent-death signal, so a killed
supervisor leaves no orphan behind.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from libs.config import SERVICES, Settings
from mnemesh.infra import Infrastructure, InfrastructureError, start_infrastructure

__all__ = ["run_mesh", "status_file"]

STOP_TIMEOUT = 7.0
HEALTH_TIMEOUT = 180.0


def status_file(settings: Settings) -> Path:
    return settings.data_dir.resolve() / "run" / "status.json"


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


async def check_health(address: str, timeout: float = 2.0) -> bool:
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.aio.AioRpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


@dataclass
class Child:
    name: str
    address: str
    metrics: str
    log: Path
    process: subprocess.Popen | None = None
    restarts: int = 0
    started_at: float = 0.0
    healthy: bool = False


@dataclass
class Supervisor:
    settings: Settings
    env: dict[str, str]
    children: dict[str, Child] = field(default_factory=dict)

    def __post_init__(self) -> None:
        logs = self.settings.data_dir.resolve() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        host = self.settings.host
        for name in SERVICES:
            self.children[name] = Child(
                name, f"{host}:{self.settings.grpc_port(name)}",
                f"http://{host}:{self.settings.metrics_port(name)}/metrics", logs / f"{name}.log")

    def spawn(self, child: Child) -> None:
        env = {**os.environ, **self.env, "MNEMESH_DATA_DIR": str(self.settings.data_dir.resolve())}
        with child.log.open("ab") as out:
            child.process = subprocess.Popen(
                [sys.executable, "-m", "mnemesh", "serve", child.name], env=env, stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=_die_with_parent)
        child.started_at, child.healthy = time.monotonic(), False

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
            await asyncio.sleep(0.3)
        return None

    async def supervise(self, stop: asyncio.Event) -> None:
        """Restart children that exit on their own, backing off 1, 2, 4 ... 30 s."""
        while not stop.is_set():
            for child in self.children.values():
                if child.process and child.process.poll() is not None and not stop.is_set():
                    code = child.process.returncode
                    delay = min(30.0, 2.0 ** child.restarts)
                    if time.monotonic() - child.started_at > 60:
                        delay = 1.0  # it ran a good while: a fresh failure, not a crash loop
                    child.restarts += 1
                    print(f"  {child.name} exited with code {code}; restart {child.restarts} in {delay:.0f} s "
                          f"(log: {child.log})", flush=True)
                    try:
                        await asyncio.wait_for(stop.wait(), delay)
                    except TimeoutError:
                        self.spawn(child)
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except TimeoutError:
                pass

    async def stop_all(self) -> None:
        running = [c for c in self.children.values() if c.process and c.process.poll() is None]
        for child in running:
            child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        while time.monotonic() < deadline and any(c.process.poll() is None for c in running):
            await asyncio.sleep(0.1)
        for child in running:
            if child.process.poll() is None:
                print(f"  {child.name} did not stop in {STOP_TIMEOUT:.0f} s; killing it", flush=True)
                child.process.kill()
                child.process.wait()

    def write_status(self, infra: Infrastructure) -> None:
        path = status_file(self.settings)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "supervisor_pid": os.getpid(),
            "infrastructure": {"redis": infra.redis_url, "postgres": infra.database_url, "qdrant": infra.qdrant},
            "services": {c.name: {"grpc": c.address, "metrics": c.metrics, "log": str(c.log),
                                  "pid": c.process.pid if c.process else None} for c in self.children.values()},
            "mcp": f"http://{self.settings.host}:{self.settings.mcp_http_port}/mcp",
        }, indent=2))


def print_table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  " + "  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)), flush=True)


async def run_mesh(settings: Settings) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    print(f"Mnemesh: starting the mesh (data folder {settings.data_dir.resolve()})", flush=True)
    try:
        infra = await start_infrastructure(settings, say=lambda m: print(m, flush=True))
    except InfrastructureError as exc:
        print(f"cannot start the infrastructure: {exc}", file=sys.stderr, flush=True)
        return 1
    sup = Supervisor(settings, infra.env())
    code = 0
    try:
        print("  starting memory-writer, retriever, tool-gateway, adapter, orchestrator...", flush=True)
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
            print("\n  `mnemesh status` shows this again; Ctrl-C stops everything.", flush=True)
            await sup.supervise(stop)
    finally:
        print("Stopping the mesh...", flush=True)
        await sup.stop_all()
        await asyncio.to_thread(infra.stop)
        status_file(settings).unlink(missing_ok=True)
        print("Stopped.", flush=True)
    return code

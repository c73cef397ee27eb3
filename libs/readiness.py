"""Readiness: a service is SERVING only while the servers it needs (Redis, PostgreSQL) answer.

A process that is alive but cut off from its database accepts calls it can only fail, and a
load balancer keeps sending them. `watch_dependencies` probes each dependency every second and
flips the gRPC health of the whole server to NOT_SERVING while any is unreachable, back to
SERVING when all answer again, logging each change with the reason. The probes are the same
`mnemesh run` uses to show the dependencies in `mnemesh status`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

import asyncpg
import redis.asyncio
import redis.exceptions

from libs.config import Settings
from libs.logs import get_logger

__all__ = ["Probe", "Readiness", "close_probes", "dependency_probes", "postgres_probe", "probe_all",
           "redis_probe", "watch_dependencies"]

log = get_logger(__name__)

class Probe(Protocol):
    async def __call__(self) -> None:
        """Return when the dependency answers; raise when it does not within the probe's timeout."""

    async def aclose(self) -> None:
        """Release what the probe keeps between calls."""


class Readiness(Protocol):
    """What the watcher flips: GrpcServer.set_ready."""

    async def set_ready(self, ready: bool, reason: str = "") -> None: ...


class _RedisProbe:
    def __init__(self, url: str, timeout: float) -> None:
        self.url, self.timeout = url, timeout

    async def __call__(self) -> None:
        client = redis.asyncio.from_url(self.url, socket_connect_timeout=self.timeout, socket_timeout=self.timeout)
        try:
            await client.ping()
        finally:
            await client.aclose()

    async def aclose(self) -> None:
        return


class _PostgresProbe:
    """SELECT 1 on a connection kept between probes (a new backend every second would be waste)."""

    def __init__(self, url: str, timeout: float) -> None:
        self.url, self.timeout = url, timeout
        self.conn: asyncpg.Connection | None = None

    async def __call__(self) -> None:
        try:
            if self.conn is None or self.conn.is_closed():
                self.conn = await asyncpg.connect(self.url, timeout=self.timeout)
            await self.conn.fetchval("SELECT 1", timeout=self.timeout)
        except BaseException:
            self._drop()  # broken or cancelled: the next probe connects afresh
            raise

    def _drop(self) -> None:
        if self.conn is not None:
            self.conn.terminate()
            self.conn = None

    async def aclose(self) -> None:
        if self.conn is not None:
            try:
                await asyncio.wait_for(self.conn.close(), self.timeout)
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
                self._drop()
            self.conn = None


def redis_probe(url: str, timeout: float = 2.0) -> Probe:
    return _RedisProbe(url, timeout)


def postgres_probe(url: str, timeout: float = 2.0) -> Probe:
    return _PostgresProbe(url, timeout)


async def close_probes(probes: Mapping[str, Probe]) -> None:
    for probe in probes.values():
        await probe.aclose()


def dependency_probes(settings: Settings, timeout: float = 2.0) -> dict[str, Probe]:
    """The probes of what every service needs: Redis (the bus) and PostgreSQL (the source of truth)."""
    probes: dict[str, Probe] = {}
    if settings.redis_url:
        probes["redis"] = redis_probe(settings.redis_url, timeout)
    if settings.database_url:
        probes["postgres"] = postgres_probe(settings.database_url, timeout)
    return probes


_UNREACHABLE = (OSError, TimeoutError, redis.exceptions.RedisError, asyncpg.PostgresError,
                asyncpg.InterfaceError)


async def probe_all(probes: Mapping[str, Probe], timeout: float = 2.0) -> dict[str, str]:
    """Run every probe at once; the problem of each unreachable dependency by name (empty: all answer)."""

    async def one(probe: Probe) -> str:
        try:
            await asyncio.wait_for(probe(), timeout)
        except _UNREACHABLE as exc:
            return f"{type(exc).__name__}: {exc}".strip().rstrip(":")
        return ""

    results = await asyncio.gather(*(one(p) for p in probes.values()))
    return {name: problem for name, problem in zip(probes, results, strict=True) if problem}


async def watch_dependencies(target: Readiness, probes: Mapping[str, Probe], *, every_seconds: float = 1.0,
                             timeout: float = 2.0) -> None:
    """Keep `target` NOT_SERVING while a dependency is unreachable, SERVING when all answer.

    Runs until cancelled, then closes the probes.
    """
    ready: bool | None = None
    try:
        while True:
            problems = await probe_all(probes, timeout)
            if (now_ready := not problems) != ready:
                ready = now_ready
                reason = "; ".join(f"{name} unreachable ({problem})" for name, problem in problems.items())
                await target.set_ready(ready, reason)
                if ready:
                    log.info("dependencies reachable: serving", dependencies=sorted(probes))
                else:
                    log.warning("a dependency is unreachable: not serving until it answers", reason=reason)
            await asyncio.sleep(every_seconds)
    finally:
        await close_probes(probes)

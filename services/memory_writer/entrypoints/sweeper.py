"""The sweeper: expiry, archive (and decay, through accesses) on a timer, by one replica at a time.

Every replica runs this loop; each round it tries to take (or renew) the Redis lease, and only the
holder sweeps. Tenants with work are found across tenants (the mesh's own machinery: a system
transaction), then each tenant is swept in its own transaction acting as that tenant.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime

from libs.db import Database
from libs.lease import RedisLease
from libs.logs import get_logger
from libs.transient import is_transient
from services.memory_writer.service_layer import upkeep
from services.memory_writer.service_layer.unit_of_work import UnitOfWorkFactory

__all__ = ["Sweeper"]

log = get_logger(__name__)

_DUE = ("SELECT tenant_id FROM memories WHERE expires_at <= $1"
        " UNION SELECT tenant_id FROM memories WHERE status = 1 AND coalesce(last_accessed_at, created_at) < $2"
        " LIMIT 1000")


class Sweeper:
    def __init__(self, db: Database, uow: UnitOfWorkFactory, lease: RedisLease, policy: upkeep.SweepPolicy, *,
                 every_seconds: float, clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.db, self.uow, self.lease, self.policy = db, uow, lease, policy
        self.every_seconds, self.clock = every_seconds, clock

    async def sweep_once(self) -> upkeep.SweepResult | None:
        """One round: None when another replica holds the lease; else what was expired and archived."""
        if not await self.lease.acquire():
            return None
        now = self.clock()
        async with self.db.system_transaction() as conn:
            tenants = [r[0] for r in await conn.fetch(_DUE, now, now - self.policy.archive_after)]
        expired, archived = [], []
        for tenant_id in tenants:
            if not await self.lease.acquire():  # renewed before each tenant; lost: stop, the new leader goes on
                break
            result = await upkeep.sweep_tenant(tenant_id, self.uow(), now, self.policy)
            expired += result.expired
            archived += result.archived
        if expired or archived:
            log.info("memories swept", expired=len(expired), archived=len(archived), tenants=len(tenants))
        return upkeep.SweepResult(tuple(expired), tuple(archived))

    async def run(self) -> None:
        while True:
            try:
                await self.sweep_once()
            except Exception as exc:  # noqa: BLE001 - transient outages are waited out; others end the task
                if not is_transient(exc):
                    raise
                log.warning("sweeper waits for its infrastructure", error=str(exc))
            await asyncio.sleep(self.every_seconds)  # a timer between rounds, not a wait for a condition

"""Upkeep of one tenant's memories: expiry, archive, and engagement from accesses.

The sweeper (entrypoints/sweeper.py) calls `sweep_tenant` for each tenant with work, as the leader;
the access consumer calls `record_access` for each MemoryAccessed event of the retriever. Time is
an argument everywhere, so tests move it instead of waiting.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from libs.eventstore import ANY_VERSION
from libs.validation import canonical_uuid
from services.memory_writer.domain import MemoryArchived, MemoryExpired
from services.memory_writer.service_layer.unit_of_work import UnitOfWork

__all__ = ["SweepPolicy", "SweepResult", "record_access", "sweep_tenant"]


@dataclass(frozen=True)
class SweepPolicy:
    archive_after: timedelta = timedelta(days=90)
    half_life: timedelta = timedelta(days=30)
    batch: int = 500


@dataclass(frozen=True)
class SweepResult:
    expired: tuple[str, ...] = ()
    archived: tuple[str, ...] = ()


async def sweep_tenant(tenant_id: str, uow: UnitOfWork, now: datetime, policy: SweepPolicy) -> SweepResult:
    """Remove the tenant's memories past `expires_at` and archive those idle past the archive period
    (at most `policy.batch` of each), announcing both; one transaction."""
    async with uow:
        expired = await uow.take_expired(tenant_id, now, policy.batch)
        if expired:
            await uow.record(f"memory-upkeep-{tenant_id}", ANY_VERSION, MemoryExpired(tenant_id, tuple(expired), now))
        archived = await uow.archive_idle(tenant_id, now - policy.archive_after, policy.batch)
        if archived:
            await uow.record(f"memory-upkeep-{tenant_id}", ANY_VERSION,
                             MemoryArchived(tenant_id, tuple(archived), now))
    return SweepResult(tuple(expired), tuple(archived))


async def record_access(tenant_id: str, memory_ids: list[str], at: datetime, uow: UnitOfWork,
                        policy: SweepPolicy) -> int:
    """Raise the engagement of accessed memories (after decaying it to `at`); an archived one is current
    again. Returns how many memories were touched.

    Ids are compared in their canonical form; one that is no UUID names no memory, so it touches none."""
    ids = [canonical for m in memory_ids if (canonical := canonical_uuid(m)) is not None]
    async with uow:
        return await uow.touch(tenant_id, ids, at, policy.half_life)

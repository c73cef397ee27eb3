"""The poisoning guard's quarantine: list what it holds, release a memory to service, or drop it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime

from libs.errors import NotFound, ValidationFailed
from libs.eventstore import ANY_VERSION
from libs.validation import check_uuid
from services.memory_writer.domain import (
    MemoryCorrected,
    MemoryForgotten,
    MemoryRecord,
    MemoryReleased,
    MemoryWritten,
    Status,
    WriteResult,
    WriteStatus,
    decide,
)
from services.memory_writer.service_layer.unit_of_work import UnitOfWork

__all__ = ["DropQuarantined", "ListQuarantine", "ReleaseQuarantined", "drop", "list_quarantine", "release"]


@dataclass(frozen=True)
class ListQuarantine:
    tenant_id: str
    user_id: str = ""
    limit: int = 50


async def list_quarantine(cmd: ListQuarantine, uow: UnitOfWork) -> list[MemoryRecord]:
    if not 0 <= cmd.limit <= 500:
        raise ValidationFailed(f"is {cmd.limit}; it must be 0 (means 50) to 500", field="limit")
    async with uow:
        return await uow.quarantined(cmd.tenant_id, cmd.user_id, cmd.limit or 50)


async def _held(uow: UnitOfWork, tenant_id: str, memory_id: str) -> MemoryRecord:
    """The quarantined memory, its user's keys held first (a forget waits for this unit), then read again."""
    memory_id = check_uuid(memory_id, "memory_id")
    record = await uow.get(tenant_id, memory_id)
    if record is not None:
        await uow.hold_keys(tenant_id, [record.user_id])
        record = await uow.get(tenant_id, memory_id)
    if record is None or record.status is not Status.QUARANTINED:
        raise NotFound(f"no quarantined memory {memory_id} for this tenant", field="memory_id",
                       hint="list the quarantine with ListQuarantine; a released or dropped memory is no longer there")
    return record


@dataclass(frozen=True)
class ReleaseQuarantined:
    tenant_id: str
    memory_id: str
    reason: str = ""
    released_by: str = ""


async def release(cmd: ReleaseQuarantined, uow: UnitOfWork, now: datetime | None = None) -> WriteResult:
    """A reviewer's verdict: the memory is fine. It now goes through the confidence rules of its key, as a
    fresh write would, and is announced (MemoryReleased, then MemoryWritten) for the read side to index."""
    now = now or datetime.now(UTC)
    async with uow:
        held = await _held(uow, cmd.tenant_id, cmd.memory_id)
        record = replace(held, status=Status.CURRENT, quarantine_reasons=(), changed_at=now,
                         reason=cmd.reason or held.reason)
        old = None
        if record.key:
            decision = decide(record, await uow.current_of(record.tenant_id, record.user_id, record.key))
            if decision.outcome is WriteStatus.DUPLICATE:  # the key meanwhile holds this very value
                await uow.delete(cmd.tenant_id, [held.memory_id])
                await uow.record(f"memory-{held.memory_id}", ANY_VERSION, MemoryForgotten(
                    held.tenant_id, held.user_id, (held.memory_id,), "released as a duplicate of the current value"))
                return WriteResult(decision.record.memory_id, duplicate=True, version=1, status=WriteStatus.DUPLICATE)
            record, old = replace(decision.record, changed_at=now), decision.supersedes
        if old is not None:
            await uow.supersede(record.tenant_id, old.memory_id, record.memory_id, now)
        await uow.update(record)
        stream = f"memory-{record.memory_id}"
        await uow.record(stream, ANY_VERSION, MemoryReleased(record, cmd.released_by, cmd.reason))
        version = await uow.record(stream, ANY_VERSION, MemoryWritten(record))
        if old is not None:
            version = await uow.record(stream, ANY_VERSION, MemoryCorrected(old, record))
    status = WriteStatus.CANDIDATE if record.status is Status.CANDIDATE else WriteStatus.STORED
    return WriteResult(record.memory_id, duplicate=False, version=version, status=status,
                       supersedes=old.memory_id if old else "", must_confirm=record.must_confirm)


@dataclass(frozen=True)
class DropQuarantined:
    tenant_id: str
    memory_id: str
    reason: str = ""


async def drop(cmd: DropQuarantined, uow: UnitOfWork) -> bool:
    """A reviewer's verdict: poison. The memory is deleted; it was never served."""
    async with uow:
        held = await _held(uow, cmd.tenant_id, cmd.memory_id)
        await uow.delete(cmd.tenant_id, [held.memory_id])
        await uow.record(f"memory-{held.memory_id}", ANY_VERSION, MemoryForgotten(
            held.tenant_id, held.user_id, (held.memory_id,), "dropped from quarantine"))  # (the reason may quote it)
    return True

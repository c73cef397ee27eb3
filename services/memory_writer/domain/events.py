"""What the memory-writer announces, as domain records; adapters map them to stream events."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from services.memory_writer.domain.model import MemoryRecord

__all__ = ["SessionCompressed", "MemoryArchived", "MemoryExpired", "DomainEvent", "MemoryConfirmed", "MemoryCorrected", "MemoryForgotten", "MemoryMerged", "MemoryQuarantined",
           "MemoryReleased", "MemoryWritten"]


@dataclass(frozen=True)
class MemoryWritten:
    record: MemoryRecord


@dataclass(frozen=True)
class MemoryCorrected:
    """`old` (the key's previous current value) was superseded by `new`."""

    old: MemoryRecord
    new: MemoryRecord


@dataclass(frozen=True)
class MemoryConfirmed:
    record: MemoryRecord  # after confirmation (L1, current)
    supersedes: str = ""
    confirmed_by: str = ""


@dataclass(frozen=True)
class MemoryQuarantined:
    record: MemoryRecord  # its reasons in quarantine_reasons; the event carries no content


@dataclass(frozen=True)
class MemoryReleased:
    record: MemoryRecord
    released_by: str = ""
    reason: str = ""


@dataclass(frozen=True)
class MemoryMerged:
    kept: MemoryRecord  # after the merge (engagement, tags, provenance updated)
    write: MemoryRecord  # the write merged into it (never stored)


@dataclass(frozen=True)
class MemoryExpired:
    tenant_id: str
    memory_ids: tuple[str, ...]
    at: datetime


@dataclass(frozen=True)
class MemoryArchived:
    tenant_id: str
    memory_ids: tuple[str, ...]
    at: datetime


@dataclass(frozen=True)
class SessionCompressed:
    summary: MemoryRecord
    covered: tuple[str, ...]
    strategy: str
    trigger: str
    tokens_before: int
    tokens_after: int


@dataclass(frozen=True)
class MemoryForgotten:
    tenant_id: str
    user_id: str
    memory_ids: tuple[str, ...]
    reason: str


DomainEvent = (MemoryWritten | MemoryCorrected | MemoryConfirmed | MemoryQuarantined | MemoryReleased
               | MemoryMerged | MemoryExpired | MemoryArchived | SessionCompressed | MemoryForgotten)

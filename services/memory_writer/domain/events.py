"""What the memory-writer announces, as domain records; adapters map them to stream events."""

from __future__ import annotations

from dataclasses import dataclass

from services.memory_writer.domain.model import MemoryRecord

__all__ = ["DomainEvent", "MemoryForgotten", "MemoryWritten"]


@dataclass(frozen=True)
class MemoryWritten:
    record: MemoryRecord


@dataclass(frozen=True)
class MemoryForgotten:
    tenant_id: str
    user_id: str
    memory_ids: tuple[str, ...]
    reason: str


DomainEvent = MemoryWritten | MemoryForgotten

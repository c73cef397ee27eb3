"""The port the handlers write through: one transaction for the row, its event and its outbox entry."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Protocol

from services.memory_writer.domain import DomainEvent, MemoryRecord

__all__ = ["UnitOfWork", "UnitOfWorkFactory"]


class UnitOfWork(Protocol):
    """Used as `async with uow:`; commits when the block ends cleanly, rolls back otherwise."""

    async def __aenter__(self) -> UnitOfWork: ...
    async def __aexit__(self, *exc: object) -> None: ...

    async def find_by_idempotency_key(self, tenant_id: str, key: str) -> MemoryRecord | None: ...
    async def get(self, tenant_id: str, memory_id: str) -> MemoryRecord | None: ...
    async def add(self, record: MemoryRecord) -> bool:
        """Store `record`; False when its idempotency key is already taken (nothing stored)."""
        ...
    async def delete(self, tenant_id: str, memory_ids: list[str]) -> list[str]:
        """Delete what exists of `memory_ids`; return the ids deleted."""
        ...
    async def ids_of_user(self, tenant_id: str, user_id: str) -> list[str]: ...
    async def record(self, stream_id: str, expected_version: int, event: DomainEvent) -> int:
        """Append `event` to the event store and the outbox in this unit's transaction; return the version."""
        ...
    def savepoint(self) -> AbstractAsyncContextManager[None]:
        """A nested transaction: what happens inside is undone alone when the block raises."""
        ...
    async def entity_schemas(self, tenant_id: str, keys: set[str]) -> dict[str, dict]:
        """The JSON Schemas the tenant registered, of those of `keys` that have one.

        Call it first in a unit: it states the unit's tenant outside any savepoint."""
        ...
    async def put_entity_schema(self, tenant_id: str, key: str, schema: dict) -> None: ...
    async def current_of(self, tenant_id: str, user_id: str, key: str) -> MemoryRecord | None:
        """The current value of an entity key; holds the key until the unit ends (no concurrent change)."""
        ...
    async def supersede(self, tenant_id: str, memory_id: str, by: str, at: datetime) -> None: ...
    async def update(self, record: MemoryRecord) -> None:
        """Store the confidence, status, expiry, change time and reason of an existing memory."""
        ...
    async def history(self, tenant_id: str, user_id: str, key: str) -> list[MemoryRecord]:
        """Every value of the key, oldest first."""
        ...


class UnitOfWorkFactory(Protocol):
    def __call__(self) -> UnitOfWork: ...

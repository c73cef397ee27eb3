"""The port the handlers write through: one transaction for the row, its event and its outbox entry."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from services.memory_writer.domain import DomainEvent, MemoryRecord

__all__ = ["Lookups", "StreamCopies", "UnitOfWork", "UnitOfWorkFactory"]


@dataclass
class Lookups:
    """What the writes of a batch will look up, so a unit can load it all at once (see UnitOfWork.prefetch)."""

    since: datetime  # the burst window's start (recent_writes)
    idempotency_keys: set[str] = field(default_factory=set)
    entity_keys: set[tuple[str, str]] = field(default_factory=set)  # (user, key): current_of
    identical: set[tuple[str, int, str]] = field(default_factory=set)  # (user, layer, digest): find_identical
    # near_candidates: LSH key (lsh_key) -> (user, layer, bucket)
    buckets: dict[int, tuple[str, int, str]] = field(default_factory=dict)
    users: set[str] = field(default_factory=set)  # recent_writes
    sealing: set[str] = field(default_factory=set)  # users whose data keys the batch seals with


class UnitOfWork(Protocol):
    """Used as `async with uow:`; commits when the block ends cleanly, rolls back otherwise."""

    async def __aenter__(self) -> UnitOfWork: ...
    async def __aexit__(self, *exc: object) -> None: ...

    async def find_by_idempotency_key(self, tenant_id: str, key: str) -> MemoryRecord | None:
        """The memory written under `key`; for a write that was merged, the memory it was merged into,
        carrying the merged write's request hash."""
        ...
    async def add_merged_key(self, tenant_id: str, idempotency_key: str, memory_id: str, request_hash: str) -> None:
        """Keep the idempotency key of a write merged into `memory_id` (its retry must not merge again)."""
        ...
    async def get(self, tenant_id: str, memory_id: str) -> MemoryRecord | None: ...
    async def add(self, record: MemoryRecord) -> bool:
        """Store `record`; False when its idempotency key is already taken (nothing stored)."""
        ...
    async def delete(self, tenant_id: str, memory_ids: list[str]) -> list[str]:
        """Delete what exists of `memory_ids`; return the ids deleted."""
        ...
    async def ids_of_user(self, tenant_id: str, user_id: str) -> list[str]: ...
    async def delete_tenant(self, tenant_id: str) -> dict[str, list[str]]:
        """Delete every memory of the tenant, its entity schemas and its write rules; return the memory ids
        deleted, by user."""
        ...
    async def record(self, stream_id: str, expected_version: int, event: DomainEvent) -> int:
        """Append `event` to the event store and the outbox in this unit's transaction; return the version."""
        ...
    async def prefetch(self, tenant_id: str, lookups: Lookups) -> None:
        """Batch mode until `flush`: load what `lookups` names in a few statements (taking the entity-key
        locks current_of takes), answer those lookups from it and the batch's own writes, and hold every
        write back. The batch may look up only what `lookups` names."""
        ...
    async def flush(self) -> None:
        """Write what batch mode held back in a constant number of statements, and leave batch mode.
        A failure here spoils the unit (roll it back)."""
        ...
    def savepoint(self) -> AbstractAsyncContextManager[None]:
        """A nested transaction: what happens inside is undone alone when the block raises."""
        ...
    async def entity_schemas(self, tenant_id: str, keys: set[str]) -> dict[str, dict]:
        """The JSON Schemas the tenant registered, of those of `keys` that have one.

        Call it first in a unit: it states the unit's tenant outside any savepoint."""
        ...
    async def put_entity_schema(self, tenant_id: str, key: str, schema: dict) -> None: ...
    async def contacts_policy(self, tenant_id: str) -> bool | None:
        """The tenant's own rule: are its phone numbers and e-mails sensitive (None: it set no rule)."""
        ...
    async def put_contacts_policy(self, tenant_id: str, sensitive: bool | None, by: str) -> None:
        """Set the tenant's own rule (None: drop it)."""
        ...
    async def current_of(self, tenant_id: str, user_id: str, key: str) -> MemoryRecord | None:
        """The current value of an entity key; holds the key until the unit ends (no concurrent change)."""
        ...
    async def supersede(self, tenant_id: str, memory_id: str, by: str, at: datetime) -> None: ...
    async def update(self, record: MemoryRecord) -> None:
        """Store the confidence, status, expiry, change time, reason and quarantine reasons of a memory."""
        ...
    async def history(self, tenant_id: str, user_id: str, key: str) -> list[MemoryRecord]:
        """Every value of the key, oldest first."""
        ...
    async def recent_writes(self, tenant_id: str, user_id: str, since: datetime) -> int:
        """How many memories the user wrote since `since` (the guard's burst signal)."""
        ...
    async def quarantined(self, tenant_id: str, user_id: str, limit: int) -> list[MemoryRecord]:
        """Quarantined memories, oldest first (of one user when `user_id`)."""
        ...
    async def find_identical(self, tenant_id: str, user_id: str, layer: int, digest: str) -> MemoryRecord | None:
        """A current memory of the user and layer with this content digest (locked until the unit ends)."""
        ...
    async def merge_into(self, kept: MemoryRecord) -> None:
        """Store a merged memory's engagement, merge count, tags and provenance."""
        ...
    async def near_candidates(self, tenant_id: str, user_id: str, layer: int,
                              buckets: list[str]) -> list[tuple[str, list[int]]]:
        """(memory id, MinHash) of current memories of the user and layer sharing an LSH bucket."""
        ...
    async def take_expired(self, tenant_id: str, now: datetime, limit: int) -> list[str]:
        """Delete up to `limit` memories whose expires_at has passed; return their ids (each row once, even
        under concurrent sweepers)."""
        ...
    async def archive_idle(self, tenant_id: str, idle_since: datetime, limit: int) -> list[str]:
        """Archive up to `limit` current memories not accessed (nor written) since `idle_since`."""
        ...
    async def touch(self, tenant_id: str, memory_ids: list[str], at: datetime, half_life: timedelta) -> int:
        """Record an access: engagement decayed to `at`, plus one; archived memories become current."""
        ...
    async def uncovered_turns(self, tenant_id: str, user_id: str, session_id: str) -> list[MemoryRecord]:
        """The session layer's current memories of a session that no summary covers yet, oldest first."""
        ...
    async def keyed_hash(self, tenant_id: str, value: str) -> str:
        """HMAC of `value` under the tenant's search key (exact matches without the plaintext)."""
        ...
    async def reveal(self, record: MemoryRecord) -> str:
        """The plaintext of a sensitive record (KeyShredded once its user was forgotten)."""
        ...
    async def purge_outbox(self, tenant_id: str, user_id: str, memory_ids: list[str], *,
                           whole_tenant: bool = False) -> int:
        """Delete the outbox copies (published or not) of the memories of `user_id` (if given) or `memory_ids`,
        or (`whole_tenant`) of every memory of the tenant."""
        ...
    async def hold_keys(self, tenant_id: str, user_ids: list[str]) -> None:
        """Hold the tenant's keys, and these users', for the rest of the unit (the first thing a unit that will
        seal does): a forget destroying them waits for the unit. While a forget holds them, tried for a few
        seconds, then Busy (retryable)."""
        ...
    async def withhold_publication(self, tenant_id: str) -> None:
        """Last in a unit that purged the outbox: wait until no relay is publishing rows it read before, and
        keep relays from reading until the unit ends, so every published copy of a purged row is on the stream
        by the commit (where StreamCopies.purge finds it) and none is published after."""
        ...
    async def erase_sealed(self, tenant_id: str, memory_ids: list[str] | None) -> int:
        """Erase from the event store what these memories' events (None: all the tenant's) hold sealed
        (content, keyed hashes, personal fields); the events stay, with their ids, types and times. Answers
        the events changed."""
        ...
    async def shred_user_key(self, tenant_id: str, user_id: str) -> bool:
        """Destroy the user's data key (crypto-shredding); False when there was none."""
        ...
    async def shred_tenant_keys(self, tenant_id: str) -> int:
        """Destroy every key of the tenant (its users' data keys, its tenant and search keys); a later write
        for the tenant starts new ones. Returns the user keys destroyed."""
        ...
    async def rotate_tenant_key(self, tenant_id: str) -> tuple[int, int]:
        """A new tenant key version, user keys re-wrapped; returns (version, keys re-wrapped)."""
        ...


class UnitOfWorkFactory(Protocol):
    def __call__(self) -> UnitOfWork: ...


class StreamCopies(Protocol):
    """The published copies of memory events (a Redis stream), outside any transaction."""

    async def mark(self) -> dict[str, str]:
        """Where the events and commands streams end now (their last entries): taken inside the forget's
        transaction, once publication is withheld, so every copy of what it deletes is before it (a dead letter
        by the entry it copies) and a new start after."""
        ...
    async def purge(self, tenant_id: str, user_id: str, memory_ids: list[str], *, whole_tenant: bool = False,
                    until: dict[str, str] | None = None) -> int:
        """Remove the personal copies (memory events and their dead letters, write commands waiting or
        dead-lettered) of `user_id` (if given) or `memory_ids`, or (`whole_tenant`) of every user of the
        tenant; up to `until` (a `mark`), or everything."""
        ...

"""Entity keys beyond plain writes: corrections, confirmations, a key's history, tenant schemas and rules."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from libs.errors import NotFound, ValidationFailed
from libs.eventstore import ANY_VERSION
from libs.validation import check_uuid, shows_something
from services.memory_writer.domain import (
    Confidence,
    Layer,
    MemoryConfirmed,
    MemoryRecord,
    Source,
    Status,
    WriteMemory,
    WriteResult,
    confirmed,
)
from services.memory_writer.domain.entities import check_schema
from services.memory_writer.domain.policy import DEFAULT_POLICY, WritePolicy
from services.memory_writer.service_layer.unit_of_work import UnitOfWork
from services.memory_writer.service_layer.writes import write_memory

__all__ = ["ConfirmMemory", "CorrectEntity", "KeyHistory", "RegisterEntitySchema", "SetTenantPolicy", "confirm",
           "correct", "history", "register_entity_schema", "set_tenant_policy", "tenant_contacts_policy"]


@dataclass(frozen=True)
class CorrectEntity:
    tenant_id: str
    user_id: str
    key: str
    content: str
    reason: str = ""
    source: int = Source.USER_STATEMENT
    layer: int = Layer.ENTITY
    session_id: str = ""
    idempotency_key: str = ""
    requested_by: str = ""


async def correct(cmd: CorrectEntity, uow: UnitOfWork, now: datetime | None = None,
                  policy: WritePolicy = DEFAULT_POLICY) -> WriteResult:
    """A new L1 value for `key`: it supersedes the current value (whatever its level); the chain is kept."""
    if not cmd.key:
        raise ValidationFailed("is required", field="key", hint="name the entity key to correct, e.g. user.name")
    if not shows_something(cmd.user_id):  # as Write: a correction names whose value it corrects
        raise ValidationFailed("is required", field="tenant.user_id",
                               hint="say whose value it corrects, as a Write says whose memory it is")
    if cmd.source not in (Source.USER_STATEMENT, Source.AUTHORITATIVE_API):
        raise ValidationFailed("a correction comes from the user or an authoritative API", field="source",
                               hint="leave source empty (user statement) or use SOURCE_KIND_AUTHORITATIVE_API")
    write = WriteMemory(tenant_id=cmd.tenant_id, user_id=cmd.user_id, session_id=cmd.session_id,
                        layer=cmd.layer or Layer.ENTITY, source=cmd.source, content=cmd.content, key=cmd.key,
                        confidence=Confidence.L1_STRONG, idempotency_key=cmd.idempotency_key,
                        reason=cmd.reason or "corrected", written_by=cmd.requested_by)
    return await write_memory(write, uow, now=now, policy=policy)


@dataclass(frozen=True)
class ConfirmMemory:
    tenant_id: str
    memory_id: str
    reason: str = ""
    requested_by: str = ""


async def confirm(cmd: ConfirmMemory, uow: UnitOfWork, now: datetime | None = None) -> tuple[MemoryRecord, str]:
    """Raise an L2/L3 memory (or a candidate) to L1; it becomes its key's current value."""
    now = now or datetime.now(UTC)
    memory_id = check_uuid(cmd.memory_id, "memory_id")
    async with uow:
        record = await uow.get(cmd.tenant_id, memory_id)
        if record is not None:  # its user's keys first (a forget waits for this unit), then the memory again
            await uow.hold_keys(cmd.tenant_id, [record.user_id])
            record = await uow.get(cmd.tenant_id, memory_id)
        if record is None:
            raise NotFound(f"no memory {memory_id} for this tenant", field="memory_id",
                           hint="check the id; forgotten and expired memories are gone")
        if record.status is Status.SUPERSEDED:
            raise ValidationFailed("was superseded by a later value", field="memory_id",
                                   hint="Correct the key with this value instead, if the user says it is right")
        current = await uow.current_of(record.tenant_id, record.user_id, record.key) if record.key else None
        if record.confidence is Confidence.L1_STRONG and record.status is Status.CURRENT:
            return record, ""  # nothing to confirm: a second Confirm is a no-op
        raised, old = confirmed(record, current, now, cmd.requested_by, cmd.reason)
        if old is not None:
            await uow.supersede(record.tenant_id, old.memory_id, record.memory_id, now)
        await uow.update(raised)
        supersedes = old.memory_id if old else ""
        await uow.record(f"memory-{record.memory_id}", ANY_VERSION, MemoryConfirmed(raised, supersedes, cmd.requested_by))
    return raised, supersedes


@dataclass(frozen=True)
class KeyHistory:
    tenant_id: str
    user_id: str
    key: str


async def history(cmd: KeyHistory, uow: UnitOfWork) -> list[MemoryRecord]:
    if not cmd.key:
        raise ValidationFailed("is required", field="key", hint="name the entity key, e.g. user.name")
    if not cmd.user_id:
        raise ValidationFailed("is required", field="tenant.user_id", hint="say whose key it is")
    async with uow:
        return await uow.history(cmd.tenant_id, cmd.user_id, cmd.key)



@dataclass(frozen=True)
class RegisterEntitySchema:
    tenant_id: str
    key: str
    schema: dict


def _tenant_named(tenant_id: str) -> None:
    if not tenant_id:
        raise ValidationFailed("is required", field="tenant.tenant_id",
                               hint="name the tenant, or call with a token issued for it")


@dataclass(frozen=True)
class SetTenantPolicy:
    tenant_id: str
    contacts_sensitive: bool | None  # None: drop the tenant's own rule (the deployment's applies)
    requested_by: str = ""


async def set_tenant_policy(cmd: SetTenantPolicy, uow: UnitOfWork) -> None:
    """The tenant's own rules for writes from now on (stored values are not re-sealed nor unsealed)."""
    _tenant_named(cmd.tenant_id)
    async with uow:
        await uow.put_contacts_policy(cmd.tenant_id, cmd.contacts_sensitive, cmd.requested_by)


async def tenant_contacts_policy(tenant_id: str, uow: UnitOfWork) -> bool | None:
    """The tenant's own contacts rule (None: it set none)."""
    _tenant_named(tenant_id)
    async with uow:
        return await uow.contacts_policy(tenant_id)


async def register_entity_schema(cmd: RegisterEntitySchema, uow: UnitOfWork) -> None:
    """Values of `key` must match `schema` from now on (already stored values are not re-checked)."""
    if not cmd.key:
        raise ValidationFailed("is required", field="key", hint="name the entity key, e.g. user.plan")
    check_schema(cmd.schema)
    async with uow:
        await uow.put_entity_schema(cmd.tenant_id, cmd.key, cmd.schema)

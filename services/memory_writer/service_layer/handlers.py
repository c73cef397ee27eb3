"""Memory-writer handlers: plain functions, one command in, one unit of work, a result out."""

from __future__ import annotations

from dataclasses import dataclass, replace

from libs.crypto import CryptoError
from libs.errors import NotFound, PermissionDenied, ValidationFailed
from libs.eventstore import ANY_VERSION
from libs.validation import check_uuid
from services.memory_writer.domain import MemoryForgotten, MemoryRecord
from services.memory_writer.service_layer.quarantine import (
    DropQuarantined,
    ListQuarantine,
    ReleaseQuarantined,
    drop,
    list_quarantine,
    release,
)
from services.memory_writer.service_layer.unit_of_work import StreamCopies, UnitOfWork
from services.memory_writer.service_layer.corrections import (
    ConfirmMemory,
    CorrectEntity,
    KeyHistory,
    RegisterEntitySchema,
    SetTenantPolicy,
    confirm,
    correct,
    history,
    register_entity_schema,
    set_tenant_policy,
    tenant_contacts_policy,
)
from services.memory_writer.service_layer.writes import write_batch, write_memory

__all__ = ["DropQuarantined", "ListQuarantine", "ReleaseQuarantined", "drop", "list_quarantine", "release",
           "ADMIN_SCOPE", "SENSITIVE_SCOPE", "RotateTenantKey", "revealed", "rotate_tenant_key", "ConfirmMemory", "CorrectEntity", "ForgetMemory", "ForgetTenant", "GetMemory", "KeyHistory",
           "RegisterEntitySchema", "SetTenantPolicy", "confirm", "correct", "forget", "forget_tenant", "get_memory", "history",
           "register_entity_schema", "set_tenant_policy", "tenant_contacts_policy", "TenantForgotten", "write_batch", "write_memory"]


SENSITIVE_SCOPE = "memory:sensitive"


@dataclass(frozen=True)
class GetMemory:
    tenant_id: str
    memory_id: str
    reveal: bool = False  # the caller holds memory:sensitive: sensitive content is decrypted for it


async def revealed(records: list[MemoryRecord], uow: UnitOfWork) -> list[tuple[MemoryRecord, bool]]:
    """Each record with its sensitive content opened, and whether it was (not when its key is gone)."""
    out = []
    for record in records:
        if not record.sensitive_kind:
            out.append((record, False))
            continue
        try:
            out.append((replace(record, content=await uow.reveal(record)), True))
        except CryptoError:
            out.append((record, False))  # crypto-shredded: only the redacted text is left
    return out


async def get_memory(cmd: GetMemory, uow: UnitOfWork) -> tuple[MemoryRecord, bool]:
    """The memory, and whether its sensitive content was revealed (else the redacted text is shown)."""
    memory_id = check_uuid(cmd.memory_id, "memory_id")
    async with uow:
        record = await uow.get(cmd.tenant_id, memory_id)
        if record is None:
            raise NotFound(f"no memory {memory_id} for this tenant", field="memory_id",
                           hint="check the id; forgotten and expired memories are gone")
        if cmd.reveal:
            return (await revealed([record], uow))[0]
    return record, False


@dataclass(frozen=True)
class RotateTenantKey:
    tenant_id: str


async def rotate_tenant_key(cmd: RotateTenantKey, uow: UnitOfWork) -> tuple[int, int]:
    """Re-wrap every user data key of the tenant under a new tenant key; content stays as it is. Returns the
    new version and how many user keys were re-wrapped."""
    if not cmd.tenant_id:
        raise ValidationFailed("is required", field="tenant.tenant_id", hint="call with a token issued for the tenant")
    async with uow:
        return await uow.rotate_tenant_key(cmd.tenant_id)


ADMIN_SCOPE = "memory:admin"


@dataclass(frozen=True)
class ForgetMemory:
    tenant_id: str
    user_id: str
    memory_id: str = ""
    requested_by: str = ""  # the caller; whose memories go when neither id nor user is named
    admin: bool = False  # the caller holds memory:admin, so may forget other users' memories


def _may_forget(cmd: ForgetMemory, owner: str) -> None:
    if owner != cmd.requested_by and not cmd.admin:
        raise PermissionDenied("forgetting another user's memories needs the scope 'memory:admin'",
                               field="memory_id" if cmd.memory_id else "tenant.user_id",
                               hint="forget your own memories, or ask for a token with scope memory:admin")


async def forget(cmd: ForgetMemory, uow: UnitOfWork, copies: StreamCopies | None = None) -> int:
    """Forget one memory, or every memory of a user (the caller's, when no user is named).

    Callers forget their own memories; other users' need the admin scope (the right to be forgotten
    is exercised by the user, or by an operator on their behalf).
    """
    user_id = cmd.user_id or cmd.requested_by
    if not cmd.memory_id and not user_id:
        raise ValidationFailed("is required when memory_id is empty", field="tenant.user_id",
                               hint="name the memory, or the user whose memories to forget")
    memory_id = check_uuid(cmd.memory_id, "memory_id") if cmd.memory_id else ""  # canonical: the store's form
    cmd = replace(cmd, user_id=user_id, memory_id=memory_id)
    if not cmd.memory_id:
        _may_forget(cmd, cmd.user_id)
    async with uow:
        if cmd.memory_id:
            record = await uow.get(cmd.tenant_id, cmd.memory_id)
            if record is not None:
                _may_forget(cmd, record.user_id)
        if not cmd.memory_id:
            # Crypto-shredding: whatever copies of the user's sealed content remain (event store, outbox
            # history, stream entries, backups) can never be opened again. First: it waits for the user's
            # writes in flight that hold the key (adapters/keys.py), so the deletion below sees what they wrote.
            await uow.shred_user_key(cmd.tenant_id, cmd.user_id)
        ids = [cmd.memory_id] if cmd.memory_id else await uow.ids_of_user(cmd.tenant_id, cmd.user_id)
        removed = await uow.delete(cmd.tenant_id, ids)
        if cmd.memory_id:  # the user's key lives on: what the event store holds sealed of this memory goes
            await uow.erase_sealed(cmd.tenant_id, ids)
        # The outbox keeps published rows (with the content the read side indexes) for a while: not theirs.
        await uow.purge_outbox(cmd.tenant_id, "" if cmd.memory_id else cmd.user_id, ids)
        if removed:
            ids = removed
            stream = f"memory-{cmd.memory_id}" if cmd.memory_id else f"memory-user-{cmd.tenant_id}-{cmd.user_id}"
            await uow.record(stream, ANY_VERSION,
                             MemoryForgotten(cmd.tenant_id, cmd.user_id, tuple(ids), "forget requested"))
        await uow.withhold_publication(cmd.tenant_id)  # no copy reaches the stream after the purge below
        marks = await copies.mark() if copies is not None else None
    if copies is not None:  # after the commit: no row left to publish them again
        await copies.purge(cmd.tenant_id, "" if cmd.memory_id else cmd.user_id, ids, until=marks)
    return len(removed)


FORGOTTEN_IDS_PER_EVENT = 1_000  # a memory.forgotten names at most this many memories


@dataclass(frozen=True)
class ForgetTenant:
    tenant_id: str
    confirm_tenant_id: str  # must repeat tenant_id: forgetting a tenant cannot be undone


@dataclass(frozen=True)
class TenantForgotten:
    memories: int  # deleted
    users: int  # data keys destroyed


async def forget_tenant(cmd: ForgetTenant, uow: UnitOfWork, copies: StreamCopies | None = None) -> TenantForgotten:
    """Forget a whole tenant (the caller's; its admin scope is checked at the edge): every memory of every
    user, its entity schemas and write rules, and every key it has (crypto-shredding: what the event store,
    the outbox history, the streams or a backup keep sealed can never be opened, nor a keyed hash matched).
    The read side purges its indexes on the memory.forgotten events (one per user, at most
    FORGOTTEN_IDS_PER_EVENT ids each). Writes for the tenant that commit after it start afresh, under new keys.
    """
    if not cmd.tenant_id:
        raise ValidationFailed("is required", field="tenant.tenant_id", hint="call with a token issued for the tenant")
    if cmd.confirm_tenant_id != cmd.tenant_id:
        raise ValidationFailed(f"must repeat the tenant being forgotten ({cmd.tenant_id!r}), not "
                               f"{cmd.confirm_tenant_id!r}", field="confirm_tenant_id",
                               hint="set it to your token's tenant id; forgetting a tenant cannot be undone")
    async with uow:
        users = await uow.shred_tenant_keys(cmd.tenant_id)  # first: waits for the writes in flight (see forget)
        removed = await uow.delete_tenant(cmd.tenant_id)
        await uow.erase_sealed(cmd.tenant_id, None)
        await uow.purge_outbox(cmd.tenant_id, "", [], whole_tenant=True)
        for user_id, ids in sorted(removed.items()):
            for start in range(0, len(ids), FORGOTTEN_IDS_PER_EVENT):
                await uow.record(f"memory-user-{cmd.tenant_id}-{user_id}", ANY_VERSION, MemoryForgotten(
                    cmd.tenant_id, user_id, tuple(ids[start:start + FORGOTTEN_IDS_PER_EVENT]), "tenant forgotten"))
        await uow.withhold_publication(cmd.tenant_id)  # no copy reaches the stream after the purge below
        marks = await copies.mark() if copies is not None else None
    if copies is not None:  # after the commit: no row left to publish them again
        await copies.purge(cmd.tenant_id, "", [], whole_tenant=True, until=marks)
    return TenantForgotten(sum(map(len, removed.values())), users)

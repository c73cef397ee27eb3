"""The memory commands stream, in batches: each entry becomes a WriteMemory command, like a gRPC Write.

The BatchConsumer (libs/events/batches.py) reads, admits and groups the entries by tenant and
opens the transaction; this handler turns one tenant's envelopes into commands, writes them
through the batch pipeline in that transaction, and answers one outcome per envelope.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC

import asyncpg

from libs.errors import DomainError
from libs.events import Envelope
from services.memory_writer.adapters.mapping import command_from_proto
from services.memory_writer.domain import WriteMemory
from services.memory_writer.domain.policy import DEFAULT_POLICY, WritePolicy
from services.memory_writer.domain.sensitive import find_sensitive
from services.memory_writer.service_layer import handlers, upkeep
from services.memory_writer.service_layer.unit_of_work import UnitOfWork

__all__ = ["command_user", "on_access", "on_write_batch", "scrub_command"]

PRODUCER = "producer"  # `written_by` of stream writes: the producer's token was verified at admission


def on_write_batch(uow_for: Callable[[asyncpg.Connection], UnitOfWork], policy: WritePolicy = DEFAULT_POLICY):
    async def handle(tenant_id: str, envelopes: list[Envelope],
                     conn: asyncpg.Connection) -> Sequence[BaseException | None]:
        outcomes: list[BaseException | None] = [None] * len(envelopes)
        cmds: list[WriteMemory] = []
        index: list[int] = []
        for i, envelope in enumerate(envelopes):
            try:
                cmds.append(command_from_proto(envelope.peek(), written_by=PRODUCER))
                index.append(i)
            except DomainError as exc:
                outcomes[i] = exc
        uow = uow_for(conn)

        def caused_by(i: int) -> None:
            uow.causation = envelopes[index[i]]

        results = await handlers.write_batch(cmds, lambda: uow, tenant_id=tenant_id, before_each=caused_by,
                                             policy=policy)
        for i, result in zip(index, results, strict=True):
            outcomes[i] = result if isinstance(result, BaseException) else None
        return outcomes

    return handle


def command_user(envelope: Envelope) -> str:
    """The user a command writes for: one user's commands keep their stream order across batches in flight."""
    return envelope.peek().tenant.user_id


def on_access(uow_for: Callable[[asyncpg.Connection], UnitOfWork], policy: upkeep.SweepPolicy):
    """MemoryAccessed from the retriever: the memories' engagement rises (after decaying to the access time)."""

    async def handle(envelope: Envelope, conn: asyncpg.Connection) -> None:
        message = envelope.message()
        at = message.accessed_at.ToDatetime(tzinfo=UTC) if message.HasField("accessed_at") else envelope.occurred_at
        await upkeep.record_access(envelope.tenant_id, list(message.memory_ids), at, uow_for(conn), policy)

    return handle


def scrub_command(fields: dict[str, str]) -> dict[str, str]:
    """A command's fields as a dead letter may keep them: sensitive values in its content redacted, phone
    numbers and e-mail addresses always (whatever the tenant's rule: it is stored, may change, and a
    dead letter is written where it is not at hand).

    (Such a dead letter cannot be replayed as it was; the producer must send the command again.)
    """
    try:
        payload = json.loads(fields.get("payload", ""))
    except ValueError:
        return fields
    if not isinstance(payload, dict) or not isinstance(payload.get("content"), str):
        return fields
    finding = find_sensitive(str(payload.get("key", "")), payload["content"], contacts=True)
    if finding is None:
        return fields
    payload["content"] = finding.redacted
    return {**fields, "payload": json.dumps(payload, ensure_ascii=False)}



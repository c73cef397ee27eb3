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
from libs.events.envelope import ENVELOPE_FIELDS
from services.memory_writer.adapters.mapping import command_from_proto
from services.memory_writer.domain import WriteMemory
from services.memory_writer.domain.policy import DEFAULT_POLICY, WritePolicy
from services.memory_writer.domain.sensitive import redact, redacted_tree
from services.memory_writer.service_layer import handlers, upkeep
from services.memory_writer.service_layer.unit_of_work import UnitOfWork

__all__ = ["command_user", "on_access", "on_write_batch", "scrub_command", "scrub_reason"]

PRODUCER = "producer"  # `written_by` of stream writes: the producer's token was verified at admission
MAX_KEPT_PAYLOAD = 64 * 1024  # characters of a dead-lettered payload checked for sensitive values, at most
NOT_KEPT = "[not kept]"


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
    """A command's fields as a dead letter may keep them: the envelope's fields, with sensitive values redacted
    wherever they are in the payload (its content, under the memory's key, and every other text: an attribute
    under a key such as `password` whole, and all below it), phone numbers and e-mail addresses always
    (whatever the tenant's rule: it is stored, may change, and a dead letter is written where it is not at
    hand); of the tenant context only its ids, so that Forget finds the letter. Not kept: fields that are not
    the envelope's, and a payload this cannot read as the writer would (not JSON, a repeated key, nested too
    deep) or over MAX_KEPT_PAYLOAD characters: what is in them is not checked.

    (Such a dead letter cannot be replayed as it was; the producer must send the command again.)
    """
    kept = {name: value if name in ENVELOPE_FIELDS else NOT_KEPT for name, value in fields.items()}
    if "payload" not in fields:
        return kept
    try:
        if len(fields["payload"]) > MAX_KEPT_PAYLOAD:
            raise ValueError("too large to check")
        payload = json.loads(fields["payload"], object_pairs_hook=_unique_keys)
        if not isinstance(payload, dict):
            raise ValueError("not an object")
        scrubbed = {name: _tenant_ids(value) if name == "tenant" else
                    redacted_tree(value, str(payload.get("key", "")) if name == "content" else name, contacts=True)
                    for name, value in payload.items()}
        text = json.dumps(scrubbed, ensure_ascii=False)
    except (ValueError, RecursionError) as exc:
        return {**kept, "payload": f"[not kept: the payload could not be checked for sensitive values ({exc})]"}
    return {**kept, "payload": text}


def scrub_reason(text: str) -> str:
    """A dead letter's reason (and the log line of it) with sensitive values redacted: a parser's message may
    quote what was sent."""
    return redact(text, contacts=True)


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object whose keys are unique (the writer's parser refuses a repeated one, json.loads keeps the last)."""
    found = dict(pairs)
    if len(found) != len(pairs):
        raise ValueError("a key is repeated")
    return found


def _tenant_ids(tenant: object) -> object:
    """The tenant context's ids as sent, when they are text; nothing else of it."""
    if not isinstance(tenant, dict):
        return NOT_KEPT
    return {name: tenant[name] for name in ("tenantId", "userId", "sessionId") if isinstance(tenant.get(name), str)}

"""Memory events -> the retriever's projection (PostgreSQL documents now, vectors by the projector).

`on_memory_batch` is what the service runs: the BatchConsumer (libs/events/batches.py) hands it many
entries of one tenant in one transaction; consecutive memory.written are recorded together (one round
for all), every other event is applied alone, in stream order. `on_memory_event` applies one event."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC

import asyncpg

from libs.events import Envelope
from libs.protogen.mnemesh.v1 import common_pb2
from libs.transient import is_transient
from services.retriever.adapters.mapping import document_from_proto
from services.retriever.service_layer import handlers
from services.retriever.service_layer.ports import DocumentStore

__all__ = ["on_memory_batch", "on_memory_event"]


def on_memory_event(store_in: Callable[[asyncpg.Connection], DocumentStore], retrieval: handlers.Retrieval):
    async def handle(envelope: Envelope, conn: asyncpg.Connection) -> None:
        message, kind = envelope.message(), envelope.event_type
        if kind == "memory.written":  # a new memory, a correction's new value, a released memory
            if message.memory.status == common_pb2.MEMORY_STATUS_QUARANTINED:  # never served
                await handlers.forget_documents(message.memory.tenant.tenant_id, [message.memory.memory_id],
                                                store_in(conn), retrieval.index, tombstone=False)
            else:
                await handlers.record_document(document_from_proto(message.memory), store_in(conn), retrieval,
                                               version=message.version)
        elif kind in ("memory.forgotten", "memory.expired"):  # final: out of every store, tombstoned
            await handlers.forget_documents(message.tenant.tenant_id, list(message.memory_ids), store_in(conn),
                                            retrieval.index)
        elif kind == "memory.quarantined":  # out of every store, but no tombstone: a release writes it again
            await handlers.forget_documents(message.tenant.tenant_id, [message.memory_id], store_in(conn),
                                            retrieval.index, tombstone=False)
        elif kind == "memory.archived":
            await handlers.archive_documents(message.tenant.tenant_id, list(message.memory_ids), store_in(conn),
                                             retrieval.index)
        elif kind == "memory.corrected":  # the new value came with its memory.written; the old one is History
            await handlers.archive_documents(message.tenant.tenant_id, [message.old_memory_id], store_in(conn),
                                             retrieval.index)
        elif kind == "memory.confirmed":
            await handlers.confirm_document(
                message.tenant.tenant_id, message.memory_id, message.confidence,
                message.expires_at.ToDatetime(tzinfo=UTC) if message.HasField("expires_at") else None,
                store_in(conn), supersedes=message.supersedes, index=retrieval.index)
        elif kind == "memory.merged":
            await handlers.merge_into_document(message.tenant.tenant_id, message.memory_id, message.engagement,
                                               list(message.tags), list(message.derived_from), store_in(conn),
                                               retrieval.index)
        # memory.released: its memory.written follows and indexes it. memory.session_compressed: the summary
        # came with its own memory.written and the covered turns stay searchable as they are.
        if retrieval.observe is not None:
            retrieval.observe.lag(envelope.occurred_at)

    return handle


def _recordable(envelope: Envelope):
    """(document, version) when the event is a memory.written to record, else None."""
    if envelope.event_type != "memory.written":
        return None
    message = envelope.message()
    if message.memory.status == common_pb2.MEMORY_STATUS_QUARANTINED:
        return None
    return document_from_proto(message.memory), message.version


def on_memory_batch(store_in: Callable[[asyncpg.Connection], DocumentStore], retrieval: handlers.Retrieval):
    apply_one = on_memory_event(store_in, retrieval)

    async def handle(tenant_id: str, envelopes: list[Envelope], conn: asyncpg.Connection) -> list:
        outcomes: list[BaseException | None] = [None] * len(envelopes)
        run: list[tuple[int, tuple]] = []  # consecutive memory.written: (position, (document, version))

        async def alone(i: int, work) -> None:
            try:
                async with conn.transaction():  # a savepoint: one bad event never undoes its neighbours
                    await work()
            except Exception as exc:  # noqa: BLE001 - an outage fails the batch (retried); else this event's
                if is_transient(exc):
                    raise
                outcomes[i] = exc

        async def flush() -> None:
            if not run:
                return
            items = [item for _, item in run]
            try:
                async with conn.transaction():
                    await handlers.record_documents(items, store_in(conn))
            except Exception as exc:  # noqa: BLE001 - one by one, to find the event at fault
                if is_transient(exc):
                    raise
                for i, (document, version) in run:
                    await alone(i, lambda d=document, v=version: handlers.record_document(
                        d, store_in(conn), retrieval, version=v))
            if retrieval.observe is not None:
                for i, _ in run:
                    retrieval.observe.lag(envelopes[i].occurred_at)
            run.clear()

        for i, envelope in enumerate(envelopes):
            try:
                item = _recordable(envelope)
            except Exception as exc:  # noqa: BLE001 - an undecodable payload: this event's failure
                outcomes[i] = exc
                continue
            if item is not None:
                run.append((i, item))
                continue
            await flush()
            await alone(i, lambda e=envelope: apply_one(e, conn))
        await flush()
        return outcomes

    return handle

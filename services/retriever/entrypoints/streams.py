"""Memory events -> the retriever's projection (PostgreSQL documents now, vectors by the projector)."""

from __future__ import annotations

from collections.abc import Callable

import asyncpg

from libs.events import Envelope
from services.retriever.adapters.mapping import document_from_proto
from services.retriever.service_layer import handlers
from services.retriever.service_layer.ports import DocumentStore

__all__ = ["on_memory_event"]


def on_memory_event(store_in: Callable[[asyncpg.Connection], DocumentStore], retrieval: handlers.Retrieval):
    async def handle(envelope: Envelope, conn: asyncpg.Connection) -> None:
        message = envelope.message()
        if envelope.event_type == "memory.written":  # a new memory, a correction or a confirmation
            await handlers.record_document(document_from_proto(message.memory), store_in(conn), retrieval,
                                           version=message.version)
        elif envelope.event_type == "memory.forgotten":  # forgotten, expired, quarantined: out of every store
            await handlers.forget_documents(message.tenant.tenant_id, list(message.memory_ids), store_in(conn),
                                            retrieval.index)
        if retrieval.observe is not None:
            retrieval.observe.lag(envelope.occurred_at)

    return handle

"""Sessions in the event store; each append is mirrored to the session events stream via the outbox."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from libs.db import Database
from libs.events import Envelope
from libs.eventstore import EventStore, StoredEvent
from libs.outbox import Outbox
from libs.protogen.mnemesh.v1 import common_pb2, events_pb2
from services.orchestrator.domain import MessageAppended, SessionEvent, State, StateChanged, Versioned

__all__ = ["EventSourcedSessions", "stream_id"]


def stream_id(tenant_id: str, session_id: str) -> str:
    # Neither id may contain "/" (tenant ids by the token rules, session ids by the handlers'),
    # so no two (tenant, session) pairs share a stream.
    return f"session/{tenant_id}/{session_id}"


def _envelope(tenant_id: str, session_id: str, event: SessionEvent) -> Envelope:
    tenant = common_pb2.TenantContext(tenant_id=tenant_id, session_id=session_id)
    if isinstance(event, MessageAppended):
        tenant.user_id = event.user_id
        message = events_pb2.SessionMessageAppended(tenant=tenant, device_id=event.device_id, role=event.role,
                                                    text=event.text)
        envelope = Envelope.wrap(message, event_type="session.message_appended", tenant_id=tenant_id,
                                 correlation_id=session_id)
    else:
        message = events_pb2.SessionStateChanged(tenant=tenant, from_state=event.from_state,
                                                 to_state=event.to_state, reason=event.reason)
        envelope = Envelope.wrap(message, event_type="session.state_changed", tenant_id=tenant_id,
                                 correlation_id=session_id)
    if event.event_id:
        envelope = replace(envelope, event_id=event.event_id)
    return envelope


def _versioned(stored: StoredEvent) -> Versioned:
    message = stored.envelope.message()
    if stored.envelope.event_type == "session.message_appended":
        event: SessionEvent = MessageAppended(user_id=message.tenant.user_id, device_id=message.device_id,
                                              role=message.role, text=message.text,
                                              event_id=stored.envelope.event_id)
    else:
        event = StateChanged(State(message.from_state), State(message.to_state), message.reason,
                             event_id=stored.envelope.event_id)
    return Versioned(stored.version, event, stored.envelope.occurred_at)


class EventSourcedSessions:
    def __init__(self, db: Database, store: EventStore, outbox: Outbox) -> None:
        self.db, self.store, self.outbox = db, store, outbox

    async def history(self, tenant_id: str, session_id: str) -> list[Versioned]:
        stream, after, items = stream_id(tenant_id, session_id), 0, []
        while batch := await self.store.read_stream(stream, after, tenant_id=tenant_id):
            items += [_versioned(e) for e in batch]
            after = batch[-1].version
        return items

    async def update(self, tenant_id: str, session_id: str,
                     decide: Callable[[list[Versioned]], list[SessionEvent]]) -> list[Versioned]:
        stream = stream_id(tenant_id, session_id)
        async with self.db.transaction(tenant_id) as conn:
            await self.store.lock_stream(conn, stream)
            history = [_versioned(e) for e in await self.store.read_stream_in(conn, stream)]
            events = decide(history)
            if not events:
                return history
            envelopes = [_envelope(tenant_id, session_id, e) for e in events]
            version = await self.store.append(conn, stream, len(history), envelopes)
            for envelope in envelopes:
                await self.outbox.add(conn, envelope)
        first = version - len(events) + 1
        return history + [Versioned(first + i, e) for i, e in enumerate(events)]

    async def follow(self, tenant_id: str, session_id: str, after_version: int) -> AsyncIterator[Versioned]:
        async for stored in self.store.subscribe_stream(stream_id(tenant_id, session_id), after_version,
                                                        tenant_id=tenant_id):
            yield _versioned(stored)

"""Sessions in the event store; each append is mirrored to the session events stream via the outbox.

Long sessions are loaded from their snapshot plus the events after it (libs/snapshots.py); a
snapshot is taken in the appending transaction every `snapshots.every` events.

A process keeps the state of the sessions it touched last (`cache_size`), as of a committed
version: loading one reads only the events after that version, so an append costs the same at
version 10 and at version 10,000. The cache is never the truth: every load still reads the
stream's tail from the store (under the append lock when writing), so appends by other
replicas are always seen.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import fields, replace

import asyncpg

from libs.db import Database
from libs.events import Envelope
from libs.eventstore import EventStore, StoredEvent
from libs.outbox import Outbox
from libs.protogen.mnemesh.v1 import common_pb2, events_pb2
from libs.snapshots import SnapshotStore
from services.orchestrator.adapters.feeds import StreamFeeds
from services.orchestrator.domain import (
    SNAPSHOT_SCHEMA,
    ActionFinished,
    ActionStarted,
    CompensationFinished,
    DecisionMade,
    DelegationAnswered,
    DelegationChecked,
    DelegationStarted,
    MessageAppended,
    Session,
    SessionEvent,
    SlotDeclined,
    SlotFilled,
    SlotOffered,
    State,
    StateChanged,
    TaskEnded,
    TaskStarted,
    TurnRecovered,
    Versioned,
)

__all__ = ["EVENT_MESSAGES", "EventSourcedSessions", "from_message", "stream_id", "to_message"]

# domain event -> (event type, payload message, field of mnemesh.v1.SessionEvent)
EVENT_MESSAGES = {
    MessageAppended: ("session.message_appended", events_pb2.SessionMessageAppended, "message_appended"),
    StateChanged: ("session.state_changed", events_pb2.SessionStateChanged, "state_changed"),
    TaskStarted: ("session.task_started", events_pb2.SessionTaskStarted, "task_started"),
    TaskEnded: ("session.task_ended", events_pb2.SessionTaskEnded, "task_ended"),
    SlotFilled: ("session.slot_filled", events_pb2.SessionSlotFilled, "slot_filled"),
    SlotOffered: ("session.slot_offered", events_pb2.SessionSlotOffered, "slot_offered"),
    SlotDeclined: ("session.slot_declined", events_pb2.SessionSlotDeclined, "slot_declined"),
    DecisionMade: ("session.decision_made", events_pb2.SessionDecisionMade, "decision_made"),
    ActionStarted: ("session.action_started", events_pb2.SessionActionStarted, "action_started"),
    ActionFinished: ("session.action_finished", events_pb2.SessionActionFinished, "action_finished"),
    TurnRecovered: ("session.turn_recovered", events_pb2.SessionTurnRecovered, "turn_recovered"),
    DelegationStarted: ("session.delegation_started", events_pb2.SessionDelegationStarted, "delegation_started"),
    DelegationAnswered: ("session.delegation_answered", events_pb2.SessionDelegationAnswered, "delegation_answered"),
    DelegationChecked: ("session.delegation_checked", events_pb2.SessionDelegationChecked, "delegation_checked"),
    CompensationFinished: ("session.compensation_finished", events_pb2.SessionCompensationFinished,
                           "compensation_finished"),
}
_BY_TYPE = {event_type: cls for cls, (event_type, _, _) in EVENT_MESSAGES.items()}
_NOT_IN_PAYLOAD = {"event_id", "user_id"}  # the envelope's id; the tenant context's user
_MAX_GROUP = 64  # updates of one session committed in one transaction at most


def stream_id(tenant_id: str, session_id: str) -> str:
    # Neither id may contain "/" (tenant ids by the token rules, session ids by the handlers'),
    # so no two (tenant, session) pairs share a stream.
    return f"session/{tenant_id}/{session_id}"


def to_message(tenant_id: str, session_id: str, event: SessionEvent):
    """The payload message of a domain event (field names are the same on both sides)."""
    _, message_type, _ = EVENT_MESSAGES[type(event)]
    tenant = common_pb2.TenantContext(tenant_id=tenant_id, session_id=session_id,
                                      user_id=getattr(event, "user_id", ""))
    values = {f.name: getattr(event, f.name) for f in fields(event) if f.name not in _NOT_IN_PAYLOAD}
    return message_type(tenant=tenant, **{k: str(v) if isinstance(v, State) else v for k, v in values.items()})


def from_message(event_type: str, message, event_id: str) -> SessionEvent:
    cls = _BY_TYPE[event_type]
    values = {}
    for f in fields(cls):
        if f.name == "event_id":
            values[f.name] = event_id
        elif f.name == "user_id":
            values[f.name] = message.tenant.user_id
        else:
            value = getattr(message, f.name)
            values[f.name] = tuple(value) if f.name == "citations" else value
    if cls is StateChanged:
        values["from_state"], values["to_state"] = State(values["from_state"]), State(values["to_state"])
    return cls(**values)


def _envelope(tenant_id: str, session_id: str, event: SessionEvent) -> Envelope:
    event_type = EVENT_MESSAGES[type(event)][0]
    envelope = Envelope.wrap(to_message(tenant_id, session_id, event), event_type=event_type, tenant_id=tenant_id,
                             correlation_id=session_id)
    return replace(envelope, event_id=event.event_id) if event.event_id else envelope


def _versioned(stored: StoredEvent) -> Versioned:
    event = from_message(stored.envelope.event_type, stored.envelope.message(), stored.envelope.event_id)
    return Versioned(stored.version, event, stored.envelope.occurred_at)


class EventSourcedSessions:
    def __init__(self, db: Database, store: EventStore, outbox: Outbox,
                 snapshots: SnapshotStore | None = None, cache_size: int = 1024, *,
                 max_group: int = _MAX_GROUP, shared_reader: bool = True) -> None:
        """`max_group=1, shared_reader=False`: a transaction per update and a reader per follower (the
        benchmark's baseline)."""
        self.db, self.store, self.outbox = db, store, outbox
        self.max_group, self.shared_reader = max_group, shared_reader
        self.snapshots = snapshots or SnapshotStore()
        self.cache_size = cache_size
        self._cache: OrderedDict[str, tuple[Session, int]] = OrderedDict()  # stream -> (committed state, snapshot v.)
        self._waiting: dict[str, list[tuple[Callable, asyncio.Future]]] = {}  # stream -> updates not yet committed
        self._committing: dict[str, asyncio.Task] = {}  # stream -> the task committing its waiting updates
        self.feeds = StreamFeeds(store, _versioned)  # one reader per followed session, however many follow it

    def _cached(self, stream: str) -> tuple[Session, int] | None:
        hit = self._cache.get(stream)
        if hit is None:
            return None
        self._cache.move_to_end(stream)
        return hit[0].copy(), hit[1]

    def _keep(self, stream: str, session: Session, snapshot_version: int) -> None:
        """Remember a committed state (a copy: callers may go on changing theirs)."""
        held = self._cache.get(stream)
        if held is not None and held[0].version > session.version:
            return  # a concurrent reader loaded before the newer state this process wrote
        self._cache[stream] = (session.copy(), snapshot_version)
        self._cache.move_to_end(stream)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    async def history(self, tenant_id: str, session_id: str) -> list[Versioned]:
        stream, after, items = stream_id(tenant_id, session_id), 0, []
        while batch := await self.store.read_stream(stream, after, tenant_id=tenant_id):
            items += [_versioned(e) for e in batch]
            after = batch[-1].version
        return items

    async def _load_in(self, conn: asyncpg.Connection, tenant_id: str, session_id: str) -> tuple[Session, int]:
        stream = stream_id(tenant_id, session_id)
        cached = self._cached(stream)
        if cached is not None:
            start, snapshot_version = cached
        else:
            snapshot = await self.snapshots.load(conn, stream, SNAPSHOT_SCHEMA)
            start = Session.from_dict(snapshot.state) if snapshot else Session(tenant_id, session_id)
            snapshot_version = snapshot.version if snapshot else 0
        tail = [_versioned(e) for e in await self.store.read_stream_in(conn, stream, start.version)]
        return Session.replay(tenant_id, session_id, tail, start=start), snapshot_version

    async def load(self, tenant_id: str, session_id: str) -> Session:
        async with self.db.transaction(tenant_id) as conn:
            session, snapshot_version = await self._load_in(conn, tenant_id, session_id)
        self._keep(stream_id(tenant_id, session_id), session, snapshot_version)
        return session

    async def update(self, tenant_id: str, session_id: str,
                     decide: Callable[[Session], list[SessionEvent]]) -> Session:
        """Group commit: updates of one session that wait while a transaction holds it are decided in order,
        each on the state the ones before it left, and appended together in the next transaction (one lock,
        one load, one append, one commit for all of them). A decide that raises fails only its own update;
        a transaction that fails fails every update in it (none of their events was written).

        The transaction runs in a task of its own: a caller that stops waiting does not cut it short for
        the others (its events are written or not, as if it had waited)."""
        stream = stream_id(tenant_id, session_id)
        done: asyncio.Future[Session] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(stream, []).append((decide, done))
        if stream not in self._committing:
            task = asyncio.ensure_future(self._commit_waiting(tenant_id, session_id, stream))
            self._committing[stream] = task
        return await asyncio.shield(done)

    async def _commit_waiting(self, tenant_id: str, session_id: str, stream: str) -> None:
        try:
            while batch := self._waiting.get(stream):
                self._waiting[stream] = batch[self.max_group:]
                batch = batch[:self.max_group]
                try:
                    results = await self._commit_group(tenant_id, session_id, stream, [d for d, _ in batch])
                except Exception as exc:  # noqa: BLE001 - the transaction failed: every update of the group did
                    for _, done in batch:
                        if not done.done():
                            done.set_exception(exc)
                    continue
                except BaseException:  # cancelled (shutdown): so are the updates that waited on it
                    for _, done in batch:
                        done.cancel()
                    raise
                for (_, done), result in zip(batch, results, strict=True):
                    if done.done():
                        continue
                    if isinstance(result, Exception):
                        done.set_exception(result)
                    else:
                        done.set_result(result)
        finally:
            del self._committing[stream]
            for _, done in self._waiting.pop(stream, []):  # only left when cancelled: nothing commits them now
                done.cancel()

    async def _commit_group(self, tenant_id: str, session_id: str, stream: str,
                            decides: list[Callable[[Session], list[SessionEvent]]]) -> list[Session | Exception]:
        results: list[Session | Exception] = []
        async with self.db.transaction(tenant_id) as conn:
            await self.store.lock_stream(conn, stream)
            session, snapshot_version = await self._load_in(conn, tenant_id, session_id)
            start = session.version
            envelopes: list[Envelope] = []
            for decide in decides:
                try:
                    events = decide(session)
                except Exception as exc:  # noqa: BLE001 - the caller's refusal (a stale version, say): its own
                    results.append(exc)
                    continue
                for event in events:
                    envelope = _envelope(tenant_id, session_id, event)
                    envelopes.append(envelope)
                    session.apply(Versioned(start + len(envelopes), replace(event, event_id=envelope.event_id),
                                            envelope.occurred_at))  # as a replay will see it
                results.append(session.copy() if len(decides) > 1 else session)
            if envelopes:
                await self.store.append(conn, stream, start, envelopes)
                await self.outbox.add_many(conn, envelopes)
                if self.snapshots.due(snapshot_version, session.version):
                    await self.snapshots.save(conn, tenant_id, stream, SNAPSHOT_SCHEMA, session.version,
                                              session.to_dict())
                    snapshot_version = session.version
        self._keep(stream, session, snapshot_version)  # committed: the transaction ended without an error
        return results

    async def follow(self, tenant_id: str, session_id: str, after_version: int) -> AsyncIterator[Versioned]:
        stream = stream_id(tenant_id, session_id)
        if self.shared_reader:
            async for item in self.feeds.follow(stream, after_version, tenant_id):
                yield item
            return
        async for stored in self.store.subscribe_stream(stream, after_version, tenant_id=tenant_id):
            yield _versioned(stored)

"""Orchestrator handlers.

The conflict rule for devices: the first append for a version wins. A device that
sent with an older version gets a conflict naming the current version; it
catches up (Subscribe from its last version) and sends again, so no message is
lost and every replica converges on the same order. A resend with the same
idempotency key is recognised and not applied twice.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from libs.errors import Conflict, IdempotencyKeyReused, ValidationFailed
from libs.eventstore import ANY_VERSION
from libs.validation import check_session_id, check_tenant_id
from services.orchestrator.domain import MessageAppended, Session, SessionEvent, Versioned
from services.orchestrator.service_layer.ports import SessionRepository

__all__ = ["SendMessage", "follow", "get_session", "send_message"]


@dataclass(frozen=True)
class SendMessage:
    tenant_id: str
    user_id: str
    session_id: str
    device_id: str
    text: str
    expected_version: int = ANY_VERSION
    idempotency_key: str = ""


def _check_ids(tenant_id: str, session_id: str) -> None:
    check_tenant_id(tenant_id, "tenant.tenant_id")
    check_session_id(session_id, "session_id")


async def send_message(cmd: SendMessage, sessions: SessionRepository) -> Session:
    """Append a user message. -1 appends at whatever the session's version is; a version the device saw
    must still be current. Sends to one session are serialised, so concurrent devices never fail."""
    _check_ids(cmd.tenant_id, cmd.session_id)
    if cmd.expected_version < ANY_VERSION:
        raise ValidationFailed("must be -1 (any) or the last version the device saw", field="expected_version")
    event_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{cmd.tenant_id}/{cmd.session_id}/{cmd.idempotency_key}")) \
        if cmd.idempotency_key else str(uuid.uuid4())

    def decide(history: list[Versioned]) -> list[SessionEvent]:
        session = Session.replay(cmd.tenant_id, cmd.session_id, history)
        if cmd.idempotency_key:
            first = next((item.event for item in history if item.event.event_id == event_id), None)
            if first is not None:
                _same_send(first, cmd)
                return []  # a retry of a send that was applied: answer as the first time
        if cmd.expected_version not in (ANY_VERSION, session.version):
            raise Conflict(f"the session is at version {session.version}, the device saw {cmd.expected_version}",
                           field="expected_version",
                           hint=f"catch up with Subscribe(from_version={cmd.expected_version}) and send again")
        return session.send(cmd.user_id, cmd.device_id, cmd.text, event_id=event_id)

    history = await sessions.update(cmd.tenant_id, cmd.session_id, decide)
    return Session.replay(cmd.tenant_id, cmd.session_id, history)


def _same_send(first: SessionEvent, cmd: SendMessage) -> None:
    """A send under a used idempotency key must be the same send, or it is refused, not dropped."""
    if not isinstance(first, MessageAppended) or (first.user_id, first.device_id, first.text) != \
            (cmd.user_id, cmd.device_id, cmd.text.strip()):
        raise IdempotencyKeyReused(
            "was already used for a different message in this session", field="idempotency_key",
            hint="use a new idempotency key for a new message; reuse a key only to retry the same send")


async def get_session(tenant_id: str, session_id: str, sessions: SessionRepository) -> Session:
    _check_ids(tenant_id, session_id)
    return Session.replay(tenant_id, session_id, await sessions.history(tenant_id, session_id))


async def follow(tenant_id: str, session_id: str, from_version: int,
                 sessions: SessionRepository) -> AsyncIterator[Versioned]:
    _check_ids(tenant_id, session_id)
    if from_version < 0:
        raise ValidationFailed("must be 0 or more", field="from_version")
    async for item in sessions.follow(tenant_id, session_id, from_version):
        yield item

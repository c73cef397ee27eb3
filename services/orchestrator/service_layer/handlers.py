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
from services.orchestrator.service_layer.agent import Agent
from services.orchestrator.service_layer.ports import SessionRepository

__all__ = ["SendMessage", "follow", "get_session", "replay_session", "send_message"]


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


async def send_message(cmd: SendMessage, sessions: SessionRepository, agent: Agent | None = None) -> Session:
    """Append a user message, then run the turn it starts (with an agent) until the session waits for the user.
    -1 appends at whatever the session's version is; a version the device saw must still be current.
    Sends to one session are serialised, so concurrent devices never fail."""
    _check_ids(cmd.tenant_id, cmd.session_id)
    if cmd.expected_version < ANY_VERSION:
        raise ValidationFailed("must be -1 (any) or the last version the device saw", field="expected_version")
    event_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{cmd.tenant_id}/{cmd.session_id}/{cmd.idempotency_key}")) \
        if cmd.idempotency_key else str(uuid.uuid4())
    interrupt = agent.detector().detect(cmd.text) if agent is not None else None

    def decide(session: Session) -> list[SessionEvent]:
        if cmd.idempotency_key:
            first = next((m for m in session.messages if m.event_id == event_id), None)
            if first is not None:
                _same_send(first, cmd)
                return []  # a retry of a send that was applied: answer as the first time
        if cmd.expected_version not in (ANY_VERSION, session.version):
            raise Conflict(f"the session is at version {session.version}, the device saw {cmd.expected_version}",
                           field="expected_version",
                           hint=f"catch up with Subscribe(from_version={cmd.expected_version}) and send again")
        heard = agent.unless_answering(session, cmd.text, interrupt) if agent is not None else interrupt
        return session.receive(cmd.user_id, cmd.device_id, cmd.text, heard, event_id=event_id)

    session = await sessions.update(cmd.tenant_id, cmd.session_id, decide)
    if agent is None:
        return session
    return await agent.run_turn(cmd.tenant_id, cmd.session_id, cmd.user_id)


def _same_send(first: SessionEvent, cmd: SendMessage) -> None:
    """A send under a used idempotency key must be the same send, or it is refused, not dropped."""
    if not isinstance(first, MessageAppended) or (first.user_id, first.device_id, first.text) != \
            (cmd.user_id, cmd.device_id, cmd.text.strip()):
        raise IdempotencyKeyReused(
            "was already used for a different message in this session", field="idempotency_key",
            hint="use a new idempotency key for a new message; reuse a key only to retry the same send")


async def get_session(tenant_id: str, session_id: str, sessions: SessionRepository) -> Session:
    """The current state (snapshot + tail)."""
    _check_ids(tenant_id, session_id)
    return await sessions.load(tenant_id, session_id)


async def replay_session(tenant_id: str, session_id: str, sessions: SessionRepository) -> Session:
    """The state rebuilt from every event, ignoring snapshots (what `mnemesh session replay` shows)."""
    _check_ids(tenant_id, session_id)
    return Session.replay(tenant_id, session_id, await sessions.history(tenant_id, session_id))


async def follow(tenant_id: str, session_id: str, from_version: int,
                 sessions: SessionRepository) -> AsyncIterator[Versioned]:
    _check_ids(tenant_id, session_id)
    if from_version < 0:
        raise ValidationFailed("must be 0 or more", field="from_version")
    async for item in sessions.follow(tenant_id, session_id, from_version):
        yield item

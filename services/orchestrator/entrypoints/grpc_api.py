"""gRPC Orchestrator: translate only."""

from __future__ import annotations

from google.protobuf import timestamp_pb2

from libs.protogen.mnemesh.v1 import events_pb2, sessions_pb2, sessions_pb2_grpc
from libs.rpc import Registration
from services.orchestrator.domain import MessageAppended, Versioned
from services.orchestrator.service_layer import handlers
from services.orchestrator.service_layer.ports import SessionRepository

__all__ = ["registration"]

SCOPES = {"Send": "sessions:write", "Subscribe": "sessions:read", "GetSession": "sessions:read"}


def _event(session_id: str, item: Versioned) -> sessions_pb2.SessionEvent:
    occurred = timestamp_pb2.Timestamp()
    occurred.FromDatetime(item.occurred_at)
    out = sessions_pb2.SessionEvent(session_id=session_id, version=item.version, occurred_at=occurred)
    e = item.event
    if isinstance(e, MessageAppended):
        out.event_type = "session.message_appended"
        out.message_appended.CopyFrom(events_pb2.SessionMessageAppended(device_id=e.device_id, role=e.role,
                                                                        text=e.text))
        out.message_appended.tenant.user_id = e.user_id
    else:
        out.event_type = "session.state_changed"
        out.state_changed.CopyFrom(events_pb2.SessionStateChanged(from_state=e.from_state, to_state=e.to_state,
                                                                  reason=e.reason))
    return out


class OrchestratorServicer(sessions_pb2_grpc.OrchestratorServicer):
    def __init__(self, sessions: SessionRepository) -> None:
        self.sessions = sessions

    async def Send(self, request, context):
        cmd = handlers.SendMessage(
            tenant_id=request.tenant.tenant_id, user_id=request.tenant.user_id, session_id=request.session_id,
            device_id=request.device_id, text=request.text, expected_version=request.expected_version,
            idempotency_key=request.idempotency_key)
        session = await handlers.send_message(cmd, self.sessions)
        return sessions_pb2.SendResponse(version=session.version, state=session.state)

    async def GetSession(self, request, context):
        s = await handlers.get_session(request.tenant.tenant_id, request.session_id, self.sessions)
        return sessions_pb2.SessionState(session_id=s.session_id, version=s.version, state=s.state,
                                         messages=[m.text for m in s.messages])

    async def Subscribe(self, request, context):
        async for item in handlers.follow(request.tenant.tenant_id, request.session_id, request.from_version,
                                          self.sessions):
            yield _event(request.session_id, item)


def registration(sessions: SessionRepository) -> Registration:
    return Registration(sessions_pb2_grpc.add_OrchestratorServicer_to_server, OrchestratorServicer(sessions),
                        "mnemesh.v1.Orchestrator", SCOPES)

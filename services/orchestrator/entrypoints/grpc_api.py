"""gRPC Orchestrator: translate only."""

from __future__ import annotations

from google.protobuf import timestamp_pb2

from libs.protogen.mnemesh.v1 import sessions_pb2, sessions_pb2_grpc
from libs.rpc import Registration
from services.orchestrator.adapters.repository import EVENT_MESSAGES, to_message
from services.orchestrator.domain import Versioned
from services.orchestrator.service_layer import handlers
from services.orchestrator.service_layer.agent import Agent
from services.orchestrator.service_layer.ports import SessionRepository

__all__ = ["registration"]

SCOPES = {"Send": "sessions:write", "Subscribe": "sessions:read", "GetSession": "sessions:read"}


def _event(tenant_id: str, session_id: str, item: Versioned) -> sessions_pb2.SessionEvent:
    occurred = timestamp_pb2.Timestamp()
    occurred.FromDatetime(item.occurred_at)
    event_type, _, field = EVENT_MESSAGES[type(item.event)]
    out = sessions_pb2.SessionEvent(session_id=session_id, version=item.version, occurred_at=occurred,
                                    event_type=event_type)
    getattr(out, field).CopyFrom(to_message(tenant_id, session_id, item.event))
    return out


class OrchestratorServicer(sessions_pb2_grpc.OrchestratorServicer):
    def __init__(self, sessions: SessionRepository, agent: Agent | None) -> None:
        self.sessions, self.agent = sessions, agent

    async def Send(self, request, context):
        cmd = handlers.SendMessage(
            tenant_id=request.tenant.tenant_id, user_id=request.tenant.user_id, session_id=request.session_id,
            device_id=request.device_id, text=request.text, expected_version=request.expected_version,
            idempotency_key=request.idempotency_key)
        session = await handlers.send_message(cmd, self.sessions, self.agent)
        return sessions_pb2.SendResponse(version=session.version, state=session.state)

    async def GetSession(self, request, context):
        s = await handlers.get_session(request.tenant.tenant_id, request.session_id, self.sessions)
        return sessions_pb2.SessionState(session_id=s.session_id, version=s.version, state=s.state,
                                         messages=[m.text for m in s.messages])

    async def Subscribe(self, request, context):
        async for item in handlers.follow(request.tenant.tenant_id, request.session_id, request.from_version,
                                          self.sessions):
            yield _event(request.tenant.tenant_id, request.session_id, item)


def registration(sessions: SessionRepository, agent: Agent | None = None) -> Registration:
    return Registration(sessions_pb2_grpc.add_OrchestratorServicer_to_server, OrchestratorServicer(sessions, agent),
                        "mnemesh.v1.Orchestrator", SCOPES)

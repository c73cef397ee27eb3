"""A2A: the orchestrator as an agent other agents find (its card at /.well-known/agent-card.json) and call
(JSON-RPC SendMessage at /a2a), with the a2a-sdk. Translation only: an A2A message is a session Send.

One A2A context is one session (`a2a:<context id>`); the caller is the JWT's subject and tenant (bearer
token with the scope sessions:write; the card is public). The answer is one agent Message: the turn's
reply, with the session's id, version and state in its metadata. A call that carries an expected outcome
(`mnemesh.expected_memory_id`, see service_layer/delegation.py) gets the actual outcome recorded in
memory, linked to the expectation, and its id back as `mnemesh.actual_memory_id`.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import DefaultServerCallContextBuilder, create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore
from a2a.types.a2a_pb2 import (
    ROLE_AGENT,
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    Message,
    Part,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from a2a.utils.errors import InvalidParamsError, InvalidRequestError
from google.protobuf import json_format
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from libs.auth import Principal, TokenVerifier
from libs.errors import DomainError
from services.orchestrator.service_layer import handlers
from services.orchestrator.service_layer.delegation import (
    DEPTH_KEY,
    EXPECTED_KEY,
    MAX_DEPTH,
    OutcomeRecorder,
    delegation_depth,
)

__all__ = ["A2A_PATH", "agent_card", "http_app"]

A2A_PATH = "/a2a"
SCOPE = "sessions:write"
Turn = Callable[[handlers.SendMessage], Awaitable]  # send_message bound to the service's sessions and agent


def agent_card(url: str, version: str) -> AgentCard:
    return AgentCard(
        name="Mnemesh orchestrator",
        description="Answers customer requests with verified outcomes: a reply grounded in memory and tool "
                    "results, a clarifying question, or a hand-over to a human. One A2A context is one session.",
        version=version,
        supported_interfaces=[AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=False, push_notifications=False),
        security_schemes={"bearer": SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(
            scheme="bearer", bearer_format="JWT", description=f"a Mnemesh token with the scope {SCOPE}"))},
        security_requirements=[SecurityRequirement(schemes={"bearer": StringList(list=[SCOPE])})],
        default_input_modes=["text/plain"], default_output_modes=["text/plain"],
        skills=[AgentSkill(id="customer-service", name="Customer service",
                           description="Order status, invoices, and questions answered from memory; refunds and "
                                       "complaints handed to a person. English and Chinese.",
                           tags=["orders", "invoices", "memory"],
                           examples=["Where is my order A12345?", "我的发票在哪里？"])])


class _Callers(DefaultServerCallContextBuilder):
    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state["principal"] = request.scope.get("mnemesh.principal")
        return context


class _BearerAuth:
    """Every request but the card's carries a valid token with the scope sessions:write."""

    def __init__(self, app: ASGIApp, verifier: TokenVerifier | None) -> None:
        self.app, self.verifier = app, verifier

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != A2A_PATH:
            await self.app(scope, receive, send)
            return
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        token = header[7:].strip() if header[:7].lower() == "bearer " else None
        try:
            principal = self.verifier.verify(token) if self.verifier else Principal("anonymous", "", frozenset({"*"}))
        except DomainError as exc:
            await JSONResponse({**exc.to_dict()}, 401, {"WWW-Authenticate": "Bearer"})(scope, receive, send)
            return
        if not principal.has_scope(SCOPE):
            await JSONResponse({"error_type": "permission_denied", "field": "authorization",
                                "reason": f"the token lacks the scope {SCOPE}",
                                "hint": f"ask for a token with {SCOPE}"}, 403)(scope, receive, send)
            return
        scope["mnemesh.principal"] = principal
        await self.app(scope, receive, send)


def _depth(value) -> int:
    """The delegation depth a message says it is at; a chain deeper than MAX_DEPTH is refused."""
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0 or value != int(value):
        raise InvalidParamsError(message=f"metadata.{DEPTH_KEY}: must be a whole number of delegations, 0 or more")
    if value > MAX_DEPTH:
        raise InvalidRequestError(message=f"metadata.{DEPTH_KEY}: this message is {int(value)} delegations deep, "
                                          f"more than the {MAX_DEPTH} allowed (agents delegating round in a loop?)")
    return int(value)


class SessionExecutor(AgentExecutor):
    def __init__(self, turn: Turn, outcomes: OutcomeRecorder) -> None:
        self.turn, self.outcomes = turn, outcomes

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        principal: Principal | None = context.call_context.state.get("principal")
        metadata = json_format.MessageToDict(context.message.metadata) if context.message else {}
        tenant = principal.tenant_id if principal and principal.tenant_id else str(metadata.get("mnemesh.tenant", ""))
        subject = principal.subject if principal else "anonymous"
        text = context.get_user_input()
        if not text.strip():
            raise InvalidParamsError(message="message.parts: send at least one text part")
        session_id = f"a2a:{context.context_id}"
        depth = _depth(metadata.get(DEPTH_KEY, 0))
        served = delegation_depth.set(depth)  # the turn's own delegations go one deeper
        try:
            session = await self.turn(handlers.SendMessage(tenant, subject, session_id, f"a2a:{subject}"[:64], text))
        except DomainError as exc:
            raise InvalidRequestError(message=f"{exc.field}: {exc.reason}" if exc.field else exc.reason,
                                      data=exc.to_dict()) from None
        finally:
            delegation_depth.reset(served)
        reply = next((m for m in reversed(session.messages) if m.role == "assistant"), None)
        answer = {"mnemesh.session_id": session_id, "mnemesh.version": session.version,
                  "mnemesh.state": str(session.state)}
        if metadata.get(EXPECTED_KEY):
            answer["mnemesh.actual_memory_id"] = await self.outcomes.record_actual(
                tenant, subject, session_id, str(metadata[EXPECTED_KEY]), session)
        await event_queue.enqueue_event(Message(
            message_id=str(uuid.uuid4()), context_id=context.context_id, role=ROLE_AGENT,
            parts=[Part(text=reply.text if reply else "")], metadata=answer))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise InvalidRequestError(message="a turn answers at once; send 'cancel' to the session to stop its task")


def http_app(turn: Turn, outcomes: OutcomeRecorder, verifier: TokenVerifier | None, url: str,
             version: str) -> ASGIApp:
    card = agent_card(url, version)
    handler = DefaultRequestHandler(SessionExecutor(turn, outcomes), InMemoryTaskStore(), card)
    app = Starlette(routes=[*create_agent_card_routes(card),
                            *create_jsonrpc_routes(handler, A2A_PATH, context_builder=_Callers())])
    return _BearerAuth(app, verifier)

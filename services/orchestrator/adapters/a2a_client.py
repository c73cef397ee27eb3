"""Other agents over A2A (the AgentClient port), with the a2a-sdk client: the callee's card is resolved from
its well-known path, then one JSON-RPC SendMessage; the caller's identity is a bearer JWT for its tenant."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import httpx
from a2a.client import A2AClientError, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import ROLE_USER, Message, Part, SendMessageRequest
from a2a.utils.errors import A2AError
from google.protobuf import json_format

from services.orchestrator.service_layer.delegation import AgentAnswer

__all__ = ["A2AAgents"]

TokenIssuer = Callable[[str, list[str]], str]  # (tenant, scopes) -> bearer token


class A2AAgents:
    def __init__(self, issue: TokenIssuer, timeout: float = 30.0) -> None:
        self.issue, self.timeout = issue, timeout

    async def send(self, agent: str, tenant_id: str, context_id: str, text: str,
                   metadata: dict[str, Any]) -> AgentAnswer:
        headers = {"Authorization": f"Bearer {self.issue(tenant_id, ['sessions:write'])}"}
        message = Message(message_id=str(uuid.uuid4()), context_id=context_id, role=ROLE_USER,
                          parts=[Part(text=text)], metadata=metadata)
        async with httpx.AsyncClient(headers=headers, timeout=self.timeout) as http:
            try:
                client = await ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create_from_url(agent)
                async for event in client.send_message(SendMessageRequest(message=message)):
                    if event.HasField("message"):
                        return AgentAnswer("\n".join(p.text for p in event.message.parts if p.text),
                                           json_format.MessageToDict(event.message.metadata))
                    if event.HasField("task") and event.task.status.HasField("message"):
                        status = event.task.status.message
                        return AgentAnswer("\n".join(p.text for p in status.parts if p.text),
                                           json_format.MessageToDict(status.metadata))
            except (A2AClientError, httpx.HTTPError) as exc:  # unreachable, no card, a broken answer
                raise OSError(f"agent {agent}: {type(exc).__name__}: {exc}"[:500]) from None
            except A2AError as exc:  # the agent answered with an A2A error: it refused the message
                raise ValueError(f"agent {agent} refused: {exc.message}"[:500]) from None
        raise ValueError(f"agent {agent} sent no message back")

"""Memory as tools: `memory.remember`, `memory.recall`, `memory.forget`, `memory.confirm` for any agent.

Backed by the memory-writer and the retriever over their gRPC APIs (`memory:<operation>` backends).
Each call acts for the caller (the principal the pipeline authenticated): the caller's tenant, and the
caller as the user unless the arguments name one. The call to the memory service carries a short-lived
token on the caller's behalf (its tenant and subject) with the one scope the operation needs, the same
scope the tool asks of the caller, so the memory services apply their own rules to the caller (who may
forget what, who wrote a memory).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf import json_format

from libs.auth import current_principal, issue_token
from libs.config import Settings
from libs.errors import DomainError, NotFound, PermissionDenied, Unavailable, ValidationFailed
from libs.protogen.mnemesh.v1 import common_pb2, memory_pb2, memory_pb2_grpc
from libs.rpc.client import channel
from libs.rpc.status import error_detail
from services.tool_gateway.domain import ToolSpec

__all__ = ["MEMORY_TOOLS", "MemoryBackend", "memory_backend"]

TokenIssuer = Callable[[str, str, list[str]], str | None]  # (tenant, subject, scopes) -> token; None: auth off

_USER = {"type": "string", "maxLength": 128, "description": "whose memory (default: the caller)"}
_MEMORY_ID = {"type": "string", "format": "uuid", "description": "the memory's id, as remember or recall gave it"}
_LAYERS = {"session": common_pb2.MEMORY_LAYER_SESSION, "step": common_pb2.MEMORY_LAYER_STEP,
           "entity": common_pb2.MEMORY_LAYER_ENTITY, "short_term": common_pb2.MEMORY_LAYER_SHORT_TERM,
           "long_term": common_pb2.MEMORY_LAYER_LONG_TERM, "procedural": common_pb2.MEMORY_LAYER_PROCEDURAL}
_SOURCES = {"user_statement": (common_pb2.SOURCE_KIND_USER_STATEMENT, common_pb2.CONFIDENCE_L1_STRONG),
            "authoritative_api": (common_pb2.SOURCE_KIND_AUTHORITATIVE_API, common_pb2.CONFIDENCE_L1_STRONG),
            "model_inference": (common_pb2.SOURCE_KIND_MODEL_INFERENCE, common_pb2.CONFIDENCE_L2_MEDIUM),
            "third_party": (common_pb2.SOURCE_KIND_THIRD_PARTY, common_pb2.CONFIDENCE_L3_WEAK)}
_SCOPES = {"remember": "memory:write", "recall": "memory:read", "forget": "memory:forget", "confirm": "memory:write"}


def _spec(operation: str, description: str, properties: dict, required: list[str]) -> ToolSpec:
    schema = {"type": "object", "properties": {**properties, "user_id": _USER}, "required": required,
              "additionalProperties": False}
    return ToolSpec(name=f"memory.{operation}", description=description, input_schema=schema, version="1.0.0",
                    scopes=(_SCOPES[operation],), timeout_seconds=10.0, backend=f"memory:{operation}")


MEMORY_TOOLS: tuple[ToolSpec, ...] = (
    _spec("remember", "Store something worth remembering about the user (a fact, a preference, a result). "
                      "Give `key` for a fact that has one current value (e.g. user.phone); `source` says how "
                      "sure it is: user_statement and authoritative_api are used without asking, model_inference "
                      "must be confirmed (memory.confirm) before use.",
          {"content": {"type": "string", "minLength": 1, "maxLength": 16000},
           "key": {"type": "string", "maxLength": 128},
           "layer": {"enum": sorted(_LAYERS)}, "source": {"enum": sorted(_SOURCES)},
           "tags": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 64}, "maxItems": 32},
           "idempotency_key": {"type": "string", "maxLength": 128}}, ["content"]),
    _spec("recall", "Find the memories most relevant to a question, best first; a memory with must_confirm "
                    "must be confirmed with the user before it is used.",
          {"query": {"type": "string", "minLength": 1, "maxLength": 1000},
           "limit": {"type": "integer", "minimum": 1, "maximum": 50},
           "layers": {"type": "array", "items": {"enum": sorted(_LAYERS)}, "maxItems": 6}}, ["query"]),
    _spec("forget", "Forget one memory by its id (it is no longer found or served).",
          {"memory_id": _MEMORY_ID}, ["memory_id"]),
    _spec("confirm", "Record that the user confirmed a memory that needed confirming: it becomes strong (L1).",
          {"memory_id": _MEMORY_ID, "reason": {"type": "string", "maxLength": 500}}, ["memory_id"]),
)


def _error(exc: grpc.aio.AioRpcError, operation: str) -> DomainError:
    """The memory service's own structured error, relayed to the agent (never the raw status)."""
    detail = error_detail(exc)
    reason = detail.reason if detail else (exc.details() or exc.code().name)
    field, hint = (detail.field, detail.hint) if detail else ("", "")
    code = exc.code()
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED):
        return Unavailable(f"memory {operation}: {reason}", field=field, hint=hint or "retry with backoff")
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFound(reason, field=field or "memory_id", hint=hint or "recall memories for their ids")
    if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
        return PermissionDenied(reason, field=field, hint=hint or f"the caller needs the scope {_SCOPES[operation]}")
    return ValidationFailed(reason, field=field, hint=hint or "correct the arguments and call again")


class MemoryBackend:
    """The `memory:` backend: `target` is the operation (remember, recall, forget, confirm)."""

    def __init__(self, writer: grpc.aio.Channel, retriever: grpc.aio.Channel, issue: TokenIssuer) -> None:
        self.writer = memory_pb2_grpc.MemoryWriterStub(writer)
        self.retriever = memory_pb2_grpc.RetrieverStub(retriever)
        self.issue = issue

    async def call(self, target: str, arguments: dict[str, Any], timeout: float) -> dict[str, Any]:
        operation = getattr(self, f"_{target}", None) if target in _SCOPES else None
        if operation is None:
            raise ValidationFailed(f"memory:{target[:32]} is no memory operation", field="backend",
                                   hint=f"use memory:{', memory:'.join(_SCOPES)}")
        principal = current_principal.get()
        if principal is None or not principal.tenant_id:
            raise PermissionDenied("memory tools act for an authenticated caller of a tenant", field="authorization",
                                   hint="call with a token that names your tenant")
        tenant = common_pb2.TenantContext(tenant_id=principal.tenant_id,
                                          user_id=str(arguments.get("user_id") or principal.subject))
        token = self.issue(principal.tenant_id, principal.subject, [_SCOPES[target]])
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        try:
            return await operation(tenant, arguments, {"timeout": timeout, "metadata": metadata})
        except grpc.aio.AioRpcError as exc:
            raise _error(exc, target) from None

    async def _remember(self, tenant, arguments: dict[str, Any], call: dict) -> dict[str, Any]:
        source, confidence = _SOURCES[arguments.get("source", "user_statement")]
        layer = _LAYERS[arguments.get("layer", "entity" if arguments.get("key") else "long_term")]
        reply = await self.writer.Write(memory_pb2.WriteMemoryRequest(
            tenant=tenant, layer=layer, source=source, confidence=confidence, content=arguments["content"],
            key=arguments.get("key", ""), tags=arguments.get("tags", []),
            idempotency_key=arguments.get("idempotency_key", "")), **call)
        return {"memory_id": reply.memory_id, "status": memory_pb2.WriteStatus.Name(reply.status).removeprefix(
            "WRITE_STATUS_").lower(), "must_confirm": reply.must_confirm, "supersedes": reply.supersedes,
            "quarantine_reasons": list(reply.quarantine_reasons)}

    async def _recall(self, tenant, arguments: dict[str, Any], call: dict) -> dict[str, Any]:
        reply = await self.retriever.Search(memory_pb2.SearchRequest(
            tenant=tenant, query=arguments["query"], limit=arguments.get("limit", 5),
            layers=[_LAYERS[name] for name in arguments.get("layers", [])]), **call)
        return {"memories": [{
            "memory_id": h.memory.memory_id, "content": h.memory.content, "key": h.memory.key,
            "score": round(h.score, 4), "must_confirm": h.must_confirm, "step_id": h.memory.step_id,
            "confidence": common_pb2.Confidence.Name(h.memory.confidence).removeprefix("CONFIDENCE_").lower(),
            "created_at": json_format.MessageToJson(h.memory.created_at).strip('"')} for h in reply.hits]}

    async def _forget(self, tenant, arguments: dict[str, Any], call: dict) -> dict[str, Any]:
        reply = await self.writer.Forget(memory_pb2.ForgetRequest(tenant=tenant, memory_id=arguments["memory_id"]),
                                         **call)
        return {"forgotten": reply.forgotten}

    async def _confirm(self, tenant, arguments: dict[str, Any], call: dict) -> dict[str, Any]:
        reply = await self.writer.Confirm(memory_pb2.ConfirmRequest(
            tenant=tenant, memory_id=arguments["memory_id"], reason=arguments.get("reason", "")), **call)
        return {"memory_id": reply.memory.memory_id, "supersedes": reply.supersedes,
                "confidence": common_pb2.Confidence.Name(reply.memory.confidence).removeprefix(
                    "CONFIDENCE_").lower()}


def memory_backend(settings: Settings, closers: list) -> MemoryBackend:
    """The backend wired to this mesh's memory-writer and retriever (their channels closed with the service).

    Tokens for the caller's tenant are minted with the HS256 secret; with RS256 the memory services must
    accept the gateway's calls otherwise (the tools then answer permission_denied)."""
    def issue(tenant_id: str, subject: str, scopes: list[str]) -> str | None:
        if not settings.auth_enabled or settings.jwt_algorithm != "HS256":
            return None
        return issue_token(settings, subject=subject, tenant_id=tenant_id, scopes=scopes, ttl_seconds=300)

    writer = channel(f"{settings.host}:{settings.memory_writer_grpc_port}")
    retriever = channel(f"{settings.host}:{settings.retriever_grpc_port}")
    closers += [writer.close, retriever.close]
    return MemoryBackend(writer, retriever, issue)

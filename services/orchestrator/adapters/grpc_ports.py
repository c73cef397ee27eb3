"""The retriever, memory-writer and tool-gateway over their gRPC APIs (the ports' real implementations).

Each call carries a short-lived token for the session's tenant, with only the scopes it needs.
Cancelling an awaiting `call` cancels the gRPC call, which the gateway sees as a cancelled
context and passes on to its upstream.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf import json_format, struct_pb2

from libs.protogen.mnemesh.v1 import common_pb2, memory_pb2, memory_pb2_grpc, tools_pb2, tools_pb2_grpc
from services.orchestrator.service_layer.ports import CallStatus, MemoryHit, ToolInfo, ToolResult

__all__ = ["GrpcMemoryWriter", "GrpcRetriever", "GrpcToolGateway"]

TokenIssuer = Callable[[str, list[str]], str]  # (tenant, scopes) -> bearer token
_TOKEN_SECONDS = 300


class _Tokens:
    def __init__(self, issue: TokenIssuer) -> None:
        self.issue, self.cache = issue, {}

    def metadata(self, tenant_id: str, *scopes: str) -> tuple[tuple[str, str], ...]:
        key = (tenant_id, scopes)
        token, made = self.cache.get(key, ("", 0.0))
        if time.monotonic() - made > _TOKEN_SECONDS / 2:
            token = self.issue(tenant_id, list(scopes))
            self.cache[key] = (token, time.monotonic())
        return (("authorization", f"Bearer {token}"),)


class GrpcRetriever:
    def __init__(self, channel: grpc.aio.Channel, issue: TokenIssuer, timeout: float = 2.0) -> None:
        self.stub, self.tokens, self.timeout = memory_pb2_grpc.RetrieverStub(channel), _Tokens(issue), timeout

    async def search(self, tenant_id: str, user_id: str, session_id: str, query: str,
                     limit: int = 5) -> list[MemoryHit]:
        request = memory_pb2.SearchRequest(tenant=common_pb2.TenantContext(tenant_id=tenant_id, user_id=user_id),
                                           query=query[:1000], limit=limit)
        response = await self.stub.Search(request, timeout=self.timeout,
                                          metadata=self.tokens.metadata(tenant_id, "memory:read"))
        return [MemoryHit(h.memory.memory_id, h.memory.content, h.memory.key, h.score, h.must_confirm,
                          h.memory.confidence == common_pb2.CONFIDENCE_L1_STRONG) for h in response.hits]


class GrpcMemoryWriter:
    def __init__(self, channel: grpc.aio.Channel, issue: TokenIssuer, timeout: float = 2.0) -> None:
        self.stub, self.tokens, self.timeout = memory_pb2_grpc.MemoryWriterStub(channel), _Tokens(issue), timeout

    async def write_step(self, tenant_id: str, user_id: str, session_id: str, step_id: str, tool: str,
                         content: str, trigger: str) -> None:
        request = memory_pb2.WriteMemoryRequest(
            tenant=common_pb2.TenantContext(tenant_id=tenant_id, user_id=user_id, session_id=session_id),
            layer=common_pb2.MEMORY_LAYER_STEP, source=common_pb2.SOURCE_KIND_AUTHORITATIVE_API,
            content=content[:16_000], step_id=step_id, tags=[f"tool:{tool}"[:64]], idempotency_key=step_id,
            confidence=common_pb2.CONFIDENCE_L1_STRONG,
            attributes=_struct({"trigger": trigger[:1000], "tool": tool}))
        try:
            await self.stub.Write(request, timeout=self.timeout,
                                  metadata=self.tokens.metadata(tenant_id, "memory:write"))
        except grpc.aio.AioRpcError as exc:
            raise RuntimeError(f"memory-writer: {exc.code().name}: {exc.details()}") from None


    async def write_turns(self, tenant_id: str, user_id: str, session_id: str,
                          turns: list[tuple[str, str, str]]) -> None:
        tenant = common_pb2.TenantContext(tenant_id=tenant_id, user_id=user_id, session_id=session_id)
        writes = [memory_pb2.WriteMemoryRequest(
            tenant=tenant, layer=common_pb2.MEMORY_LAYER_SESSION, content=text[:16_000], tags=[f"role:{role}"],
            source=common_pb2.SOURCE_KIND_USER_STATEMENT if role == "user" else common_pb2.SOURCE_KIND_MODEL_INFERENCE,
            idempotency_key=key[:128]) for role, text, key in turns if text.strip()]
        try:
            reply = await self.stub.WriteBatch(memory_pb2.WriteBatchRequest(tenant=tenant, writes=writes),
                                               timeout=self.timeout,
                                               metadata=self.tokens.metadata(tenant_id, "memory:write"))
        except grpc.aio.AioRpcError as exc:
            raise RuntimeError(f"memory-writer: {exc.code().name}: {exc.details()}") from None
        failed = [r.error.reason for r in reply.results if r.result.status == memory_pb2.WRITE_STATUS_FAILED]
        if failed:
            raise RuntimeError(f"memory-writer refused {len(failed)} turn(s): {failed[0]}")

    async def record_outcome(self, tenant_id: str, user_id: str, session_id: str, content: str, *,
                             tags: tuple[str, ...], derived_from: tuple[str, ...], idempotency_key: str) -> str:
        request = memory_pb2.WriteMemoryRequest(
            tenant=common_pb2.TenantContext(tenant_id=tenant_id, user_id=user_id, session_id=session_id),
            layer=common_pb2.MEMORY_LAYER_STEP, source=common_pb2.SOURCE_KIND_AUTHORITATIVE_API,
            confidence=common_pb2.CONFIDENCE_L1_STRONG, content=content[:16_000], tags=list(tags),
            derived_from=list(derived_from), idempotency_key=idempotency_key[:128],
            step_id=idempotency_key[:128])  # the step layer needs one; the key is unique per outcome
        try:
            reply = await self.stub.Write(request, timeout=self.timeout,
                                          metadata=self.tokens.metadata(tenant_id, "memory:write"))
        except grpc.aio.AioRpcError as exc:
            raise RuntimeError(f"memory-writer: {exc.code().name}: {exc.details()}") from None
        return reply.memory_id

    async def confirm(self, tenant_id: str, user_id: str, memory_id: str, reason: str) -> None:
        request = memory_pb2.ConfirmRequest(tenant=common_pb2.TenantContext(tenant_id=tenant_id, user_id=user_id),
                                            memory_id=memory_id, reason=reason[:500])
        try:
            await self.stub.Confirm(request, timeout=self.timeout,
                                    metadata=self.tokens.metadata(tenant_id, "memory:write"))
        except grpc.aio.AioRpcError as exc:
            raise RuntimeError(f"memory-writer: {exc.code().name}: {exc.details()}") from None

    async def compress(self, tenant_id: str, user_id: str, session_id: str, window_tokens: int) -> str:
        request = memory_pb2.CompressSessionRequest(
            tenant=common_pb2.TenantContext(tenant_id=tenant_id, user_id=user_id, session_id=session_id),
            window_tokens=window_tokens)
        try:
            reply = await self.stub.CompressSession(request, timeout=self.timeout * 5,
                                                    metadata=self.tokens.metadata(tenant_id, "memory:write"))
        except grpc.aio.AioRpcError as exc:
            raise RuntimeError(f"memory-writer: {exc.code().name}: {exc.details()}") from None
        return reply.summary_memory_id if reply.compressed else ""


class GrpcToolGateway:
    def __init__(self, channel: grpc.aio.Channel, issue: TokenIssuer) -> None:
        self.stub, self.tokens = tools_pb2_grpc.ToolGatewayStub(channel), _Tokens(issue)

    async def call(self, tenant_id: str, user_id: str, session_id: str, tool: str, arguments: dict[str, Any],
                   call_id: str, deadline_seconds: float) -> ToolResult:
        request = tools_pb2.CallToolRequest(
            tenant=common_pb2.TenantContext(tenant_id=tenant_id, user_id=user_id, session_id=session_id),
            name=tool, arguments=_struct(arguments), chain_id=call_id, deadline_seconds=deadline_seconds)
        try:
            response = await self.stub.CallTool(request, timeout=deadline_seconds + 1.0,
                                                metadata=self.tokens.metadata(tenant_id, "tools:call"))
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return ToolResult(False, reason="the gateway did not answer in time", timed_out=True)
            # ABORTED: the same call (its chain step) is running at the gateway now; later it replays its result.
            retryable = exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                       grpc.StatusCode.ABORTED)
            return ToolResult(False, reason=f"{exc.code().name}: {exc.details()}", retryable=retryable)
        if response.HasField("error"):
            return ToolResult(False, reason=f"{response.error.field}: {response.error.reason}".strip(": "),
                              retryable=response.error.retryable,
                              timed_out=response.outcome == "timeout")
        return ToolResult(True, json_format.MessageToDict(response.result))

    async def status(self, tenant_id: str, call_id: str) -> CallStatus:
        """What the gateway recorded for the call this session made under `call_id` (its chain id)."""
        try:
            reply = await self.stub.GetCall(
                tools_pb2.GetCallRequest(tenant=common_pb2.TenantContext(tenant_id=tenant_id), call_id=call_id),
                timeout=2.0, metadata=self.tokens.metadata(tenant_id, "tools:call"))
        except grpc.aio.AioRpcError:
            return CallStatus("unknown")
        if reply.state == "done":
            return CallStatus("done", json_format.MessageToDict(reply.result))
        if reply.state == "unknown" and reply.call_id:  # the gateway recorded it: it may have happened
            return CallStatus("uncertain")
        return CallStatus(reply.state if reply.state in ("failed", "running") else "unknown")

    async def list_tools(self, tenant_id: str) -> list[ToolInfo]:
        response = await self.stub.ListTools(tools_pb2.ListToolsRequest(
            tenant=common_pb2.TenantContext(tenant_id=tenant_id), with_experience=True),
            timeout=2.0, metadata=self.tokens.metadata(tenant_id, "tools:read"))
        return [ToolInfo(t.name, t.description, json_format.MessageToDict(t.input_schema)) for t in response.tools]


def _struct(values: dict[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(values)
    return out

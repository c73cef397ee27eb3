"""gRPC ToolGateway: translate only.

CallTool runs the same pipeline as MCP tools/call. A call the pipeline refused before reaching a
backend (unknown tool, scopes, arguments, rate limit, open breaker) fails with its gRPC status
and ErrorDetail; a call that reached its backend and failed there answers OK with `error` set,
`outcome` saying how it ended, like the audit row.
"""

from __future__ import annotations

from google.protobuf import json_format, struct_pb2

from libs.auth import Principal, current_principal
from libs.errors import DomainError
from libs.protogen.mnemesh.v1 import common_pb2, tools_pb2, tools_pb2_grpc
from libs.rpc import Registration
from services.tool_gateway.adapters.mapping import spec_from_proto, spec_to_proto
from services.tool_gateway.domain import ToolCall
from services.tool_gateway.entrypoints.calls import current_trace_id
from services.tool_gateway.service_layer import handlers, pipeline
from services.tool_gateway.service_layer.pipeline import CallPorts

__all__ = ["registration"]

SCOPES = {"RegisterTool": "tools:admin", "ListTools": "tools:read", "CallTool": "tools:call"}
_ANONYMOUS = Principal(subject="anonymous", tenant_id="", scopes=frozenset({"*"}))
# Failures that happen at or after the backend: answered in-band (the call ran and is audited).
_IN_BAND = frozenset({"backend_error", "unavailable", "deadline_exceeded", "internal", "result_too_large"})


class ToolGatewayServicer(tools_pb2_grpc.ToolGatewayServicer):
    def __init__(self, ports: CallPorts) -> None:
        self.ports = ports

    async def RegisterTool(self, request, context):
        spec = await handlers.register_tool(spec_from_proto(request.tool), self.ports.registry)
        return tools_pb2.RegisterToolResponse(name=spec.name, version=spec.version)

    async def ListTools(self, request, context):
        specs = await handlers.list_tools(self.ports.registry)
        return tools_pb2.ListToolsResponse(tools=[spec_to_proto(s) for s in specs])

    async def CallTool(self, request, context):
        principal = current_principal.get() or _ANONYMOUS
        call = ToolCall(name=request.name, arguments=json_format.MessageToDict(request.arguments),
                        principal=principal, version=request.version, chain_id=request.chain_id,
                        deadline_seconds=request.deadline_seconds, trace_id=current_trace_id(),
                        context=request.context)
        outcome = await pipeline.call_tool(call, self.ports)
        response = tools_pb2.CallToolResponse(call_id=outcome.call_id, latency_ms=outcome.latency_ms,
                                              outcome=outcome.outcome, served_by=outcome.served_by,
                                              version=outcome.version, resource_uri=outcome.resource_uri)
        error: DomainError | None = outcome.error
        if error is not None:
            if error.error_type not in _IN_BAND:
                raise error  # the interceptor maps it to its status with the ErrorDetail
            response.error.CopyFrom(common_pb2.ErrorDetail(**error.to_dict()))
            return response
        assert outcome.result is not None
        result = struct_pb2.Struct()
        result.update(outcome.result.value)
        response.result.CopyFrom(result)
        response.truncated = outcome.result.truncated
        return response


def registration(ports: CallPorts) -> Registration:
    return Registration(tools_pb2_grpc.add_ToolGatewayServicer_to_server, ToolGatewayServicer(ports),
                        "mnemesh.v1.ToolGateway", SCOPES)

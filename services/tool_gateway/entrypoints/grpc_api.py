"""gRPC ToolGateway: translate only. CallTool arrives with the call pipeline (answers UNIMPLEMENTED until then)."""

from __future__ import annotations

from libs.protogen.mnemesh.v1 import tools_pb2, tools_pb2_grpc
from libs.rpc import Registration
from services.tool_gateway.adapters.mapping import spec_from_proto, spec_to_proto
from services.tool_gateway.service_layer import handlers
from services.tool_gateway.service_layer.ports import Registry

__all__ = ["registration"]

SCOPES = {"RegisterTool": "tools:admin", "ListTools": "tools:read", "CallTool": "tools:call"}


class ToolGatewayServicer(tools_pb2_grpc.ToolGatewayServicer):
    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    async def RegisterTool(self, request, context):
        spec = await handlers.register_tool(spec_from_proto(request.tool), self.registry)
        return tools_pb2.RegisterToolResponse(name=spec.name, version=spec.version)

    async def ListTools(self, request, context):
        return tools_pb2.ListToolsResponse(tools=[spec_to_proto(s) for s in await handlers.list_tools(self.registry)])


def registration(registry: Registry) -> Registration:
    return Registration(tools_pb2_grpc.add_ToolGatewayServicer_to_server, ToolGatewayServicer(registry),
                        "mnemesh.v1.ToolGateway", SCOPES)

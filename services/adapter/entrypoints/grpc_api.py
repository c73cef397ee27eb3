"""gRPC Adapter: translate only. Invoke arrives with the SOAP/COM bridges (answers UNIMPLEMENTED until then)."""

from __future__ import annotations

from libs.protogen.mnemesh.v1 import tools_pb2, tools_pb2_grpc
from libs.rpc import Registration
from services.adapter.domain.backends import Backend

__all__ = ["registration"]

SCOPES = {"ListBackends": "adapter:read", "Invoke": "adapter:invoke"}


class AdapterServicer(tools_pb2_grpc.AdapterServicer):
    def __init__(self, backends: list[Backend]) -> None:
        self.backends = backends

    async def ListBackends(self, request, context):
        return tools_pb2.ListBackendsResponse(backends=[
            tools_pb2.Backend(backend_id=b.backend_id, kind=b.kind, location=b.location) for b in self.backends])


def registration(backends: list[Backend]) -> Registration:
    return Registration(tools_pb2_grpc.add_AdapterServicer_to_server, AdapterServicer(backends),
                        "mnemesh.v1.Adapter", SCOPES)

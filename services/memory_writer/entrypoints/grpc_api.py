"""gRPC MemoryWriter: translate requests to commands and results to responses, nothing more."""

from __future__ import annotations

from libs.auth import current_principal
from libs.protogen.mnemesh.v1 import memory_pb2, memory_pb2_grpc
from libs.rpc import Registration
from services.memory_writer.adapters.mapping import command_from_proto, memory_to_proto
from services.memory_writer.service_layer import handlers
from services.memory_writer.service_layer.unit_of_work import UnitOfWorkFactory

__all__ = ["registration"]

SCOPES = {"Write": "memory:write", "Get": "memory:read", "Forget": "memory:forget"}


class MemoryWriterServicer(memory_pb2_grpc.MemoryWriterServicer):
    def __init__(self, uow: UnitOfWorkFactory) -> None:
        self.uow = uow

    async def Write(self, request, context):
        result = await handlers.write_memory(command_from_proto(request), self.uow())
        return memory_pb2.WriteMemoryResponse(memory_id=result.memory_id, duplicate=result.duplicate,
                                              version=result.version)

    async def Get(self, request, context):
        cmd = handlers.GetMemory(request.tenant.tenant_id, request.memory_id)
        return memory_pb2.GetMemoryResponse(memory=memory_to_proto(await handlers.get_memory(cmd, self.uow())))

    async def Forget(self, request, context):
        principal = current_principal.get()
        cmd = handlers.ForgetMemory(request.tenant.tenant_id, request.tenant.user_id, request.memory_id,
                                    requested_by=principal.subject if principal else "",
                                    admin=bool(principal and principal.has_scope(handlers.ADMIN_SCOPE)))
        return memory_pb2.ForgetResponse(forgotten=await handlers.forget(cmd, self.uow()))


def registration(uow: UnitOfWorkFactory) -> Registration:
    return Registration(memory_pb2_grpc.add_MemoryWriterServicer_to_server, MemoryWriterServicer(uow),
                        "mnemesh.v1.MemoryWriter", SCOPES)

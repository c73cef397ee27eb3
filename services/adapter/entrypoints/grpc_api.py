"""gRPC Adapter: translate only (protobuf <-> commands and catalogs)."""

from __future__ import annotations

import time

from google.protobuf import json_format, struct_pb2

from libs.errors import DomainError, NotFound
from libs.protogen.mnemesh.v1 import common_pb2, tools_pb2, tools_pb2_grpc
from libs.rpc import Registration
from services.adapter.adapters.gateway import tool_specs
from services.adapter.domain.backends import Backend
from services.adapter.domain.catalog import Catalog, PortInfo
from services.adapter.domain.commands import (
    DescribeBackend,
    DropBackend,
    ImportOptions,
    ImportWsdl,
    InvokeOperation,
    OperationPolicy,
)
from services.adapter.domain.errors import BackendFault
from services.adapter.service_layer import handlers
from services.adapter.service_layer.handlers import Bridge

__all__ = ["registration"]

SCOPES = {"ListBackends": "adapter:read", "Describe": "adapter:read", "Invoke": "adapter:invoke",
          "ImportWsdl": "adapter:admin", "Drop": "adapter:admin"}


def _struct(value: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(value)
    return s


def _port(p: PortInfo) -> tools_pb2.AdapterPort:
    return tools_pb2.AdapterPort(service=p.service, port=p.port, binding=p.binding, soap_version=p.soap_version,
                                 address=p.address)


def _backend(catalog: Catalog) -> tools_pb2.Backend:
    return tools_pb2.Backend(
        backend_id=catalog.backend_id, kind=catalog.kind, location=catalog.location,
        tools=tool_specs(catalog, 30.0, 0), wsdl_hash=catalog.wsdl_hash, revision=catalog.revision,
        port=_port(catalog.port), ports=[_port(p) for p in catalog.ports],
        failed=[tools_pb2.FailedOperation(operation=f.operation, reason=f.reason) for f in catalog.failed],
        notes=list(catalog.notes))


def _options(o: tools_pb2.ImportOptions) -> ImportOptions:
    return ImportOptions(service=o.service, port=o.port, address=o.address, allow_remote=o.allow_remote,
                         credentials=o.credentials, timeout_seconds=o.timeout_seconds or 30.0, retries=o.retries,
                         operations={k: OperationPolicy(v.timeout_seconds, v.retries if v.retries else -1)
                                     for k, v in o.operations.items()})


class AdapterServicer(tools_pb2_grpc.AdapterServicer):
    def __init__(self, bridge: Bridge, configured: list[Backend]) -> None:
        self.bridge, self.configured = bridge, configured

    async def ListBackends(self, request, context):
        listed = [_backend(b.catalog) for _, b in sorted(self.bridge.live.items())]
        seen = {b.backend_id for b in listed}
        listed += [tools_pb2.Backend(backend_id=b.backend_id, kind=b.kind, location=b.location)
                   for b in self.configured if b.backend_id not in seen]
        return tools_pb2.ListBackendsResponse(backends=listed)

    async def ImportWsdl(self, request, context):
        source = request.WhichOneof("source") or ""
        command = ImportWsdl(request.backend_id, url=request.url if source == "url" else "",
                             document=request.document if source == "document" else b"",
                             path=request.path if source == "path" else "", base_url=request.base_url,
                             documents=dict(request.documents), options=_options(request.options))
        result = await handlers.import_wsdl(command, self.bridge)
        return tools_pb2.ImportWsdlResponse(backend=_backend(result.catalog), registered=not result.registration_error,
                                            registration_error=result.registration_error)

    async def Describe(self, request, context):
        return tools_pb2.DescribeResponse(backend=_backend(await handlers.describe(DescribeBackend(request.backend_id),
                                                                                   self.bridge)))

    async def Drop(self, request, context):
        tools, error = await handlers.drop(DropBackend(request.backend_id), self.bridge)
        return tools_pb2.DropResponse(tools=tools, unregister_error=error)

    async def Invoke(self, request, context):
        command = InvokeOperation(request.backend_id, request.operation, json_format.MessageToDict(request.arguments))
        start = time.perf_counter()
        try:
            result = await handlers.invoke(command, self.bridge)
        except NotFound:
            raise  # an unknown backend or operation is the request's problem: a gRPC status
        except DomainError as exc:
            # What the backend or the arguments did wrong is the tool's answer, as MCP tools answer errors.
            fault = getattr(exc, "fault", None) if isinstance(exc, BackendFault) else None
            return tools_pb2.InvokeResponse(error=common_pb2.ErrorDetail(**exc.to_dict()),
                                            fault=_struct(fault) if fault else None,
                                            latency_ms=(time.perf_counter() - start) * 1000)
        return tools_pb2.InvokeResponse(result=_struct(result), latency_ms=(time.perf_counter() - start) * 1000)


def registration(bridge: Bridge, configured: list[Backend]) -> Registration:
    return Registration(tools_pb2_grpc.add_AdapterServicer_to_server, AdapterServicer(bridge, configured),
                        "mnemesh.v1.Adapter", SCOPES)

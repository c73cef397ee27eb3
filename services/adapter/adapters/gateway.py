"""Register imported operations with the tool-gateway over its RegisterTool RPC (a service token)."""

from __future__ import annotations

from collections.abc import Callable

import grpc
from google.protobuf import struct_pb2

from libs.logs import get_logger
from libs.protogen.mnemesh.v1 import common_pb2, tools_pb2, tools_pb2_grpc
from libs.rpc import channel, error_detail
from services.adapter.domain.catalog import Catalog
from services.adapter.domain.naming import tool_version

__all__ = ["GatewayRegistry", "tool_specs"]

log = get_logger(__name__)


def _struct(value: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(value)
    return s


def tool_specs(catalog: Catalog, timeout_seconds: float, retries: int) -> list[common_pb2.ToolSpec]:
    """One ToolSpec per operation: namespaced by backend, versioned by import revision and WSDL hash."""
    version = tool_version(catalog.revision, catalog.wsdl_hash)
    return [common_pb2.ToolSpec(name=t.name, description=t.description, input_schema=_struct(t.input_schema),
                                output_schema=_struct(t.output_schema), version=version,
                                timeout_seconds=timeout_seconds, retries=retries,
                                backend=f"adapter:{catalog.backend_id}/{t.operation}")
            for t in catalog.tools]


class GatewayRegistry:
    def __init__(self, address: str, token: Callable[[], str | None]) -> None:
        self.address, self.token = address, token

    async def register(self, catalog: Catalog, timeout_seconds: float, retries: int) -> str:
        problems = []
        async with channel(self.address, self.token) as ch:
            stub = tools_pb2_grpc.ToolGatewayStub(ch)
            for spec in tool_specs(catalog, timeout_seconds, retries):
                try:
                    await stub.RegisterTool(tools_pb2.RegisterToolRequest(tool=spec), timeout=10)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.ABORTED:
                        continue  # this version is registered already (a restart, or another replica)
                    detail = error_detail(exc)
                    problems.append(f"{spec.name}: {detail.reason if detail else exc.details()}")
                    if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED,
                                      grpc.StatusCode.PERMISSION_DENIED):
                        break  # the same for every tool
        if problems:
            log.warning("tools not registered with the gateway", backend=catalog.backend_id, problems=problems)
        return "; ".join(problems)

    async def unregister(self, names: list[str]) -> str:
        # The gateway has no RPC to remove a tool yet (see README, adapter section).
        if not names:
            return ""
        return (f"the tool-gateway cannot remove tools yet; {len(names)} tool(s) stay listed there until it can: "
                + ", ".join(names[:10]))

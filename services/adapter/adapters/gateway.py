"""Register imported operations with the tool-gateway over its RegisterTool RPC (a service token)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf import struct_pb2

from libs.logs import get_logger
from libs.protogen.mnemesh.v1 import common_pb2, tools_pb2, tools_pb2_grpc
from libs.rpc import channel, error_detail
from services.adapter.domain.catalog import Catalog
from services.adapter.domain.naming import tool_version

__all__ = ["REMOVE_RPCS", "GatewayRegistry", "tool_specs"]

log = get_logger(__name__)


def _struct(value: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(value)
    return s


def tool_specs(catalog: Catalog, timeout_seconds: float, retries: int) -> list[common_pb2.ToolSpec]:
    """One ToolSpec per operation: namespaced by backend, versioned by import revision and WSDL hash,
    with the operation's own timeout and retries where it has them (else the given defaults)."""
    version = tool_version(catalog.revision, catalog.wsdl_hash)
    return [common_pb2.ToolSpec(name=t.name, description=t.description, input_schema=_struct(t.input_schema),
                                output_schema=_struct(t.output_schema), version=version,
                                timeout_seconds=t.timeout_seconds or timeout_seconds,
                                retries=t.retries if t.retries >= 0 else retries,
                                backend=f"adapter:{catalog.backend_id}/{t.operation}")
            for t in catalog.tools]


# The RPC that removes a tool from the gateway, as the gateway's generated code will name it. Until the
# gateway has one, unregister says so and the tools stay listed (README, adapter section).
REMOVE_RPCS = (("RemoveTool", "RemoveToolRequest"), ("UnregisterTool", "UnregisterToolRequest"))
_FATAL = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
          grpc.StatusCode.UNIMPLEMENTED)


def _reason(exc: grpc.aio.AioRpcError) -> str:
    detail = error_detail(exc)
    return detail.reason if detail else (exc.details() or exc.code().name)


class GatewayRegistry:
    """RegisterTool / RemoveTool on the tool-gateway. `stub` and `messages` are the generated stub class
    and module, replaced by fakes in the unit tests."""

    def __init__(self, address: str, token: Callable[[], str | None], *, stub: Callable[[Any], Any] | None = None,
                 messages: Any = tools_pb2) -> None:
        self.address, self.token = address, token
        self.stub = stub or tools_pb2_grpc.ToolGatewayStub
        self.messages = messages

    async def register(self, catalog: Catalog, timeout_seconds: float, retries: int) -> str:
        problems = []
        async with channel(self.address, self.token) as ch:
            stub = self.stub(ch)
            for spec in tool_specs(catalog, timeout_seconds, retries):
                try:
                    await stub.RegisterTool(self.messages.RegisterToolRequest(tool=spec), timeout=10)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.ABORTED:
                        continue  # this version is registered already (a restart, or another replica)
                    problems.append(f"{spec.name}: {_reason(exc)}")
                    if exc.code() in _FATAL:
                        break  # the same for every tool
        if problems:
            log.warning("tools not registered with the gateway", backend=catalog.backend_id, problems=problems)
        return "; ".join(problems)

    async def unregister(self, names: list[str]) -> str:
        """Remove every version of each tool; a tool the gateway no longer has counts as removed."""
        if not names:
            return ""
        rpc = next(((method, request) for method, request in REMOVE_RPCS if hasattr(self.messages, request)), None)
        if rpc is None:
            return (f"the tool-gateway cannot remove tools yet (no RemoveTool RPC); {len(names)} tool(s) stay "
                    "listed there until it can: " + ", ".join(names[:10]))
        method, request = rpc
        problems = []
        async with channel(self.address, self.token) as ch:
            call = getattr(self.stub(ch), method)
            for name in names:
                try:
                    await call(getattr(self.messages, request)(name=name), timeout=10)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.NOT_FOUND:
                        continue  # gone already (another replica dropped it, or it was never registered)
                    problems.append(f"{name}: {_reason(exc)}")
                    if exc.code() in _FATAL:
                        problems.append(f"{len(names) - names.index(name) - 1} more not tried")
                        break
        if problems:
            log.warning("tools not removed from the gateway", problems=problems)
        return "; ".join(problems)

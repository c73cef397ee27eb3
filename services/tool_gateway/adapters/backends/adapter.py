"""The adapter's legacy tools (SOAP, COM): `adapter:<backend_id>/<operation>`, over gRPC Adapter.Invoke.

The adapter registers its tools with RegisterTool like any other team, naming this backend; the
gateway calls it behind a small port (AdapterClient), faked in unit tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import grpc
from google.protobuf import json_format, struct_pb2

from libs.errors import DomainError, Unavailable
from libs.protogen.mnemesh.v1 import tools_pb2, tools_pb2_grpc
from libs.rpc import channel
from libs.transient import is_transient
from services.tool_gateway.domain import BackendFailed, BackendFault

__all__ = ["AdapterBackend", "AdapterClient", "GrpcAdapterClient", "adapter_error"]


class AdapterClient(Protocol):
    async def invoke(self, backend_id: str, operation: str, arguments: dict[str, Any],
                     timeout: float) -> tools_pb2.InvokeResponse:
        ...


class GrpcAdapterClient:
    """One channel, opened on first use; `token` gives a credential with scope adapter:invoke (None: none)."""

    def __init__(self, address: str, token: Callable[[], str | None]) -> None:
        self.address, self.token = address, token
        self._channel: grpc.aio.Channel | None = None

    async def invoke(self, backend_id: str, operation: str, arguments: dict[str, Any],
                     timeout: float) -> tools_pb2.InvokeResponse:
        args = struct_pb2.Struct()
        args.update(arguments)
        if self._channel is None:
            self._channel = channel(self.address, self.token)
        return await tools_pb2_grpc.AdapterStub(self._channel).Invoke(
            tools_pb2.InvokeRequest(backend_id=backend_id, operation=operation, arguments=args), timeout=timeout)

    async def aclose(self) -> None:
        if self._channel is not None:
            await self._channel.close()


class AdapterBackend:
    def __init__(self, client: AdapterClient) -> None:
        self.client = client

    async def call(self, target: str, arguments: dict[str, Any], timeout: float) -> dict[str, Any]:
        backend_id, _, operation = target.partition("/")
        try:
            response = await self.client.invoke(backend_id, operation, arguments, timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TimeoutError from None
            if is_transient(exc):
                raise Unavailable(f"the adapter is unreachable ({exc.code().name})", hint="retry with backoff") \
                    from None
            raise BackendFailed(f"the adapter refused the call ({exc.code().name})",
                                hint="operators: check the adapter's log for this backend") from None
        if response.HasField("error") and response.error.error_type:
            raise adapter_error(response)
        return json_format.MessageToDict(response.result)


def adapter_error(response: tools_pb2.InvokeResponse) -> DomainError:
    """The adapter's structured error, its semantics kept (e.g. backend_fault, retryable or not), and the
    backend's fault (SOAP code, subcodes, actor, detail) kept with it rather than dropped."""
    e = response.error
    reason, hint = e.reason or "the legacy backend failed", e.hint
    if response.HasField("fault"):
        error: DomainError = BackendFault(reason, fault=json_format.MessageToDict(response.fault), field=e.field,
                                          hint=hint, retryable=e.retryable)
    else:
        error = (Unavailable if e.retryable else BackendFailed)(reason, field=e.field, hint=hint)
    error.error_type = e.error_type or error.error_type  # keep the adapter's semantics (e.g. soap_fault)
    return error

"""gRPC client side: channels that carry the bearer token and the trace context."""

from __future__ import annotations

from collections.abc import Callable

import grpc

from libs.telemetry import inject

__all__ = ["channel"]


class _Metadata:
    def __init__(self, token: Callable[[], str | None]) -> None:
        self.token = token

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = list(details.metadata or [])
        metadata += list(inject({}).items())
        if token := self.token():
            metadata.append(("authorization", f"Bearer {token}"))
        return grpc.aio.ClientCallDetails(details.method, details.timeout, grpc.aio.Metadata(*metadata),
                                          details.credentials, details.wait_for_ready)



# grpc.aio files an interceptor under the first call type it matches, so each type needs its own.
class _UnaryUnary(_Metadata, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(self._details(details), request)


class _UnaryStream(_Metadata, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):
        return await continuation(self._details(details), request)


def channel(target: str, token: str | Callable[[], str | None] | None = None) -> grpc.aio.Channel:
    """An insecure aio channel to `target` that sends `token` and the current traceparent."""
    supplier = token if callable(token) else (lambda: token)
    return grpc.aio.insecure_channel(target, interceptors=[_UnaryUnary(supplier), _UnaryStream(supplier)])

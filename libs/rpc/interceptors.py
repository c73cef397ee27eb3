"""The server-side call pipeline: trace, authenticate, authorise, deadline, map errors, log, measure.

Wrapping the handler's behaviour (rather than answering from the interceptor)
keeps the principal and the span in the same task as the servicer code.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping

import asyncpg
import grpc
from opentelemetry import metrics
from opentelemetry.trace import SpanKind, Status, StatusCode

from libs.auth import Principal, TokenVerifier, current_principal
from libs.errors import (
    DeadlineExceeded,
    DomainError,
    Internal,
    PermissionDenied,
    Unavailable,
    Unimplemented,
    ValidationFailed,
)
from libs.logs import get_logger
from libs.rpc.status import status_for
from libs.telemetry import extract, tracer
from libs.transient import is_transient
from libs.validation import check_message, quote

__all__ = ["CallPipeline"]

log = get_logger(__name__)
_PUBLIC = ("/grpc.health.v1.Health/", "/grpc.reflection.")
_ANONYMOUS = Principal(subject="anonymous", tenant_id="", scopes=frozenset({"*"}))


class Undecodable:
    """Stands for a request whose bytes are not a valid message (invalid UTF-8, corrupt, nested too deep).

    grpc would answer UNKNOWN "Unexpected DecodeError" before any interceptor ran; handing this on
    instead lets the pipeline authenticate the caller first and then refuse with INVALID_ARGUMENT.
    """

    def __init__(self, message_name: str) -> None:
        self.message_name = message_name


def _tolerant(deserializer, method: str):
    """`deserializer` that returns Undecodable instead of raising."""
    if deserializer is None:
        return None
    owner = getattr(deserializer, "__self__", None)  # the generated code passes X.FromString
    name = owner.DESCRIPTOR.full_name if hasattr(owner, "DESCRIPTOR") else f"request of {method}"

    def deserialize(data: bytes):
        try:
            return deserializer(data)
        # Any parse failure (DecodeError, RecursionError...) is the caller's: nothing to log.
        except Exception:  # noqa: BLE001
            return Undecodable(name)

    return deserialize


class CallPipeline(grpc.aio.ServerInterceptor):
    """`method_scopes` maps full method names ("/mnemesh.v1.X/Y") to the scope they need.

    A method absent from the map is refused: forgetting to declare a scope must not open a door.
    """

    def __init__(self, verifier: TokenVerifier | None, method_scopes: Mapping[str, str],
                 default_deadline_seconds: float = 30.0) -> None:
        self.verifier, self.method_scopes = verifier, method_scopes
        self.default_deadline = default_deadline_seconds
        meter = metrics.get_meter("mnemesh.rpc")
        self._calls = meter.create_counter("rpc_server_calls", description="gRPC calls by method and code")
        self._latency = meter.create_histogram("rpc_server_duration", unit="ms", description="gRPC call latency")

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        handler = await continuation(details)
        if handler is None or details.method.startswith(_PUBLIC):
            return handler
        method = details.method
        if handler.unary_unary:
            inner = handler.unary_unary

            async def unary_unary(request, context):
                async with self._call(method, request, context, streaming=False):
                    return await inner(request, context)

            return grpc.unary_unary_rpc_method_handler(unary_unary, _tolerant(handler.request_deserializer, method),
                                                       handler.response_serializer)
        if handler.unary_stream:
            inner_stream = handler.unary_stream

            async def unary_stream(request, context):
                async with self._call(method, request, context, streaming=True):
                    async for item in inner_stream(request, context):
                        yield item

            return grpc.unary_stream_rpc_method_handler(unary_stream,
                                                        _tolerant(handler.request_deserializer, method),
                                                        handler.response_serializer)
        return handler  # client-streaming RPCs are not part of the API

    async def _authenticate(self, context: grpc.aio.ServicerContext) -> Principal:
        if self.verifier is None:
            return _ANONYMOUS
        metadata = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        header = metadata.get("authorization", "")
        token = header[7:].strip() if header.lower().startswith("bearer ") else None
        if self.verifier.algorithm == "HS256":
            return self.verifier.verify(token)
        cached = self.verifier.cached(token) if token else None  # no thread hop for a token verified before
        if cached is not None:
            return cached
        return await asyncio.to_thread(self.verifier.verify, token)  # may fetch JWKS

    def _authorise(self, method: str, principal: Principal, request) -> None:
        scope = self.method_scopes.get(method)
        if scope is None:
            raise PermissionDenied(f"{method} declares no scope, so nobody may call it",
                                   hint="declare the method's scope in the service's METHOD_SCOPES")
        if not principal.has_scope(scope):
            raise PermissionDenied(f"the token lacks the scope {scope!r}", field="authorization",
                                   hint=f"ask for a token with scope {scope}")
        tenant = getattr(request, "tenant", None)
        if tenant is not None and principal.tenant_id:
            # Tenant isolation is a hard filter: the token decides, the request can only agree.
            if tenant.tenant_id and tenant.tenant_id != principal.tenant_id:
                raise PermissionDenied(f"the token is for tenant {principal.tenant_id!r}, "
                                       f"not {quote(tenant.tenant_id)}",
                                       field="tenant.tenant_id", hint="leave tenant_id empty or use your own")
            tenant.tenant_id = principal.tenant_id

    def _translate(self, exc: Exception, server_deadline: asyncio.Timeout | None, span, method: str) -> DomainError:
        """The structured error a failure leaves as."""
        if isinstance(exc, DomainError):
            return exc
        if isinstance(exc, NotImplementedError):
            return Unimplemented("this method is not available yet", hint="see the API table in the README")
        if isinstance(exc, TimeoutError) and server_deadline is not None and server_deadline.expired():
            return DeadlineExceeded(f"the call took longer than the server's {self.default_deadline:.0f} s limit",
                                    hint="send a deadline of your own, or ask for less")
        if isinstance(exc, asyncpg.PostgresError) and (exc.sqlstate or "")[:2] in ("22", "54"):
            # Data the store cannot hold (a value out of range, an index row too large): the request's
            # fault, and retrying cannot help. The edge checks should have caught it first.
            log.warning("rpc refused by the database", method=method, sqlstate=exc.sqlstate, error=str(exc)[:200])
            return ValidationFailed("the request holds a value the store cannot keep", retryable=False,
                                    hint="shorten or correct the values you sent; see the limits in the README")
        if is_transient(exc):
            log.warning("rpc failed on infrastructure", method=method, error=str(exc))
            return Unavailable(f"a dependency is unreachable ({type(exc).__name__})",
                               hint="retry with backoff; operators: check PostgreSQL and Redis")
        span.record_exception(exc)
        log.error("rpc failed", method=method, exc_info=exc)
        trace_id = format(span.get_span_context().trace_id, "032x")
        return Internal(f"internal error; the service log has trace id {trace_id}", retryable=True,
                        hint="retry once; if it persists, report the trace id")

    @contextlib.asynccontextmanager
    async def _call(self, method: str, request, context, *, streaming: bool) -> AsyncIterator[None]:
        metadata = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        server_deadline: asyncio.Timeout | None = None
        with tracer().start_as_current_span(method.lstrip("/"), kind=SpanKind.SERVER,
                                            context=extract(metadata)) as span:
            span.set_attributes({"rpc.system": "grpc", "rpc.method": method})
            token = None
            try:
                principal = await self._authenticate(context)
                if isinstance(request, Undecodable):
                    # Said after authentication, and nothing more: the parser's complaint stays here.
                    raise ValidationFailed(f"the request is not a valid {request.message_name} message",
                                           hint="send a message built from proto/mnemesh/v1 (strings must be "
                                                "valid UTF-8)")
                self._authorise(method, principal, request)
                check_message(request)
                token = current_principal.set(principal)
                span.set_attribute("enduser.id", principal.subject)
                if streaming or context.time_remaining() is not None:
                    yield
                else:
                    async with asyncio.timeout(self.default_deadline) as server_deadline:
                        yield
            except grpc.aio.AbortError:
                raise  # the servicer answered with a status of its own
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED
                raise
            except Exception as exc:  # the process's edge: every failure leaves as a structured status
                code, message, trailers = status_for(self._translate(exc, server_deadline, span, method))
                span.set_status(Status(StatusCode.ERROR, message))
                await context.abort(code, message, trailing_metadata=trailers)
            finally:
                if token is not None:
                    current_principal.reset(token)
                elapsed = (time.perf_counter() - started) * 1000
                attrs = {"rpc.method": method, "rpc.grpc.status_code": code.name}
                self._calls.add(1, attrs)
                self._latency.record(elapsed, attrs)
                log.info("rpc", method=method, code=code.name, duration_ms=round(elapsed, 2))

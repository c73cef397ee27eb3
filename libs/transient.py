"""Failures of what the code depends on (PostgreSQL, Redis, Qdrant, the network), as opposed to bugs or bad input.

Transient failures are retried, waited out, or answered as UNAVAILABLE; they never
dead-letter an event, since the event itself is fine. Everything else is permanent
until proven otherwise: a stream consumer gives it at most ``max_deliveries`` tries.

PostgreSQL errors are classed by SQLSTATE: connection trouble (08), an operator or
crash shutdown (57P01-57P03), too many connections or no memory (53), serialization
failures and deadlocks (40001, 40P01), lock and statement timeouts (55P03, 57014) are
transient; data errors (22), integrity violations (23), program limits such as an
index row that is too large (54) and everything else are permanent.
"""

from __future__ import annotations

import asyncpg
import grpc
import httpx
import redis.exceptions

from libs.errors import Busy

__all__ = ["TRANSIENT_ERRORS", "is_transient"]

# Always transient, whatever their details.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    Busy,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,  # the connection was lost or closed under the operation
    asyncpg.TooManyConnectionsError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,
    httpx.TransportError,
    ConnectionError,
    TimeoutError,
)
_TRANSIENT_SQLSTATE_CLASSES = ("08", "53")
_TRANSIENT_SQLSTATES = {"57P01", "57P02", "57P03", "40001", "40P01", "55P03", "57014", "58000", "58030"}
_TRANSIENT_GRPC = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED,
                   grpc.StatusCode.ABORTED}


def _qdrant_transient(exc: BaseException) -> bool | None:
    try:
        from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse
    except ImportError:  # pragma: no cover - qdrant-client is a dependency
        return None
    if isinstance(exc, ResponseHandlingException):  # the request never got an answer
        return True
    if isinstance(exc, UnexpectedResponse):
        return exc.status_code in (408, 429) or exc.status_code >= 500
    return None


def is_transient(exc: BaseException) -> bool:
    """True when retrying later can succeed with the same input."""
    if isinstance(exc, TRANSIENT_ERRORS):
        return True
    if isinstance(exc, asyncpg.PostgresError):
        state = exc.sqlstate or ""
        return state[:2] in _TRANSIENT_SQLSTATE_CLASSES or state in _TRANSIENT_SQLSTATES
    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        return exc.code() in _TRANSIENT_GRPC
    if (qdrant := _qdrant_transient(exc)) is not None:
        return qdrant
    if isinstance(exc, OSError):  # sockets, refused connections, resets
        return True
    return False

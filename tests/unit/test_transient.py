"""Transient means transient, and only that: the classification that decides retry vs dead letter."""

from __future__ import annotations

import asyncpg
import grpc
import httpx
import pytest
import redis.exceptions
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from libs.transient import is_transient


def pg(sqlstate: str) -> asyncpg.PostgresError:
    """The asyncpg exception class PostgreSQL's SQLSTATE maps to, as the driver raises it."""
    error = asyncpg.PostgresError.get_message_class_for_sqlstate(sqlstate)("from the server")
    error.sqlstate = sqlstate
    return error


@pytest.mark.parametrize("error", [
    pg("08006"),  # connection failure
    pg("57P01"),  # admin shutdown
    pg("57P03"),  # cannot connect now (starting up)
    pg("53300"),  # too many connections
    pg("40001"),  # serialization failure
    pg("40P01"),  # deadlock
    asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
    redis.exceptions.ConnectionError("Connection refused"),
    redis.exceptions.TimeoutError("Timeout reading from socket"),
    ResponseHandlingException(ConnectionRefusedError("Qdrant is down")),
    UnexpectedResponse(503, "Service Unavailable", b"", httpx.Headers()),
    httpx.ConnectError("connection refused"),
    ConnectionResetError("reset by peer"),
    TimeoutError(),
], ids=lambda e: type(e).__name__ + ":" + (getattr(e, "sqlstate", "") or ""))
def test_infrastructure_failures_are_transient(error: BaseException) -> None:
    assert is_transient(error)


@pytest.mark.parametrize("error", [
    pg("54000"),  # program limit exceeded: "index row requires 15016 bytes"
    pg("22021"),  # character not in repertoire (a NUL byte)
    pg("22008"),  # datetime field overflow
    pg("23505"),  # unique violation
    pg("42P01"),  # undefined table: a bug, not an outage
    UnexpectedResponse(400, "Bad Request", b"", httpx.Headers()),
    ValueError("bad input"),
    KeyError("missing"),
    AttributeError("a bug"),
], ids=lambda e: type(e).__name__ + ":" + (getattr(e, "sqlstate", "") or ""))
def test_data_limit_integrity_errors_and_bugs_are_permanent(error: BaseException) -> None:
    assert not is_transient(error)


def test_a_grpc_error_is_transient_only_for_unavailable_and_deadline_codes() -> None:
    class Rpc(grpc.RpcError):
        def __init__(self, code: grpc.StatusCode) -> None:
            self._code = code

        def code(self) -> grpc.StatusCode:
            return self._code

    assert is_transient(Rpc(grpc.StatusCode.UNAVAILABLE))
    assert is_transient(Rpc(grpc.StatusCode.DEADLINE_EXCEEDED))
    assert not is_transient(Rpc(grpc.StatusCode.INVALID_ARGUMENT))

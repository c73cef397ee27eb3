"""Domain errors become gRPC statuses whose rich details decode back to the same error."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from libs.errors import Conflict, DomainError, NotFound, PermissionDenied, Unauthenticated, ValidationFailed
from libs.events import MalformedEvent
from libs.protogen.mnemesh.v1 import common_pb2
from libs.rpc.status import error_detail, status_for


def rich_status(error: DomainError) -> status_pb2.Status:
    _, _, metadata = status_for(error)
    [(key, value)] = metadata
    assert key == "grpc-status-details-bin"
    return status_pb2.Status.FromString(value)


def unpacked(status: status_pb2.Status, message_type):
    found = [d for d in status.details if d.Is(message_type.DESCRIPTOR)]
    assert len(found) <= 1
    if not found:
        return None
    message = message_type()
    found[0].Unpack(message)
    return message


class FailedCall(grpc.RpcError):
    """What a client sees when a call fails: code, details and trailing metadata."""

    def __init__(self, code: grpc.StatusCode, details: str, metadata: tuple) -> None:
        self._code, self._details, self._metadata = code, details, metadata

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return self._metadata


@pytest.mark.parametrize(("error", "code"), [
    (ValidationFailed("is required", field="content"), grpc.StatusCode.INVALID_ARGUMENT),
    (MalformedEvent("is missing", field="payload"), grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound("no such memory", field="memory_id"), grpc.StatusCode.NOT_FOUND),
    (Conflict("moved", field="expected_version"), grpc.StatusCode.ABORTED),
    (Unauthenticated("no bearer token", field="authorization"), grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDenied("needs memory:write"), grpc.StatusCode.PERMISSION_DENIED),
    (DomainError("something else"), grpc.StatusCode.FAILED_PRECONDITION),
])
def test_each_error_type_maps_to_its_grpc_code(error: DomainError, code: grpc.StatusCode) -> None:
    got, _, _ = status_for(error)
    assert got == code
    assert rich_status(error).code == code.value[0]


def test_the_error_detail_decodes_back_with_every_field() -> None:
    error = Conflict("the session is at version 3", field="expected_version", hint="Subscribe and send again")
    detail = unpacked(rich_status(error), common_pb2.ErrorDetail)
    assert detail == common_pb2.ErrorDetail(error_type="conflict", field="expected_version",
                                            reason="the session is at version 3", retryable=True,
                                            hint="Subscribe and send again")


def test_the_message_names_the_field_and_says_what_to_do() -> None:
    _, message, _ = status_for(ValidationFailed("must not be empty", field="content", hint="send the text"))
    assert message == "content: must not be empty (send the text)"
    assert rich_status(ValidationFailed("must not be empty", field="content", hint="send the text")).message \
        == message


def test_a_validation_error_also_carries_a_standard_bad_request_field_violation() -> None:
    bad = unpacked(rich_status(ValidationFailed("must not be empty", field="content")),
                   error_details_pb2.BadRequest)
    assert [(v.field, v.description) for v in bad.field_violations] == [("content", "must not be empty")]


@pytest.mark.parametrize("error", [NotFound("gone", field="memory_id"), ValidationFailed("no field at all")])
def test_only_field_specific_validation_errors_carry_a_bad_request(error: DomainError) -> None:
    assert unpacked(rich_status(error), error_details_pb2.BadRequest) is None


def test_a_client_reads_the_error_detail_from_a_failed_call() -> None:
    error = NotFound("no memory m1 for this tenant", field="memory_id", hint="check the id")
    code, message, metadata = status_for(error)
    detail = error_detail(FailedCall(code, message, metadata))
    assert (detail.error_type, detail.field, detail.reason, detail.retryable, detail.hint) == (
        "not_found", "memory_id", "no memory m1 for this tenant", False, "check the id")


def test_a_failed_call_without_rich_details_has_no_error_detail() -> None:
    assert error_detail(FailedCall(grpc.StatusCode.UNAVAILABLE, "connection refused", ())) is None

"""Domain errors <-> gRPC status with rich details (google.rpc.Status + ErrorDetail)."""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from libs.errors import DomainError
from libs.protogen.mnemesh.v1 import common_pb2

__all__ = ["CODES", "error_detail", "status_for"]

CODES: dict[str, grpc.StatusCode] = {
    "validation": grpc.StatusCode.INVALID_ARGUMENT,
    "malformed_event": grpc.StatusCode.INVALID_ARGUMENT,
    "not_found": grpc.StatusCode.NOT_FOUND,
    "conflict": grpc.StatusCode.ABORTED,
    "step_running": grpc.StatusCode.ABORTED,  # a tool chain's step running now: retry once it ended
    "idempotency_key_reused": grpc.StatusCode.ALREADY_EXISTS,
    "unauthenticated": grpc.StatusCode.UNAUTHENTICATED,
    "permission_denied": grpc.StatusCode.PERMISSION_DENIED,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
    "rate_limited": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "circuit_open": grpc.StatusCode.UNAVAILABLE,
    "deadline_exceeded": grpc.StatusCode.DEADLINE_EXCEEDED,
    "unimplemented": grpc.StatusCode.UNIMPLEMENTED,
    "internal": grpc.StatusCode.INTERNAL,
}


def _pack(message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


# Rules quote input through libs.validation.quote; this cap is the last guard, so that no
# message can outgrow the client's metadata limit (8 KB by default) whatever a rule repeats.
MAX_FIELD_CHARS, MAX_TEXT_CHARS = 200, 1_000


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def status_for(error: DomainError) -> tuple[grpc.StatusCode, str, tuple[tuple[str, bytes], ...]]:
    """(code, message, trailing metadata carrying the rich status) for `error`."""
    code = CODES.get(error.error_type, grpc.StatusCode.FAILED_PRECONDITION)
    field, reason, hint = (_clip(error.field, MAX_FIELD_CHARS), _clip(error.reason, MAX_TEXT_CHARS),
                           _clip(error.hint, MAX_TEXT_CHARS))
    detail = common_pb2.ErrorDetail(error_type=error.error_type, field=field, reason=reason,
                                    retryable=error.retryable, hint=hint)
    details = [_pack(detail)]
    if field and code == grpc.StatusCode.INVALID_ARGUMENT:
        details.append(_pack(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=field, description=reason)])))
    message = f"{field}: {reason}" if field else reason
    if hint:
        message += f" ({hint})"
    status = status_pb2.Status(code=code.value[0], message=message, details=details)
    return code, message, (("grpc-status-details-bin", status.SerializeToString()),)


def error_detail(exc: grpc.RpcError) -> common_pb2.ErrorDetail | None:
    """The ErrorDetail a Mnemesh service attached to a failed call, if any."""
    status = rpc_status.from_call(exc) if hasattr(exc, "trailing_metadata") else None
    for packed in status.details if status else []:
        if packed.Is(common_pb2.ErrorDetail.DESCRIPTOR):
            detail = common_pb2.ErrorDetail()
            packed.Unpack(detail)
            return detail
    return None

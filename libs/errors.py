"""Structured, semantic errors: {error_type, field, reason, retryable, hint}.

Domain code raises these; each entry point maps them to its own surface (gRPC
rich status details, MCP tool errors, dead-letter reasons, CLI messages).
"""

from __future__ import annotations

from typing import ClassVar

__all__ = ["Busy", "Conflict", "DomainError", "NotFound", "PermissionDenied", "Unauthenticated", "Unavailable",
           "Unimplemented", "ValidationFailed", "DeadlineExceeded", "Internal"]


class DomainError(Exception):
    error_type: ClassVar[str] = "error"
    retryable: ClassVar[bool] = False

    def __init__(self, reason: str, *, field: str = "", hint: str = "", retryable: bool | None = None) -> None:
        super().__init__(f"{field}: {reason}" if field else reason)
        self.field, self.reason, self.hint = field, reason, hint
        if retryable is not None:
            self.retryable = retryable

    def to_dict(self) -> dict[str, object]:
        return {"error_type": self.error_type, "field": self.field, "reason": self.reason,
                "retryable": self.retryable, "hint": self.hint}


class ValidationFailed(DomainError):
    error_type = "validation"


class NotFound(DomainError):
    error_type = "not_found"


class Conflict(DomainError):
    error_type = "conflict"
    retryable = True


class IdempotencyKeyReused(DomainError):
    """A request under an idempotency key already used for a different request."""

    error_type = "idempotency_key_reused"
    retryable = False


class Unauthenticated(DomainError):
    error_type = "unauthenticated"


class PermissionDenied(DomainError):
    error_type = "permission_denied"


class Unavailable(DomainError):
    """A dependency (PostgreSQL, Redis, a backend) is unreachable; the same call may work later."""

    error_type = "unavailable"
    retryable = True


class Busy(Unavailable):
    """What the call needs is held, for a moment, by another operation (a forget under way): the same call
    succeeds shortly. Transient everywhere (libs/transient): retried, never dead-lettered."""


class Unimplemented(DomainError):
    error_type = "unimplemented"


class DeadlineExceeded(DomainError):
    error_type = "deadline_exceeded"
    retryable = True


class Internal(DomainError):
    """A bug or an unexpected failure; the message points to the log by trace id."""

    error_type = "internal"

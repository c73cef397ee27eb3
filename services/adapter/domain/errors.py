"""Backend failures as structured errors: SOAP faults, HTTP statuses, COM HRESULTs. No I/O here."""

from __future__ import annotations

from libs.errors import (
    DeadlineExceeded,
    DomainError,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)

__all__ = ["BackendFault", "BadResponse", "from_http_status", "from_soap_fault"]

# Fault codes (SOAP 1.1 / 1.2) that say the caller's request was at fault: retrying the same
# request cannot help. Server/Receiver faults may be transient.
_CALLER_CODES = ("client", "sender", "mustunderstand", "versionmismatch", "dataencodingunknown")


class BackendFault(DomainError):
    """The backend answered with a fault (SOAP fault, COM exception). `fault` keeps what it said."""

    error_type = "backend_fault"

    def __init__(self, reason: str, *, fault: dict, field: str = "", hint: str = "",
                 retryable: bool | None = None) -> None:
        super().__init__(reason, field=field, hint=hint, retryable=retryable)
        self.fault = fault


class BadResponse(DomainError):
    """The backend answered something that is not a valid response (not XML, wrong shape)."""

    error_type = "bad_response"


def _local(code: str) -> str:
    return code.rsplit("}", 1)[-1].rsplit(":", 1)[-1]


def from_soap_fault(*, code: str, message: str, actor: str = "", subcodes: tuple[str, ...] = (),
                    detail: object = None, declared: tuple[str, ...] = (), detail_name: str = "",
                    http_status: int = 0) -> BackendFault:
    """A SOAP fault as a structured error, keeping its code, subcodes, actor and detail."""
    local = _local(code or "").lower()
    caller = local.split(".")[0] in _CALLER_CODES
    # Which declared fault this is: the detail element, the code's last dotted part, or a subcode.
    candidates = [detail_name, _local(code or "").rsplit(".", 1)[-1], *(_local(s) for s in subcodes)]
    match = next((c for c in candidates if c and c in declared), "")
    fault = {"code": code or "", "subcodes": list(subcodes), "actor": actor or "", "detail": detail,
             "declared": match, "http_status": http_status}
    name = fault["declared"] or _local(code or "fault")
    if caller:
        hint = "the service refused these arguments: correct them using the reason and detail, do not retry as is"
    else:
        hint = "the service failed while handling the call; it may work if retried later"
    if fault["declared"]:
        hint = f"declared fault {fault['declared']} of this operation; " + hint
    return BackendFault(f"SOAP fault {name}: {message or '(no fault string)'}", fault=fault,
                        field="arguments" if caller else "", hint=hint, retryable=not caller)


def from_http_status(status: int, endpoint: str, body_start: str = "") -> DomainError:
    """An HTTP error without a SOAP fault in it."""
    snippet = f" ({body_start[:120]!r})" if body_start else ""
    if status == 401:
        return Unauthenticated(f"the endpoint {endpoint} refused the credentials (HTTP 401){snippet}",
                               hint="operators: check the backend's credentials in MNEMESH_ADAPTER_CREDENTIALS")
    if status == 403:
        return PermissionDenied(f"the endpoint {endpoint} forbids this call (HTTP 403){snippet}",
                                hint="the configured account lacks the right on the backend")
    if status == 404:
        return NotFound(f"the endpoint {endpoint} does not exist (HTTP 404)",
                        hint="the WSDL's soap:address may be stale: re-import it or set options.address")
    if status in (408, 504):
        return DeadlineExceeded(f"the endpoint {endpoint} timed out (HTTP {status})", hint="retry later")
    if status in (429, 502, 503) or status >= 500:
        return Unavailable(f"the endpoint {endpoint} is unavailable (HTTP {status}){snippet}",
                           hint="retry later with backoff")
    return BadResponse(f"the endpoint {endpoint} answered HTTP {status} without a SOAP envelope{snippet}",
                       hint="the request may not match what the service expects; check the endpoint")

"""The rules of one tool call, without I/O: who may call, what a call is, how results are cleaned.

The service layer (service_layer/pipeline.py) runs these in the pipeline's order; the ports
(rate limits, breakers, backends, the call log) do the I/O.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from typing import Any

from libs.auth import Principal
from libs.errors import DomainError, PermissionDenied
from services.tool_gateway.domain.registry import ToolSpec

__all__ = ["BackendFailed", "BackendFault", "CallOutcome", "CallRecord", "CallState", "CircuitOpen", "CleanResult", "RateLimited",
           "ToolCall", "args_sha256", "authorise", "backoff_seconds", "call_state", "clean_result",
           "error_detail", "is_call_id", "may_call", "may_have_happened", "step_uri"]

CALL_SCOPE = "tools:call"
# Fields backends add for machines that only cost an agent tokens (HAL, GraphQL, OData links).
NOISE_KEYS = frozenset({"_links", "_embedded", "__typename", "@odata.context", "@odata.etag", "odata.metadata"})


class RateLimited(DomainError):
    error_type = "rate_limited"
    retryable = True


class CircuitOpen(DomainError):
    error_type = "circuit_open"
    retryable = True


class BackendFailed(DomainError):
    """The backend answered with a failure (mapped: never its raw text alone)."""

    error_type = "backend_error"


class BackendFault(BackendFailed):
    """The backend answered with a fault of its own (a SOAP fault, a COM exception): `fault` keeps what it
    said (code, subcodes, actor, detail), next to the structured error an agent reads."""

    error_type = "backend_fault"

    def __init__(self, reason: str, *, fault: dict[str, Any], field: str = "", hint: str = "",
                 retryable: bool | None = None) -> None:
        super().__init__(reason, field=field, hint=hint, retryable=retryable)
        self.fault = fault


def error_detail(error: DomainError) -> dict[str, Any]:
    """The structured error an agent gets: {error_type, field, reason, retryable, hint}, plus the backend's
    `fault` when it sent one."""
    detail = error.to_dict()
    fault = getattr(error, "fault", None)
    if fault:
        detail["fault"] = fault
    return detail


@dataclass(frozen=True)
class ToolCall:
    """One call as the pipeline receives it, from MCP tools/call or gRPC CallTool."""

    name: str
    arguments: dict[str, Any]
    principal: Principal
    version: str = ""
    chain_id: str = ""
    deadline_seconds: float = 0.0  # 0: the tool's own timeout
    trace_id: str = ""
    context: str = ""  # the task kind the caller declares, for experience per context


@dataclass(frozen=True)
class CleanResult:
    value: dict[str, Any]  # what the caller gets (the preview when truncated)
    text: str  # compact JSON of `value`
    truncated: bool
    full_text: str  # compact JSON of the whole cleaned result


@dataclass(frozen=True)
class CallOutcome:
    call_id: str
    tool: str
    version: str
    result: CleanResult | None = None
    error: DomainError | None = None
    outcome: str = "ok"  # "ok", "error", "timeout", "fallback", "replayed", "cancelled"
    latency_ms: float = 0.0
    resource_uri: str = ""  # the full result, when truncated
    served_by: str = ""  # the tool that answered (a fallback's name when outcome == "fallback")
    attempts: int = 1
    has_output_schema: bool = False  # the called tool declares one (clients check results against it)
    replay_of: str = ""  # "replayed": the call of the chain whose kept result this is


@dataclass(frozen=True)
class CallRecord:
    """The audit row and the tool.called event of one call."""

    call_id: str
    tenant_id: str
    caller: str
    tool: str
    version: str
    args_sha256: str
    outcome: str
    error: dict[str, object] | None
    latency_ms: float
    trace_id: str
    context: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)  # successful calls: in the event, for experience
    served_by: str = ""
    attempts: int = 0
    chain_id: str = ""


def is_call_id(value: str) -> bool:
    """A call id as the gateway makes them (uuid4 hex: 32 lowercase hexadecimal characters)."""
    return len(value) == 32 and all(c in "0123456789abcdef" for c in value)


def step_uri(call_id: str) -> str:
    """Where a call's whole result is read (MCP resources/read) while it is kept."""
    return f"mem://step/{call_id}"


def may_call(spec: ToolSpec, principal: Principal) -> bool:
    """The caller needs tools:call and every scope the tool declares."""
    return principal.has_scope(CALL_SCOPE) and all(principal.has_scope(s) for s in spec.scopes)


def authorise(spec: ToolSpec, principal: Principal) -> None:
    if not principal.has_scope(CALL_SCOPE):
        raise PermissionDenied(f"the token lacks the scope {CALL_SCOPE!r}", field="authorization",
                               hint=f"ask for a token with scope {CALL_SCOPE}")
    missing = [s for s in spec.scopes if not principal.has_scope(s)]
    if missing:
        raise PermissionDenied(f"{spec.name} needs the scope {missing[0]!r}", field="authorization",
                               hint=f"ask for a token with scopes {', '.join(spec.scopes)}")


def args_sha256(arguments: dict[str, Any]) -> str:
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if v is not None and k not in NOISE_KEYS}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def clean_result(result: dict[str, Any], max_bytes: int) -> CleanResult:
    """Drop nulls and noise fields; past `max_bytes` of compact JSON keep a preview of that size.

    The preview is `{"truncated": true, "preview": "<the first bytes of the JSON>"}`; the caller
    gets a link to the whole result next to it.
    """
    cleaned = _strip(result)
    text = _compact(cleaned)
    encoded = text.encode()
    if len(encoded) <= max_bytes:
        return CleanResult(cleaned, text, False, text)
    preview = encoded[: max_bytes].decode(errors="ignore")
    value = {"truncated": True, "total_bytes": len(encoded), "preview": preview}
    return CleanResult(value, _compact(value), True, text)


def backoff_seconds(attempt: int, *, base: float = 0.05, cap: float = 2.0, rng: random.Random | None = None) -> float:
    """Exponential backoff with full jitter before retry number `attempt` (1, 2, ...)."""
    ceiling = min(cap, base * (2 ** (attempt - 1)))
    return (rng or random).uniform(0, ceiling)


@dataclass(frozen=True)
class CallState:
    """What GetCall answers: "done" (with the result while it is kept), "failed", "running" or "unknown".

    "unknown" also answers a call that timed out and whose operation may have happened (its status tool
    said it is still running, or could not say: the audit row's error is not retryable): the caller must
    not call again, but ask the status tool. "failed" is only said of a call that did not happen."""

    state: str
    record: CallRecord | None = None
    result: dict[str, Any] | None = None


def call_state(record: CallRecord | None, running: bool, result_text: str | None) -> CallState:
    if record is None:
        return CallState("running" if running else "unknown")
    if record.outcome in ("ok", "fallback", "replayed"):
        return CallState("done", record, json.loads(result_text) if result_text else None)
    if may_have_happened(record):
        return CallState("unknown", record)
    return CallState("failed", record)


def may_have_happened(record: CallRecord) -> bool:
    """A timed-out call the gateway answered as not to be retried: its operation may have happened."""
    return record.outcome == "timeout" and bool(record.error) and record.error.get("retryable") is False

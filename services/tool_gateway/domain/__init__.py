from services.tool_gateway.domain.calls import (
    BackendFailed,
    BackendFault,
    CallOutcome,
    CallRecord,
    CircuitOpen,
    CleanResult,
    RateLimited,
    ToolCall,
    args_sha256,
    authorise,
    backoff_seconds,
    clean_result,
    error_detail,
    may_call,
)
from services.tool_gateway.domain.registry import (
    ToolSpec,
    current_versions,
    validate_arguments,
    validate_spec,
)

__all__ = ["BackendFailed", "BackendFault", "CallOutcome", "CallRecord", "CircuitOpen", "CleanResult", "RateLimited",
           "ToolCall", "ToolSpec", "args_sha256", "authorise", "backoff_seconds", "clean_result", "current_versions",
           "error_detail", "may_call", "validate_arguments", "validate_spec"]

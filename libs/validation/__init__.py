"""Input rules shared by every entry point (gRPC requests, stream commands, MCP): one rule in one place."""

from libs.validation._messages import LIMITS, Limit, check_items, check_message
from libs.validation._rules import (
    MAX_TERM_CHARS,
    QUOTE_CHARS,
    SESSION_ID,
    TENANT_ID,
    TENANT_ID_RULE,
    TIMESTAMP_RANGE,
    canonical_uuid,
    check_content,
    check_finite,
    check_identifier,
    check_session_id,
    check_tenant_id,
    check_text,
    check_timestamp,
    check_uuid,
    is_tenant_id,
    quote,
    shows_something,
    visible,
)

__all__ = ["LIMITS", "MAX_TERM_CHARS", "QUOTE_CHARS", "SESSION_ID", "TENANT_ID", "TENANT_ID_RULE", "TIMESTAMP_RANGE",
           "Limit", "canonical_uuid", "check_content", "check_finite", "check_identifier", "check_items",
           "check_message", "check_session_id", "check_tenant_id", "check_text", "check_timestamp",
           "check_uuid", "is_tenant_id", "quote", "shows_something", "visible"]

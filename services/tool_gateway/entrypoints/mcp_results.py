"""A call's outcome as the MCP tool result its caller reads. Translate only.

- a result: structuredContent plus the same compact JSON as text; a truncated one adds where the whole
  result is read (`mem://step/<call_id>`): a resource_link block, or a text block naming it for a caller on
  a revision before resource links (2024-11-05, 2025-03-26), whose client cannot parse one;
- a refusal or failure: `isError`, the structured error `{error_type, field, reason, retryable, hint}` as
  JSON text, and as structuredContent too when the tool declares no output schema. Structured content must
  conform to a declared output schema (MCP 2025-06-18), and clients check it even on an error (the
  TypeScript SDK 1.x throws instead of handing the error to the agent), so such a tool's errors are text
  only; so is the `result_too_large` error of its truncated results, whose preview cannot match the schema.
"""

from __future__ import annotations

import json

import mcp_types as types
from pydantic import TypeAdapter

from libs.errors import DomainError
from services.tool_gateway.domain import CallOutcome, error_detail
from services.tool_gateway.domain.content import media_blocks

__all__ = ["LINKLESS_REVISIONS", "REPLAY_OF_META", "error_result", "outcome_result"]

REPLAY_OF_META = "mnemesh/replay_of"  # in a result's _meta: the chain's call whose kept result this is
LINKLESS_REVISIONS = frozenset({"2024-11-05", "2025-03-26"})  # no resource_link content blocks yet
_CONTENT = TypeAdapter(list[types.ContentBlock])


def error_result(error: DomainError, has_output_schema: bool = False) -> types.CallToolResult:
    """A refusal or failure as a tool error: the structured error (with the backend's own fault, when it sent one)
    as JSON text, and as structuredContent too unless the tool declares an output schema. Structured content
    must conform to that schema (MCP 2025-06-18), and clients check it even on an error: the TypeScript SDK 1.x
    throws instead of handing the error to the agent."""
    detail = error_detail(error)
    return types.CallToolResult(content=[types.TextContent(text=json.dumps(detail, ensure_ascii=False))],
                                structured_content=None if has_output_schema else detail, is_error=True)


def _whole_result_link(outcome: CallOutcome, version: str) -> types.ContentBlock:
    """Where a truncated result is read whole: a resource_link block, or a text block for a caller on a revision
    without them (resource_link came with 2025-06-18; older clients cannot parse a result carrying one)."""
    if version in LINKLESS_REVISIONS:
        return types.TextContent(text=f"the whole result is the resource {outcome.resource_uri}; "
                                      "read it with resources/read")
    return types.ResourceLink(uri=outcome.resource_uri, name=f"result of {outcome.tool}",
                              mime_type="application/json", description="the whole result; this answer was truncated")


def outcome_result(outcome: CallOutcome, version: str = "") -> types.CallToolResult:
    """A pipeline outcome as an MCP tool result, for a caller on protocol revision `version`."""
    if outcome.error is not None:
        return error_result(outcome.error, outcome.has_output_schema)
    result = outcome.result
    assert result is not None
    content: list[types.ContentBlock] = [types.TextContent(text=result.text)]
    if outcome.resource_uri:
        content.append(_whole_result_link(outcome, version))
        if outcome.has_output_schema:
            # A preview cannot match the tool's output schema, which clients check: say so instead, as an error
            # that carries no structured content (error_result).
            detail = {"error_type": "result_too_large", "field": "", "retryable": False,
                      "reason": f"the result ({result.value.get('total_bytes')} bytes) is over the gateway's cap",
                      "hint": f"read the whole result as the resource {outcome.resource_uri}"}
            return types.CallToolResult(content=[types.TextContent(text=json.dumps(detail)), content[1]],
                                        is_error=True)
    blocks = media_blocks(result.value) if not outcome.resource_uri else None
    if blocks is not None:  # an upstream's images, audio or embedded resources: answered as themselves
        return types.CallToolResult(content=_CONTENT.validate_python(blocks), is_error=False)
    answer = types.CallToolResult(content=content, structured_content=result.value, is_error=False)
    if outcome.replay_of:
        answer.meta = {REPLAY_OF_META: outcome.replay_of}
    return answer

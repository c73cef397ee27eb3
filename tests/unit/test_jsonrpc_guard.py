"""Which JSON-RPC envelopes the MCP endpoint lets through to the SDK, and what the others are told."""

from __future__ import annotations

import pytest

from services.tool_gateway.entrypoints.jsonrpc_guard import envelope_problem


@pytest.mark.parametrize("message", [
    {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
    {"jsonrpc": "2.0", "id": "a", "method": "tools/list", "params": {}},
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 7, "result": {}},
    {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "parse error"}},
])
def test_well_formed_messages_pass(message: dict) -> None:
    assert envelope_problem(message) is None


@pytest.mark.parametrize(("message", "words"), [
    ({"jsonrpc": "2.0", "id": {"a": 1}, "method": "tools/list"}, "id must be a string or an integer"),
    ({"jsonrpc": "2.0", "id": [1], "method": "tools/list"}, "id must be"),
    ({"jsonrpc": "2.0", "id": True, "method": "tools/list"}, "id must be"),
    ({"jsonrpc": "2.0", "id": None, "method": "tools/list"}, "id must be"),
    ({"jsonrpc": "2.0", "id": 1.5, "method": "tools/list"}, "id must be"),
    ({"jsonrpc": "2.0", "id": 1, "method": 5}, "method must be a string"),
    ({"id": 1, "method": "tools/list"}, '"jsonrpc": "2.0"'),
    ({"jsonrpc": "2.0", "id": {}, "result": {}}, "id of a response"),
    ({"jsonrpc": "2.0", "id": 1}, "must have a method"),
    ([{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}], "batches are not supported"),
    ("tools/list", "a JSON object"),
])
def test_malformed_messages_are_told_what_to_fix(message: object, words: str) -> None:
    assert words in envelope_problem(message)

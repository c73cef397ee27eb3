"""The tool.called payload printed without protobuf's printer is the message protobuf would print: byte for
byte when the arguments' order is kept, and the same message after parsing in every case; a record the
printer would treat otherwise goes through the message as before."""

from __future__ import annotations

import json

import pytest
from google.protobuf import json_format

from libs.protogen.mnemesh.v1 import events_pb2
from services.tool_gateway.adapters.postgres import _called_event, _called_json, _called_message
from services.tool_gateway.domain import CallRecord

BASE = CallRecord(call_id="0" * 32, tenant_id="acme", caller="agent-1", tool="crm.lookup", version="1.0.0",
                  args_sha256="a" * 64, outcome="ok", error=None, latency_ms=12.345, trace_id="t")
ERROR = {"error_type": "unavailable", "field": "", "reason": "down — ünïcode \"quoted\"", "retryable": True,
         "hint": "retry"}
CASES = [
    BASE,
    BASE.__class__(**{**BASE.__dict__, "tenant_id": "", "latency_ms": 0.0, "outcome": ""}),
    BASE.__class__(**{**BASE.__dict__, "error": ERROR, "outcome": "error", "attempts": 3}),
    BASE.__class__(**{**BASE.__dict__, "error": {**ERROR, "retryable": False, "hint": ""}}),
    BASE.__class__(**{**BASE.__dict__, "context": "refunds", "served_by": "crm.backup", "attempts": 1,
                      "latency_ms": 7, "arguments": {"id": "c-1", "n": 2, "big": 12345678901234567891,
                                                     "f": 0.1, "ok": True, "none": None,
                                                     "list": [1, "x", [False, {"deep": 1e300}]],
                                                     "tuple": (1, 2), "ü": "é\n"}}),
]


@pytest.mark.parametrize("record", CASES)
def test_the_payload_is_what_protobufs_printer_prints(record: CallRecord) -> None:
    printed = json_format.MessageToJson(_called_message(record), indent=None)
    fast = _called_json(record)
    assert json.loads(fast) == json.loads(printed)
    assert json_format.Parse(fast, events_pb2.ToolCalled()) == json_format.Parse(printed, events_pb2.ToolCalled())
    if len(record.arguments) <= 1:  # one key or none: nothing whose order protobuf's map may change
        assert fast == printed


@pytest.mark.parametrize("arguments", [{"x": float("nan")}, {"x": float("inf")}, {"x": 10**400}, {1: "a"},
                                       {"x": {1, 2}}])
def test_a_value_protobuf_would_treat_otherwise_takes_the_messages_way(arguments: dict) -> None:
    record = BASE.__class__(**{**BASE.__dict__, "arguments": arguments})
    with pytest.raises((TypeError, ValueError, OverflowError)):
        _called_json(record)
    try:
        expected = json_format.MessageToJson(_called_message(record), indent=None)
    except Exception as exc:  # noqa: BLE001 - protobuf refuses it: so does the event, as before
        with pytest.raises(type(exc)):
            _called_event(record)
        return
    assert _called_event(record).payload == expected


def test_the_event_carries_the_printed_payload() -> None:
    envelope = _called_event(CASES[2])
    assert envelope.event_type == "tool.called" and envelope.tenant_id == "acme"
    assert envelope.payload == json_format.MessageToJson(_called_message(CASES[2]), indent=None)

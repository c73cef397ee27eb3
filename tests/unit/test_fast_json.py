"""libs/events/fast_json.py: the plain payloads read exactly as json_format reads them, the rest left to it."""

from __future__ import annotations

import json

import pytest
from google.protobuf import json_format, struct_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.events import Envelope, MalformedEvent
from libs.events.fast_json import parse_plain
from libs.protogen.mnemesh.v1 import common_pb2, events_pb2, memory_pb2

# Names a payload may use (JSON names, field names, unknown ones) and values of every JSON kind.
_NAMES = st.sampled_from(["tenant", "tenantId", "tenant_id", "userId", "user_id", "sessionId", "layer", "source",
                          "content", "key", "confidence", "tags", "derivedFrom", "derived_from", "stepId",
                          "expiresAt", "idempotencyKey", "attributes", "memoryIds", "reason", "version",
                          "memory", "mergedCount", "engagement", "nope", "[ext]", "latencyMs", "latency_ms",
                          "arguments", "outcome", "attempts", "error", "errorType", "retryable"])
_SCALARS = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8)
            | st.sampled_from(["MEMORY_LAYER_LONG_TERM", "SOURCE_KIND_USER_STATEMENT", "CONFIDENCE_CONFIRMED",
                               "\ud800", "a\udc00b", "1", "2024-01-01T00:00:00Z", "x y"]))
_JSON = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_NAMES, inner, max_size=4),
                     max_leaves=12)
_MESSAGES = [memory_pb2.WriteMemoryRequest, events_pb2.MemoryForgotten, events_pb2.MemoryWritten,
             events_pb2.MemoryMerged, common_pb2.TenantContext, events_pb2.ToolCalled]


def _struct(values: dict) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(values)
    return struct


def _reference(payload: str, cls):
    try:
        return json_format.Parse(payload, cls())
    except json_format.ParseError:
        return None


@settings(max_examples=600, deadline=None)
@given(st.dictionaries(_NAMES, _JSON, max_size=6), st.sampled_from(_MESSAGES))
def test_what_it_reads_json_format_reads_the_same(js, cls):
    payload = json.dumps(js)
    fast = parse_plain(payload, cls())
    if fast is not None:
        assert fast == _reference(payload, cls)


@settings(max_examples=300, deadline=None)
@given(st.builds(memory_pb2.WriteMemoryRequest,
                 tenant=st.builds(common_pb2.TenantContext, tenant_id=st.text(max_size=5), user_id=st.text(max_size=5),
                                  session_id=st.text(max_size=5)),
                 layer=st.sampled_from([0, 1, 2, 3]), source=st.sampled_from([0, 1, 2]), content=st.text(max_size=20),
                 key=st.text(max_size=5), tags=st.lists(st.text(max_size=4), max_size=3),
                 derived_from=st.lists(st.text(max_size=4), max_size=2), idempotency_key=st.text(max_size=6)))
def test_a_producers_command_takes_the_fast_path(request):
    """What a producer prints from a message (no timestamp, no attributes) is read without json_format."""
    for payload in (json_format.MessageToJson(request, indent=None),
                    json_format.MessageToJson(request, indent=None, preserving_proto_field_name=True)):
        assert parse_plain(payload, memory_pb2.WriteMemoryRequest()) == request


@settings(max_examples=300, deadline=None)
@given(st.builds(events_pb2.ToolCalled, tool=st.text(max_size=6), outcome=st.sampled_from(["ok", "error"]),
                 latency_ms=st.floats(allow_nan=False, allow_infinity=False), attempts=st.integers(0, 5),
                 arguments=st.dictionaries(st.text(max_size=4), st.none() | st.booleans() | st.text(max_size=4)
                                           | st.floats(allow_nan=False, allow_infinity=False)
                                           | st.integers(-2**60, 2**60), max_size=4).map(_struct)))
def test_a_tool_event_with_its_latency_and_arguments_takes_the_fast_path(event):
    payload = json_format.MessageToJson(event, indent=None)
    assert parse_plain(payload, events_pb2.ToolCalled()) == event == _reference(payload, events_pb2.ToolCalled)


@pytest.mark.parametrize("payload", [
    '{"content": "a", "content": "b"}',  # a repeated key
    '{"tenant": {"userId": "u", "user_id": "v"}}',  # one field under two names
    '{"layer": "MEMORY_LAYER_NOPE"}', '{"layer": 99}', '{"layer": 1.0}', '{"layer": true}',
    '{"content": 3}', '{"content": null}', '{"content": "\\ud800"}', '{"tags": "a"}', '{"tags": [null]}',
    '{"expiresAt": "2024-01-01T00:00:00Z"}', '{"attributes": []}', '{"nope": 1}', '{"tenant": []}',
    '{"confidence": "1"}', '{"content": "a"',
])
def test_anything_not_plain_is_left_to_json_format(payload):
    assert parse_plain(payload, memory_pb2.WriteMemoryRequest()) is None


@pytest.mark.parametrize("payload", ['{"layer": "MEMORY_LAYER_NOPE"}', '{"content": 3}', '{"content": "a", "content": "b"}',
                                     '{"tags": [null]}', '{"nope": 1}'])
def test_a_bad_command_gets_json_formats_error(payload):
    envelope = Envelope.wrap_json(payload, event_type="memory.write_requested", tenant_id="t1")
    with pytest.raises(MalformedEvent) as caught:
        envelope.message()
    with pytest.raises(json_format.ParseError) as reference:
        json_format.Parse(payload, memory_pb2.WriteMemoryRequest())
    assert caught.value.field == "payload"
    assert caught.value.reason == f"not a valid WriteMemoryRequest: {reference.value}"

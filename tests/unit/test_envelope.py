"""The stream event envelope: wrapping, the Redis field form, and refusing malformed entries."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from libs.events import EVENT_TYPES, Envelope, MalformedEvent
from libs.events.schema import MEMORY_EVENTS, SESSION_EVENTS
from libs.protogen.mnemesh.v1 import common_pb2, events_pb2


def forgotten() -> events_pb2.MemoryForgotten:
    return events_pb2.MemoryForgotten(tenant=common_pb2.TenantContext(tenant_id="acme", user_id="u1"),
                                      memory_ids=["m1", "m2"], reason="forget requested")


def good_fields() -> dict[str, str]:
    return Envelope.wrap(forgotten(), event_type="memory.forgotten", tenant_id="acme").to_fields()


def test_an_envelope_survives_the_round_trip_through_stream_fields() -> None:
    envelope = Envelope.wrap(forgotten(), event_type="memory.forgotten", tenant_id="acme", correlation_id="c-1")

    fields = envelope.to_fields()
    back = Envelope.from_fields(fields)

    assert all(isinstance(v, str) for v in fields.values())
    assert back == envelope
    assert back.message() == forgotten()
    assert back.stream == MEMORY_EVENTS


def test_a_wrapped_event_starts_its_own_correlation_and_carries_the_schema_version() -> None:
    envelope = Envelope.wrap(forgotten(), event_type="memory.forgotten", tenant_id="acme")
    assert uuid.UUID(envelope.event_id)
    assert envelope.correlation_id == envelope.event_id
    assert envelope.causation_id == ""
    assert envelope.schema_version == EVENT_TYPES["memory.forgotten"].version
    assert envelope.occurred_at.tzinfo is not None


def test_an_event_caused_by_another_inherits_its_correlation_and_names_its_cause() -> None:
    cause = Envelope.wrap(forgotten(), event_type="memory.forgotten", tenant_id="acme", correlation_id="c-1")
    message = events_pb2.SessionMessageAppended(device_id="web-1", role="user", text="hi")
    effect = Envelope.wrap(message, event_type="session.message_appended", tenant_id="acme", causation=cause)
    assert (effect.correlation_id, effect.causation_id) == ("c-1", cause.event_id)
    assert effect.stream == SESSION_EVENTS


def test_wrapping_a_message_of_the_wrong_type_is_a_programming_error() -> None:
    with pytest.raises(TypeError, match="MemoryForgotten"):
        Envelope.wrap(events_pb2.ToolCalled(), event_type="memory.forgotten", tenant_id="acme")


def test_a_timestamp_without_a_zone_is_read_as_utc() -> None:
    fields = {**good_fields(), "occurred_at": "2025-03-01T12:00:00"}
    assert Envelope.from_fields(fields).occurred_at == datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def test_optional_fields_may_be_absent() -> None:
    fields = good_fields()
    for name in ("correlation_id", "causation_id", "traceparent"):
        del fields[name]
    envelope = Envelope.from_fields(fields)
    assert (envelope.correlation_id, envelope.causation_id, envelope.traceparent) == ("", "", "")


@pytest.mark.parametrize("name", ["event_id", "event_type", "schema_version", "tenant_id", "occurred_at", "payload"])
@pytest.mark.parametrize("how", ["missing", "empty"])
def test_an_entry_missing_a_required_field_is_malformed_naming_it(name: str, how: str) -> None:
    fields = good_fields()
    if how == "missing":
        del fields[name]
    else:
        fields[name] = ""
    with pytest.raises(MalformedEvent) as err:
        Envelope.from_fields(fields)
    assert err.value.field == name
    assert err.value.error_type == "malformed_event"


@pytest.mark.parametrize(("name", "value", "words"), [
    ("event_type", "memory.exploded", "unknown event type"),
    ("schema_version", "one", "integer"),
    ("schema_version", "0", "1 or more"),
    ("occurred_at", "yesterday", "ISO 8601"),
    ("event_id", "not-a-uuid", "UUID"),
    ("payload", '{"memoryIds": "not a list", "noSuchField": 1}', "MemoryForgotten"),
    ("payload", "this is not json", "MemoryForgotten"),
])
def test_an_entry_with_a_bad_field_is_malformed_naming_it(name: str, value: str, words: str) -> None:
    fields = {**good_fields(), name: value}
    with pytest.raises(MalformedEvent) as err:
        Envelope.from_fields(fields)
    assert err.value.field == name
    assert words in err.value.reason


def test_a_payload_of_another_event_type_is_malformed() -> None:
    tool_called = Envelope.wrap(events_pb2.ToolCalled(call_id="c1", tool="crm.get", outcome="ok"),
                                event_type="tool.called", tenant_id="acme")
    fields = {**good_fields(), "payload": tool_called.payload}
    with pytest.raises(MalformedEvent) as err:
        Envelope.from_fields(fields)
    assert err.value.field == "payload"

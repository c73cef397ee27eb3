"""The shared input rules (libs/validation): one rule per kind of field, applied to whole requests."""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pool, struct_pb2
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.errors import ValidationFailed
from libs.protogen.mnemesh.v1 import common_pb2, memory_pb2, sessions_pb2, tools_pb2
from libs.validation import (
    LIMITS,
    check_content,
    check_items,
    check_message,
    check_tenant_id,
    check_text,
    check_uuid,
    quote,
    visible,
)

REQUESTS = [memory_pb2.WriteMemoryRequest, memory_pb2.WriteBatchRequest, memory_pb2.CorrectRequest,
            memory_pb2.ConfirmRequest, memory_pb2.HistoryRequest, memory_pb2.RegisterEntitySchemaRequest,
            memory_pb2.SetTenantPolicyRequest, memory_pb2.GetTenantPolicyRequest,
            memory_pb2.ListQuarantineRequest, memory_pb2.ReleaseRequest, memory_pb2.DropQuarantinedRequest,
            memory_pb2.CompressSessionRequest,
            memory_pb2.GetMemoryRequest, memory_pb2.ForgetRequest, memory_pb2.ForgetTenantRequest, memory_pb2.RotateTenantKeyRequest,
            memory_pb2.SearchRequest, memory_pb2.QueryRequest, memory_pb2.RebuildIndexRequest, sessions_pb2.SendRequest, sessions_pb2.SubscribeRequest,
            sessions_pb2.GetSessionRequest, tools_pb2.RegisterToolRequest, tools_pb2.ListToolsRequest,
            tools_pb2.CallToolRequest, tools_pb2.ListBackendsRequest, tools_pb2.InvokeRequest,
            tools_pb2.ImportWsdlRequest, tools_pb2.DescribeRequest, tools_pb2.DropRequest,
            tools_pb2.RemoveToolRequest, tools_pb2.GetCallRequest, tools_pb2.GetTaskRequest, tools_pb2.CancelTaskRequest, tools_pb2.ListTasksRequest,
            tools_pb2.ToolStatsRequest,
            tools_pb2.SetCanaryRequest, tools_pb2.PromoteRequest, tools_pb2.RollbackRequest,
            tools_pb2.AddUpstreamRequest, tools_pb2.RemoveUpstreamRequest, tools_pb2.ListUpstreamsRequest]
_WELL_KNOWN = ("google.protobuf.Timestamp", "google.protobuf.Struct")


def _messages_reachable(descriptor, seen: set[str]) -> None:
    if descriptor.full_name in seen or descriptor.full_name in _WELL_KNOWN:
        return
    seen.add(descriptor.full_name)
    for fd in descriptor.fields:
        if fd.message_type is not None:
            _messages_reachable(fd.message_type, seen)


def test_every_request_of_every_service_is_a_listed_request() -> None:
    inputs = {method.input_type.full_name for module in (memory_pb2, sessions_pb2, tools_pb2)
              for service in module.DESCRIPTOR.services_by_name.values() for method in service.methods}
    assert inputs == {r.DESCRIPTOR.full_name for r in REQUESTS}


def test_every_string_repeated_and_object_field_a_request_can_carry_has_a_stated_limit() -> None:
    seen: set[str] = set()
    for request in REQUESTS:
        _messages_reachable(request.DESCRIPTOR, seen)
    missing = []
    for name in sorted(seen):
        descriptor = descriptor_pool.Default().FindMessageTypeByName(name)
        for fd in descriptor.fields:
            needs = (fd.type == FieldDescriptor.TYPE_STRING or fd.is_repeated
                     or (fd.message_type is not None and fd.message_type.full_name == "google.protobuf.Struct"))
            if needs and fd.name not in LIMITS.get(name, {}):
                missing.append(f"{name}.{fd.name}")
    assert missing == []


def test_quoting_escapes_and_cuts_what_was_sent() -> None:
    assert quote("a\x00b") == "'a\\x00b'"
    long = quote("x" * 9_000)
    assert len(long) < 80 and "9000 characters" in long


@given(st.text(max_size=3_000))
@settings(max_examples=200, deadline=None)
def test_any_text_is_accepted_or_refused_naming_the_field_with_a_bounded_reason(value: str) -> None:
    try:
        check_content(value, "content", 2_000)
    except ValidationFailed as exc:
        assert exc.field == "content" and len(exc.reason) < 200
    else:
        assert "\x00" not in value and visible(value) and len(value) <= 2_000


@pytest.mark.parametrize("value", ["", "\u200b", "\ufeff\u200b\u2060", " \u3164 ", "\u00a0\u2028"])
def test_text_that_shows_nothing_is_empty(value: str) -> None:
    with pytest.raises(ValidationFailed, match="must not be empty"):
        check_content(value, "content", 100)


def test_a_word_too_long_to_index_is_refused_and_normal_text_is_not() -> None:
    with pytest.raises(ValidationFailed, match="word of 15000 characters"):
        check_content("x" * 15_000, "content", 16_000)
    assert check_content("Zhang San lives in 上海市浦东新区" * 100, "content", 16_000)


@pytest.mark.parametrize("value", ["evil tenant/..", "a" * 65, "t\x00", "ténant"])
def test_the_tenant_rule_refuses_what_no_token_can_hold(value: str) -> None:
    with pytest.raises(ValidationFailed) as err:
        check_tenant_id(value, "tenant_id")
    assert err.value.field == "tenant_id" and len(err.value.reason) < 150


def test_ids_must_be_uuids_and_come_back_canonical() -> None:
    assert check_uuid("0B6F2C1E-4A53-4C1E-9A51-6AD3C3F1B2AA", "memory_id") == "0b6f2c1e-4a53-4c1e-9a51-6ad3c3f1b2aa"
    with pytest.raises(ValidationFailed) as err:
        check_uuid("z" * 9_000, "memory_id")
    assert err.value.field == "memory_id" and len(err.value.reason) < 120


def test_nul_and_lone_surrogates_are_refused_in_text() -> None:
    for value in ("a\x00b", "a\ud800b"):
        with pytest.raises(ValidationFailed):
            check_text(value, "key", 100)


@pytest.mark.parametrize(("request_", "field"), [
    (memory_pb2.WriteMemoryRequest(key="k\x00"), "key"),
    (memory_pb2.WriteMemoryRequest(tags=["ok", "t\x00"]), "tags[1]"),
    (memory_pb2.WriteMemoryRequest(tenant=common_pb2.TenantContext(user_id="u" * 129)), "tenant.user_id"),
    (memory_pb2.WriteMemoryRequest(idempotency_key="k" * 10_000), "idempotency_key"),
    (memory_pb2.WriteMemoryRequest(layer=99), "layer"),
    (memory_pb2.WriteMemoryRequest(content="\u200b"), "content"),
    (memory_pb2.GetMemoryRequest(memory_id="1" * 9_000), "memory_id"),
    (memory_pb2.SearchRequest(layers=[1, 99]), "layers[1]"),
    (memory_pb2.SearchRequest(min_confidence=99), "min_confidence"),
    (tools_pb2.CallToolRequest(deadline_seconds=float("nan")), "deadline_seconds"),
    (sessions_pb2.SendRequest(session_id="../x"), "session_id"),
])
def test_a_request_breaking_a_rule_is_refused_naming_its_field(request_, field: str) -> None:
    with pytest.raises(ValidationFailed) as err:
        check_message(request_)
    assert err.value.field == field


def test_timestamps_out_of_range_are_refused() -> None:
    for seconds, nanos in ((2**62, 0), (0, -1), (-(2**40), 0)):
        request = memory_pb2.SearchRequest()
        request.since.seconds, request.since.nanos = seconds, nanos
        with pytest.raises(ValidationFailed) as err:
            check_message(request)
        assert err.value.field == "since"


def test_objects_are_bounded_in_depth_and_hold_no_nul_or_nan() -> None:
    deep: dict = {}
    node = deep
    for _ in range(30):
        node["a"] = {}
        node = node["a"]
    for value, expected in ((deep, "nests deeper"), ({"k": "v\x00"}, "NUL"), ({"k\x00": 1}, "NUL"),
                            ({"n": float("inf")}, "finite")):
        attributes = struct_pb2.Struct()
        attributes.update(value)
        with pytest.raises(ValidationFailed, match=expected) as err:
            check_message(memory_pb2.WriteMemoryRequest(attributes=attributes))
        assert err.value.field.startswith("attributes")


def test_a_good_request_passes() -> None:
    attributes = struct_pb2.Struct()
    attributes.update({"city": "上海", "n": 3, "list": [1, "a", {"b": None}]})
    check_message(memory_pb2.WriteMemoryRequest(
        tenant=common_pb2.TenantContext(tenant_id="acme", user_id="u1", session_id="s-1"), content="likes tea",
        key="user.drink", tags=["prefs"], attributes=attributes, layer=5, source=2))


def test_map_fields_are_checked_by_their_entry_limits() -> None:
    request = tools_pb2.ImportWsdlRequest(backend_id="billing", document=b"<x/>")
    request.documents["file:///a.xsd"] = b"<a/>"
    request.options.operations["GetCustomer"].timeout_seconds = 5
    check_message(request)
    request.documents["x" * 3_000] = b""
    with pytest.raises(ValidationFailed) as err:
        check_message(request)
    assert err.value.field.startswith("documents[") and err.value.field.endswith(" key")


UPPER_ID = "0B6F2C1E-4A53-4C1E-9A51-6AD3C3F1B2AA"


@pytest.mark.parametrize("request_", [
    memory_pb2.GetMemoryRequest(memory_id=UPPER_ID), memory_pb2.ForgetRequest(memory_id=UPPER_ID),
    memory_pb2.ConfirmRequest(memory_id=UPPER_ID), memory_pb2.ReleaseRequest(memory_id=UPPER_ID),
    memory_pb2.DropQuarantinedRequest(memory_id=UPPER_ID),
])
def test_the_edge_check_leaves_a_memory_id_in_the_one_form_the_store_compares(request_) -> None:
    check_message(request_)
    assert request_.memory_id == UPPER_ID.lower()


def test_an_empty_id_is_said_to_be_required_not_to_be_no_uuid() -> None:
    with pytest.raises(ValidationFailed) as err:
        check_uuid("", "memory_id")
    assert (err.value.field, err.value.reason) == ("memory_id", "is required")
    assert "0b6f2c1e" in err.value.hint


def _write(content: str, **fields) -> memory_pb2.WriteMemoryRequest:
    fields = {"layer": 5, "source": 2, "tenant": common_pb2.TenantContext(user_id="u1"), **fields}
    return memory_pb2.WriteMemoryRequest(content=content, **fields)


def test_a_batch_is_checked_for_its_count_and_each_write_on_its_own() -> None:
    writes = [_write("fine"), _write("nul \x00"), _write("bad layer", layer=99), _write("long " + "a" * 300),
              memory_pb2.WriteMemoryRequest(tenant=common_pb2.TenantContext(user_id="u" * 129), content="x"),
              _write("\u200b"), _write("fine too")]
    batch = memory_pb2.WriteBatchRequest(writes=writes)
    check_message(batch)  # a bad write is not the call's problem
    errors = check_items(batch.writes)
    assert [e.field if e else None for e in errors] == [None, "content", "layer", "content", "tenant.user_id",
                                                       "content", None]
    assert errors[1].reason == "contains a NUL character at position 4"
    with pytest.raises(ValidationFailed) as err:
        check_message(memory_pb2.WriteBatchRequest(writes=[_write("x")] * 501))
    assert err.value.field == "writes" and "limit is 500" in err.value.reason


@pytest.mark.parametrize("value", ["\u0301\u0301", "\ufe0f", " \u0301 \ufe0f\u200b", "\U000e0100", "\u20dd"])
def test_marks_and_variation_selectors_alone_show_nothing(value: str) -> None:
    with pytest.raises(ValidationFailed, match="must not be empty") as err:
        check_content(value, "content", 100)
    assert "combining marks" in err.value.hint


@pytest.mark.parametrize("value", ["e\u0301", "\u2764\ufe0f", "\u0915\u093e", "\u0e01\u0e34"])
def test_marks_on_a_character_are_text(value: str) -> None:
    assert check_content(value, "content", 100) == value

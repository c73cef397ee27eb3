"""Schema validation that cannot run away: every regular expression is matched by RE2."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from libs.errors import ValidationFailed
from libs.safe_schema import SafeValidator, check_schema
from services.tool_gateway.domain import ToolSpec, validate_arguments, validate_spec

EVIL = "^(a+)+$"
ATTACK = "a" * 27 + "!"  # about 5 s with Python's re; each extra "a" doubles it
SPEC = ToolSpec(name="crm.lookup", description="Look up a customer by a code.",
                input_schema={"type": "object", "properties": {"code": {"type": "string", "pattern": EVIL}}})


def errors(schema: dict, instance: object) -> list[str]:
    check_schema(schema)
    return [e.message for e in SafeValidator(schema).iter_errors(instance)]


def test_a_catastrophic_pattern_in_an_example_is_checked_in_linear_time() -> None:
    started = time.perf_counter()
    with pytest.raises(ValidationFailed) as err:
        validate_spec(replace(SPEC, examples=({"arguments": {"code": ATTACK + "a" * 10_000}},)))
    assert time.perf_counter() - started < 0.5
    assert err.value.field == "examples[0]" and "code" in err.value.reason


@pytest.mark.parametrize(("schema", "refused"), [
    ({"type": "object", "patternProperties": {EVIL: {"type": "integer"}}}, False),
    ({"type": "object", "patternProperties": {EVIL: True}, "additionalProperties": False}, True),
    ({"type": "object", "patternProperties": {EVIL: True}, "unevaluatedProperties": False}, True),
    ({"type": "object", "allOf": [{"patternProperties": {EVIL: True}}], "unevaluatedProperties": False}, True),
])
def test_property_names_are_matched_in_linear_time_by_every_keyword_that_matches_them(schema: dict,
                                                                                      refused: bool) -> None:
    started = time.perf_counter()
    found = errors(schema, {ATTACK * 4: "x"})  # the name matches no pattern
    assert time.perf_counter() - started < 0.5
    assert bool(found) == refused


def test_patterns_keep_their_meaning() -> None:
    schema = {"type": "object", "properties": {"phone": {"type": "string", "pattern": r"^\d{11}$"}},
              "patternProperties": {"^x-": {"type": "string"}}, "additionalProperties": False}
    assert errors(schema, {"phone": "13800138000", "x-note": "hi"}) == []
    assert errors(schema, {"phone": "12345"}) == ["'12345' does not match '^\\\\d{11}$'"]
    assert errors(schema, {"x-note": 1}) == ["1 is not of type 'string'"]
    assert errors(schema, {"other": 1}) == ["additional properties are not allowed ('other' unexpected)"]
    assert errors({"type": "string", "pattern": r"^\p{L}+$"}, "héllo") == []


@pytest.mark.parametrize(("schema", "where"), [
    ({"type": "object", "properties": {"pw": {"type": "string", "pattern": "^(?=.*[0-9]).{8,}$"}}},
     "input_schema/properties/pw/pattern"),
    ({"type": "object", "properties": {"twice": {"type": "string", "pattern": r"^(a)\1$"}}},
     "input_schema/properties/twice/pattern"),
    ({"type": "object", "patternProperties": {"(?<!x)y": True}}, "input_schema/patternProperties"),
])
def test_a_pattern_re2_cannot_match_is_refused_at_registration_naming_its_path(schema: dict, where: str) -> None:
    with pytest.raises(ValidationFailed) as err:
        validate_spec(replace(SPEC, input_schema=schema))
    assert err.value.field == where
    assert "linear time" in err.value.reason and "lookarounds" in err.value.hint


def test_call_arguments_are_validated_in_linear_time_naming_the_argument() -> None:
    started = time.perf_counter()
    with pytest.raises(ValidationFailed) as err:
        validate_arguments(SPEC, {"code": ATTACK})
    assert time.perf_counter() - started < 0.5
    assert err.value.field == "arguments/code" and "does not match" in err.value.reason
    assert validate_arguments(SPEC, {"code": "aaa"}) == {"code": "aaa"}

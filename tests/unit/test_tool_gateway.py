"""Tool specs, registration, what agents are offered, and calls, through a fake registry."""

from __future__ import annotations

from dataclasses import replace

import pytest
from fakes import FakeRegistry

from libs.errors import Conflict, ValidationFailed
from services.tool_gateway.domain import ToolSpec, current_versions, validate_spec
from services.tool_gateway.service_layer.handlers import (
    list_current_tools,
    list_tools,
    register_tool,
)

INPUT = {
    "type": "object",
    "properties": {
        "customer": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]},
    },
    "required": ["customer"],
}


def a_spec(**changes) -> ToolSpec:
    base = ToolSpec(name="crm.get_customer", description="Look up a customer record by its id.",
                    input_schema=INPUT, output_schema={"type": "object"}, version="1.0.0",
                    examples=({"arguments": {"customer": {"id": 7}}},))
    return replace(base, **changes)


def refused(spec: ToolSpec) -> ValidationFailed:
    with pytest.raises(ValidationFailed) as err:
        validate_spec(spec)
    return err.value


def test_a_complete_spec_whose_examples_validate_is_accepted() -> None:
    spec = a_spec()
    assert validate_spec(spec) is spec


@pytest.mark.parametrize("name", ["CRM.GetCustomer", "crm..get", "1crm", "crm.", "crm-get", ""])
def test_a_tool_name_that_is_not_dotted_snake_case_is_refused(name: str) -> None:
    assert refused(a_spec(name=name)).field == "name"


@pytest.mark.parametrize("version", ["1.0", "v1.0.0", "1.0.0-beta", ""])
def test_a_version_that_is_not_major_minor_patch_is_refused(version: str) -> None:
    assert refused(a_spec(version=version)).field == "version"


def test_a_description_shorter_than_a_sentence_is_refused() -> None:
    assert refused(a_spec(description="  gets it ")).field == "description"


@pytest.mark.parametrize(("changes", "bad_field"), [
    ({"timeout_seconds": 0}, "timeout_seconds"),
    ({"timeout_seconds": 601}, "timeout_seconds"),
    ({"retries": -1}, "retries"),
    ({"retries": 6}, "retries"),
])
def test_timeouts_and_retries_out_of_range_are_refused(changes: dict, bad_field: str) -> None:
    assert refused(a_spec(**changes)).field == bad_field


def test_an_input_schema_that_is_not_json_schema_is_refused_saying_where() -> None:
    error = refused(a_spec(input_schema={"type": "object", "properties": {"id": {"type": "integr"}}}))
    assert error.field == "input_schema"
    assert "not a valid JSON Schema" in error.reason
    assert "properties/id/type" in error.reason


def test_an_invalid_output_schema_is_refused_naming_output_schema() -> None:
    assert refused(a_spec(output_schema={"type": 5})).field == "output_schema"


@pytest.mark.parametrize("field_name", ["input_schema", "output_schema"])
def test_a_schema_that_does_not_describe_an_object_is_refused(field_name: str) -> None:
    error = refused(a_spec(**{field_name: {"type": "string"}}))
    assert error.field == field_name
    assert "object" in error.reason


def test_an_example_that_does_not_validate_is_refused_naming_the_example_and_the_path() -> None:
    error = refused(a_spec(examples=({"arguments": {"customer": {"id": "seven"}}},)))
    assert error.field == "examples[0]"
    assert "customer/id" in error.reason


def test_the_first_failing_example_is_named_by_its_index() -> None:
    good = {"arguments": {"customer": {"id": 1}}}
    error = refused(a_spec(examples=(good, {"arguments": {}})))
    assert error.field == "examples[1]"
    assert "(root)" in error.reason and "customer" in error.reason


def test_an_example_given_as_bare_arguments_is_validated_too() -> None:
    assert validate_spec(a_spec(examples=({"customer": {"id": 3}},)))
    assert refused(a_spec(examples=({"customer": {}},))).field == "examples[0]"


async def test_a_registered_tool_is_listed() -> None:
    registry = FakeRegistry()
    spec = await register_tool(a_spec(), registry)
    assert spec == a_spec()
    assert await list_tools(registry) == [spec]


async def test_registering_the_same_name_and_version_again_is_a_conflict_on_version() -> None:
    registry = FakeRegistry()
    await register_tool(a_spec(), registry)
    with pytest.raises(Conflict) as err:
        await register_tool(a_spec(description="A different description of the tool."), registry)
    assert err.value.field == "version"
    assert err.value.retryable is False
    assert "new version" in err.value.hint
    assert registry.announced == [a_spec()]


async def test_a_new_version_of_a_registered_tool_is_accepted() -> None:
    registry = FakeRegistry()
    await register_tool(a_spec(), registry)
    await register_tool(a_spec(version="1.1.0"), registry)
    assert [s.version for s in await list_tools(registry)] == ["1.1.0", "1.0.0"]


async def test_an_invalid_spec_is_never_stored() -> None:
    registry = FakeRegistry()
    with pytest.raises(ValidationFailed):
        await register_tool(a_spec(version="one"), registry)
    assert registry.tools == {} and registry.announced == []


def test_agents_get_each_tool_once_at_its_highest_version_compared_as_numbers() -> None:
    specs = [a_spec(version="1.9.0"), a_spec(version="1.10.0"), a_spec(name="a.tool")]
    assert [(s.name, s.version) for s in current_versions(specs)] == [("a.tool", "1.0.0"),
                                                                      ("crm.get_customer", "1.10.0")]


async def test_the_current_tools_come_from_the_registry() -> None:
    registry = FakeRegistry()
    for version in ("1.0.0", "2.0.0"):
        await registry.register(a_spec(version=version))
    assert [s.version for s in await list_current_tools(registry)] == ["2.0.0"]

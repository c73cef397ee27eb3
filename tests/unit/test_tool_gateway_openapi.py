"""OpenAPI operations and URL templates as tool specs (domain/openapi.py): schemas, names, what is skipped."""

from __future__ import annotations

import pytest

from libs.errors import ValidationFailed
from services.tool_gateway.domain import validate_spec
from services.tool_gateway.domain.openapi import template_schema, tools_from_openapi


def doc(paths: dict, **extra) -> dict:
    return {"openapi": "3.0.0", "info": {"title": "t", "version": "v1"}, "servers": [{"url": "https://api.x/v1"}],
            "paths": paths, **extra}


def test_each_operation_becomes_a_valid_tool_with_path_query_and_body_arguments() -> None:
    found = tools_from_openapi(doc({"/items/{item.id}": {"patch": {
        "operationId": "updateItemPrice", "summary": "Change an item's price",
        "parameters": [{"name": "item.id", "in": "path", "required": True, "schema": {"type": "string"}},
                       {"name": "notify", "in": "query", "schema": {"type": "boolean"}}],
        "requestBody": {"content": {"application/json": {"schema": {"type": "object", "required": ["price"],
                        "properties": {"price": {"type": "number", "minimum": 0, "exclusiveMinimum": True},
                                       "label": {"type": "string", "nullable": True}}}}}}}}}),
        prefix="shop", scopes=("shop:write",))
    [spec] = found.tools
    assert spec.name == "shop.update_item_price" and spec.version == "1.0.0" and spec.scopes == ("shop:write",)
    assert spec.backend == "http:PATCH https://api.x/v1/items/{item_id}{?notify}"
    assert spec.input_schema["required"] == ["item_id", "price"]
    assert spec.input_schema["properties"]["price"] == {"type": "number", "exclusiveMinimum": 0}
    assert spec.input_schema["properties"]["label"] == {"type": ["string", "null"]}
    assert validate_spec(spec) is spec and found.skipped == []


def test_operations_that_cannot_be_called_are_skipped_with_the_reason() -> None:
    found = tools_from_openapi(doc({
        "/a": {"get": {"parameters": [{"name": "Cookie-Id", "in": "cookie", "required": True}]},
               "post": {"requestBody": {"required": True, "content": {"text/plain": {"schema": {"type": "string"}}}}}},
        "/b": {"get": {"parameters": [{"$ref": "https://elsewhere/p.json"}]}},
        "/c": {"get": {"parameters": [{"$ref": "#/components/parameters/Loop"}]}},
    }, components={"parameters": {"Loop": {"$ref": "#/components/parameters/Loop"}}}))
    reasons = {s.operation: s.reason for s in found.skipped}
    assert "cookie parameter 'Cookie-Id'" in reasons["GET /a"] and "not a JSON object" in reasons["POST /a"]
    assert "outside the document" in reasons["GET /b"] and "refers to itself" in reasons["GET /c"]
    assert found.tools == []


def test_names_without_operation_ids_are_made_from_the_path_short_and_unique() -> None:
    long = "/" + "/".join(["segment"] * 20)
    found = tools_from_openapi(doc({long: {"get": {}, "delete": {}}}), prefix="api")
    names = [t.name for t in found.tools]
    assert len(set(names)) == 2 and all(len(n) <= 64 and n.startswith("api.") for n in names)


def test_a_swagger_2_document_or_a_relative_server_is_refused_with_what_to_do() -> None:
    with pytest.raises(ValidationFailed) as swagger:
        tools_from_openapi({"swagger": "2.0", "paths": {}})
    assert swagger.value.field == "openapi"
    with pytest.raises(ValidationFailed) as relative:
        tools_from_openapi(doc({}, servers=[{"url": "/v1"}]))
    assert relative.value.field == "servers" and "--base-url" in relative.value.hint
    assert tools_from_openapi(doc({}, servers=[{"url": "/v1"}]), base_url="http://h/v1").tools == []


def test_a_url_template_implies_required_path_and_optional_query_arguments() -> None:
    assert template_schema("GET https://w/forecast/{city}{?days,units}") == {
        "type": "object", "required": ["city"],
        "properties": {"city": {"type": "string"}, "days": {"type": "string"}, "units": {"type": "string"}}}

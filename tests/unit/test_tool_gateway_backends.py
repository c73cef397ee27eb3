"""Backends behind the router: the adapter (gRPC Adapter.Invoke, faked) and upstream results mapping."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import mcp_types as types
import pytest
from google.protobuf import struct_pb2

from libs.errors import DomainError, ValidationFailed
from libs.protogen.mnemesh.v1 import common_pb2, tools_pb2
from services.tool_gateway.adapters.backends import BackendRouter
from services.tool_gateway.adapters.backends.adapter import AdapterBackend
from services.tool_gateway.adapters.backends.http import parse_target
from services.tool_gateway.adapters.upstreams import _result
from services.tool_gateway.domain import ToolSpec, error_detail

SPEC = ToolSpec(name="erp.get_invoice", description="Read an invoice from the ERP.", input_schema={"type": "object"},
                backend="adapter:erp/GetInvoice")


class FakeAdapter:
    def __init__(self, response: tools_pb2.InvokeResponse) -> None:
        self.response, self.calls = response, []

    async def invoke(self, backend_id: str, operation: str, arguments: dict[str, Any], timeout: float):
        self.calls.append((backend_id, operation, arguments))
        return self.response


def struct(value: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(value)
    return s


async def test_an_adapter_tool_is_invoked_by_backend_id_and_operation() -> None:
    adapter = FakeAdapter(tools_pb2.InvokeResponse(result=struct({"total": 12.5})))
    router = BackendRouter({"adapter": AdapterBackend(adapter)})
    assert await router.call(SPEC, {"id": "INV-1"}, 5.0) == {"total": 12.5}
    assert adapter.calls == [("erp", "GetInvoice", {"id": "INV-1"})]


async def test_a_soap_fault_keeps_its_structured_error() -> None:
    fault = common_pb2.ErrorDetail(error_type="soap_fault", field="id", reason="invoice unknown", hint="check the id")
    router = BackendRouter({"adapter": AdapterBackend(FakeAdapter(tools_pb2.InvokeResponse(error=fault)))})
    with pytest.raises(DomainError) as err:
        await router.call(SPEC, {"id": "x"}, 5.0)
    assert err.value.to_dict() == {"error_type": "soap_fault", "field": "id", "reason": "invoice unknown",
                                   "retryable": False, "hint": "check the id"}


async def test_the_backends_fault_code_and_detail_are_kept_beside_the_structured_error() -> None:
    error = common_pb2.ErrorDetail(error_type="backend_fault", field="arguments", retryable=False,
                                   reason="SOAP fault CustomerNotFound: no customer 9", hint="correct the arguments")
    fault = {"code": "soap:Client.CustomerNotFound", "subcodes": [], "actor": "", "declared": "CustomerNotFound",
             "detail": {"customer_id": "9"}}
    router = BackendRouter({"adapter": AdapterBackend(FakeAdapter(tools_pb2.InvokeResponse(error=error,
                                                                                          fault=struct(fault))))})
    with pytest.raises(DomainError) as err:
        await router.call(SPEC, {"id": "x"}, 5.0)
    assert err.value.to_dict() == {"error_type": "backend_fault", "field": "arguments", "retryable": False,
                                   "reason": "SOAP fault CustomerNotFound: no customer 9",
                                   "hint": "correct the arguments"}
    assert error_detail(err.value)["fault"] == fault


async def test_a_retryable_fault_stays_retryable() -> None:
    error = common_pb2.ErrorDetail(error_type="backend_fault", reason="SOAP fault Server: busy", retryable=True)
    router = BackendRouter({"adapter": AdapterBackend(FakeAdapter(tools_pb2.InvokeResponse(
        error=error, fault=struct({"code": "soap:Server"}))))})
    with pytest.raises(DomainError) as err:
        await router.call(SPEC, {}, 5.0)
    assert err.value.retryable and error_detail(err.value)["fault"] == {"code": "soap:Server"}


async def test_an_unknown_backend_kind_is_refused_naming_the_backend_field() -> None:
    with pytest.raises(ValidationFailed) as err:
        await BackendRouter({}).call(replace(SPEC, backend="ftp:x"), {}, 1.0)
    assert err.value.field == "backend"


def test_http_targets_name_a_method_or_default_to_post() -> None:
    assert parse_target("GET https://x/{id}") == ("GET", "https://x/{id}")
    assert parse_target("https://x/send") == ("POST", "https://x/send")


def test_upstream_results_become_objects_and_tool_errors_are_mapped() -> None:
    assert _result(types.CallToolResult(content=[], structured_content={"a": 1})) == {"a": 1}
    assert _result(types.CallToolResult(content=[types.TextContent(text='{"b": 2}')])) == {"b": 2}
    assert _result(types.CallToolResult(content=[types.TextContent(text="plain")])) == {"text": "plain"}
    with pytest.raises(DomainError) as err:
        _result(types.CallToolResult(content=[types.TextContent(text="x" * 500)], is_error=True))
    assert err.value.error_type == "backend_error" and len(err.value.reason) < 250

"""JSON <-> SOAP values, and SOAP faults / HTTP statuses as structured errors."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace

import pytest
from lxml import etree
from zeep import Settings

from libs.errors import DeadlineExceeded, Unauthenticated, Unavailable, ValidationFailed
from services.adapter.adapters.soap_catalog import build_catalog
from services.adapter.adapters.soap_values import body_arguments, to_json, xml_to_json
from services.adapter.adapters.wsdl_import import WsdlSource, load_wsdl
from services.adapter.domain.errors import BackendFault, BadResponse, from_http_status, from_soap_fault

WSDL = Path(__file__).parent / "wsdl"


def binding_of(name: str):
    loaded = load_wsdl(WsdlSource(path=str(WSDL / name)), "t", file_roots=(WSDL,))
    return build_catalog("t", loaded, revision=1)[1]


def test_an_rpc_encoded_call_renders_a_soap_encoded_array_from_a_json_list() -> None:
    binding = binding_of("rpc_encoded.wsdl")
    operation = binding._operations["getQuotes"]
    args, kwargs = body_arguments(operation.input.body, {"symbols": ["ACME", "INIT"], "market": "NYSE"})
    client = SimpleNamespace(wsse=None, plugins=[], settings=Settings())
    envelope, _ = binding._create("getQuotes", args, kwargs, client=client, options={"address": "http://x.invalid"})
    xml = etree.tostring(envelope).decode()
    assert "ACME" in xml and "INIT" in xml and "NYSE" in xml and "getQuotes" in xml


def test_json_strings_become_typed_values_and_bad_ones_name_their_field() -> None:
    binding = binding_of("multi/orders.wsdl")
    body = binding._operations["PlaceOrder"].input.body
    _, kwargs = body_arguments(body, {"lines": [{"sku": "A", "quantity": 1, "price": "10.10"}],
                                      "due": "2024-03-01T09:30:00Z"})
    assert kwargs["lines"][0]["price"] == Decimal("10.10")
    assert kwargs["due"] == dt.datetime(2024, 3, 1, 9, 30, tzinfo=dt.timezone.utc)
    with pytest.raises(ValidationFailed) as err:
        body_arguments(body, {"due": "yesterday"})
    assert err.value.field == "due" and "xsd:dateTime" in err.value.reason
    with pytest.raises(ValidationFailed) as err:
        body_arguments(body, {"customer": {"nickname": "x"}})
    assert err.value.field == "customer.nickname"


def test_results_become_plain_json() -> None:
    assert to_json({"d": Decimal("1234.5600"), "t": dt.datetime(2024, 1, 2, 3, 4, 5), "day": dt.date(2024, 1, 2),
                    "b": b"\x00\x01", "n": None, "f": float("inf"), "dur": dt.timedelta(hours=1, minutes=30),
                    "l": [1, "x"]}) == {"d": "1234.5600", "t": "2024-01-02T03:04:05", "day": "2024-01-02",
                                        "b": "AAE=", "n": None, "f": "INF", "dur": "PT1H30M", "l": [1, "x"]}
    element = etree.fromstring('<r a="1"><x>1</x><x>2</x><y>t</y></r>')
    assert xml_to_json(element) == {"@a": "1", "x": ["1", "2"], "y": "t"}


def test_a_client_fault_is_not_retryable_and_keeps_code_detail_and_the_declared_fault() -> None:
    error = from_soap_fault(code="soap:Client.OrderRejected", message="no stock", detail={"reason": "empty"},
                            declared=("OrderRejected",), http_status=500)
    assert isinstance(error, BackendFault) and not error.retryable and error.field == "arguments"
    assert error.fault["declared"] == "OrderRejected" and error.fault["detail"] == {"reason": "empty"}
    assert "OrderRejected" in error.reason and "no stock" in error.reason
    server = from_soap_fault(code="{http://www.w3.org/2003/05/soap-envelope}Receiver", message="db down",
                             subcodes=("Timeout",))
    assert server.retryable and server.fault["subcodes"] == ["Timeout"]


@pytest.mark.parametrize(("status", "kind", "retryable"), [
    (401, Unauthenticated, False), (503, Unavailable, True), (504, DeadlineExceeded, True), (415, BadResponse, False)])
def test_http_errors_without_a_fault_map_to_structured_errors(status: int, kind: type, retryable: bool) -> None:
    error = from_http_status(status, "http://erp.invalid/soap")
    assert isinstance(error, kind) and error.retryable is retryable and error.hint

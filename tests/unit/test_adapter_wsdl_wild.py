"""WSDL constructs found in public WSDLs that zeep trips on or drops silently, with the network off:
each is repaired (and named in the notes) or reported by name, and the rest of the WSDL still works."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest

from libs.errors import ValidationFailed
from libs.safe_schema import SafeValidator, check_schema
from services.adapter.adapters.soap_catalog import build_catalog
from services.adapter.adapters.wsdl_import import WsdlSource, load_wsdl

WSDL = Path(__file__).parent / "wsdl"


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise OSError("network unreachable (test)")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.fixture(scope="module")
def wild():
    loaded = load_wsdl(WsdlSource(path=str(WSDL / "wild" / "wild.wsdl")), "wild", file_roots=(WSDL,))
    return build_catalog("wild", loaded, revision=1)[0]


def test_an_xsd_import_straight_in_wsdl_types_is_read_and_named(wild) -> None:
    assert set(wild.tool("Lookup").input_schema["properties"]) == {"id", "filter", "detail", "paging"}
    assert any("xsd:import of model.xsd outside any xsd:schema" in n for n in wild.notes)


def test_a_prefix_declared_on_an_inner_element_of_an_included_schema_resolves(wild) -> None:
    record = wild.tool("Lookup").output_schema["$defs"]["Record"]
    assert set(record["properties"]) == {"created", "title"}  # q1:Entity, the base declared through xmlns:q1


def test_operations_zeep_drops_are_failed_with_the_missing_definition_named(wild) -> None:
    failed = {f.operation: f.reason for f in wild.failed}
    assert set(failed) == {"Archive", "Purge"}
    assert "element {urn:example:wild:lost}Archive is defined in no loaded schema" in failed["Archive"]
    assert "imported without a schemaLocation" in failed["Archive"]
    assert failed["Purge"] == "portType {urn:example:wild}Records declares no operation Purge"
    assert [t.operation for t in wild.tools] == ["Lookup"]


def test_a_binding_of_an_undefined_port_type_and_an_undefined_header_message_are_left_out(wild) -> None:
    notes = " | ".join(wild.notes)
    assert "portType {urn:example:wild}LegacyRecords, which no document defines, are left out" in notes
    assert "SOAP header message {urn:example:wild}SessionHeader is defined in no document" in notes
    assert "port RecordService/GhostPort is left out: its binding {urn:example:wild}Ghost" in notes
    assert [p.port for p in wild.ports] == ["Records12Port"]


def test_a_soap12_binding_whose_port_has_a_soap11_address_keeps_that_address(wild) -> None:
    assert (wild.port.soap_version, wild.port.address) == ("1.2", "http://records.example/soap12")


def test_an_undefined_extension_base_becomes_any_and_is_named(wild) -> None:
    schema = wild.tool("Lookup").output_schema
    assert schema["$defs"]["Stamp"]["properties"] == {"by": {"type": "string"}}
    assert any("{urn:example:wild:model}Undefined is defined in no loaded schema" in n for n in wild.notes)
    check_schema(schema)
    SafeValidator(schema)


def test_a_wsdl_whose_only_port_has_an_undefined_binding_is_refused_naming_port_and_binding() -> None:
    loaded = load_wsdl(WsdlSource(path=str(WSDL / "wild" / "no_port.wsdl")), "ghost", file_roots=(WSDL,))
    with pytest.raises(ValidationFailed) as err:
        build_catalog("ghost", loaded, revision=1)
    assert "GhostService/GhostPort" in err.value.reason and "{urn:example:ghost}Phantom" in err.value.reason


def test_each_operation_schema_carries_only_the_definitions_it_uses() -> None:
    """Types are built once per port and shared; each schema still carries every definition it
    references and none it does not."""
    loaded = load_wsdl(WsdlSource(path=str(WSDL / "multi" / "orders.wsdl")), "orders", file_roots=(WSDL,))
    catalog = build_catalog("orders", loaded, revision=1)[0]
    for tool in catalog.tools:
        for schema in (tool.input_schema, tool.output_schema):
            referenced = set(re.findall(r"#/\$defs/([^'\"]+)", json.dumps(schema)))
            assert referenced == set(schema.get("$defs", {})), tool.name
            check_schema(schema)
    assert any(tool.input_schema.get("$defs") for tool in catalog.tools)


def test_a_choice_with_an_xsd_any_option_names_it_as_zeep_does(wild) -> None:
    schema = wild.tool("Lookup").input_schema
    check_schema(schema)
    assert resolve(schema, schema["properties"]["filter"])["oneOf"] == [{"required": ["byName"]},
                                                                        {"required": ["_value_1"]}]
    validator = SafeValidator(schema)
    assert not list(validator.iter_errors({"id": "1", "filter": {"byName": "x"}}))
    assert list(validator.iter_errors({"id": "1", "filter": {}}))


def resolve(schema: dict, node: dict) -> dict:
    return schema["$defs"][node["$ref"].rsplit("/", 1)[1]] if "$ref" in node else node


def test_local_elements_of_one_name_keep_their_own_anonymous_types_and_facets(wild) -> None:
    schema = wild.tool("Lookup").input_schema
    detail = resolve(schema, schema["properties"]["detail"])
    nested = resolve(schema, resolve(schema, schema["properties"]["paging"])["properties"]["detail"])
    assert detail["properties"] == {"level": {"type": "string", "enum": ["low", "high"]}}
    assert nested["properties"] == {"depth": {"type": "integer", "minimum": -2**31, "maximum": 2**31 - 1}}


def test_a_wsdl_without_a_service_is_called_at_the_configured_address_through_a_chosen_binding() -> None:
    loaded = load_wsdl(WsdlSource(path=str(WSDL / "wild" / "interface_only.wsdl")), "echo", file_roots=(WSDL,))
    with pytest.raises(ValidationFailed) as err:
        build_catalog("echo", loaded, revision=1)
    assert err.value.field == "options.address" and "binding EchoSoap11 is used by no wsdl:port" in err.value.reason
    catalog = build_catalog("echo", loaded, revision=1, address="http://echo.example/soap")[0]
    assert (catalog.port.binding, catalog.port.soap_version, catalog.port.address) == (
        "EchoSoap11", "1.1", "http://echo.example/soap")
    assert [t.name for t in catalog.tools] == ["echo.echo"]
    chosen = build_catalog("echo", loaded, revision=1, port="EchoSoap12", address="http://echo.example/soap12")[0]
    assert chosen.port.soap_version == "1.2"


async def test_soap_header_parts_are_the_optional_soapheaders_argument_and_reach_the_envelope() -> None:
    from services.adapter.adapters.soap_call import SoapEndpoint
    from services.adapter.adapters.soap_http import HttpReply

    loaded = load_wsdl(WsdlSource(path=str(WSDL / "wild" / "headers.wsdl")), "session", file_roots=(WSDL,))
    catalog, binding = build_catalog("session", loaded, revision=1)
    tool = catalog.tool("Whoami")
    headers = resolve(tool.input_schema, tool.input_schema["properties"]["_soapheaders"])
    assert "SessionHeader" in headers["properties"] and "required" not in tool.input_schema  # all optional
    check_schema(tool.input_schema)
    sent: list[bytes] = []

    class Answer:  # the endpoint's HTTP port, answering every POST with one envelope
        async def post(self, url, body, headers, *, auth, timeout) -> HttpReply:
            sent.append(body)
            return HttpReply(200, {"Content-Type": "text/xml"}, b'<e:Envelope xmlns:e="http://schemas.xmlsoap.org/'
                             b'soap/envelope/"><e:Body><WhoamiResponse xmlns="urn:example:session"><user>ada</user>'
                             b'</WhoamiResponse></e:Body></e:Envelope>', "utf-8")

    endpoint = SoapEndpoint(catalog, binding, http=Answer(), limits={}, concurrency=2)
    result = await endpoint.invoke(tool, {"_soapheaders": {"SessionHeader": {"sessionId": "s-42"}}})
    assert result == {"user": "ada"}
    from lxml import etree

    header = etree.fromstring(sent[0]).find("{http://schemas.xmlsoap.org/soap/envelope/}Header")
    assert header.findtext("{urn:example:session}SessionHeader/{urn:example:session}sessionId") == "s-42"
    await endpoint.invoke(tool, {"verbose": True})  # no header given: none sent
    assert b"s-42" not in sent[1]
    with pytest.raises(ValidationFailed) as err:
        await endpoint.invoke(tool, {"_soapheaders": {"SessionHeader": {"token": "x"}}})
    assert err.value.field.startswith("_soapheaders")

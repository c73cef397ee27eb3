"""WSDL import with the network unreachable: imports across files, SOAP 1.1/1.2, rpc/encoded, several ports."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from libs.errors import NotFound, ValidationFailed
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


def load(name: str, **options):
    loaded = load_wsdl(WsdlSource(path=str(WSDL / name)), "orders", file_roots=(WSDL,))
    return build_catalog("orders", loaded, revision=1, **options)[0]


def test_imports_across_files_and_standard_schemas_resolve_offline_and_the_first_soap_port_is_chosen() -> None:
    catalog = load("multi/orders.wsdl")
    assert (catalog.port.service, catalog.port.port, catalog.port.soap_version) == ("Orders", "Orders11Port", "1.1")
    assert {(p.port, p.soap_version) for p in catalog.ports} == {
        ("OrdersHttpPort", ""), ("Orders11Port", "1.1"), ("Orders12Port", "1.2"), ("Backup11Port", "1.1")}
    assert [t.name for t in catalog.tools] == ["orders.place_order", "orders.broken"]


def test_a_soap12_port_can_be_chosen_and_an_unknown_one_is_refused_listing_the_ports() -> None:
    assert load("multi/orders.wsdl", port="Orders12Port").port.soap_version == "1.2"
    with pytest.raises(NotFound) as err:
        load("multi/orders.wsdl", port="Nope")
    assert "Orders11Port" in err.value.reason and err.value.field == "options.port"


def test_the_input_schema_carries_xsd_constraints() -> None:
    tool = load("multi/orders.wsdl").tool("PlaceOrder")
    schema, defs = tool.input_schema, tool.input_schema["$defs"]
    props = schema["properties"]
    assert schema["required"] == ["customer", "lines", "currency", "comment"]
    assert props["lines"]["maxItems"] == 50 and props["lines"]["items"] == {"$ref": "#/$defs/Line"}
    assert props["currency"]["pattern"] == "^(?:[A-Z]{3})$"  # named simple type, from an included schema
    assert props["priority"]["enum"] == [1, 2, 3]
    assert props["comment"]["type"] == ["string", "null"]  # nillable
    assert schema["oneOf"] == [{"required": ["pickup"]}, {"required": ["shipTo"]}]  # xs:choice
    assert defs["Customer"]["properties"]["tier"] == {"type": "string", "enum": ["basic", "gold"], "default": "basic"}
    assert {"name", "id", "tier"} <= set(defs["Customer"]["required"])  # extension keeps the base's members
    assert defs["Line"]["properties"]["quantity"] == {"type": "integer", "minimum": 1, "maximum": 999}
    assert defs["Category"]["properties"]["children"]["items"] == {"$ref": "#/$defs/Category"}  # recursive
    assert "Address" in defs["EndpointReferenceType"]["properties"]  # WS-Addressing, bundled
    assert tool.description.startswith("Places an order and returns its id and total.")
    assert tool.faults == ("OrderRejected",)
    check_schema(schema)
    check_schema(tool.output_schema)


def test_the_generated_schema_accepts_a_good_order_and_refuses_a_bad_one_precisely() -> None:
    validator = SafeValidator(load("multi/orders.wsdl").tool("PlaceOrder").input_schema)
    good = {"customer": {"id": "c1", "name": "Ada", "tier": "gold"}, "lines": [{"sku": "A", "quantity": 2}],
            "pickup": True, "currency": "EUR", "comment": None}
    assert not list(validator.iter_errors(good))
    for bad in ({**good, "currency": "euro"}, {**good, "shipTo": "x"}, {**good, "lines": [{"sku": "A", "quantity": 0}]},
                {**good, "priority": 7}):
        assert list(validator.iter_errors(bad)), bad


def test_an_undefined_type_is_reported_by_name_and_the_other_operations_still_work() -> None:
    catalog = load("multi/orders.wsdl")
    assert any("{urn:example:orders}DoesNotExist" in note for note in catalog.notes)
    assert catalog.tool("PlaceOrder") is not None


def test_rpc_encoded_soap_arrays_and_soapenc_types_map_to_json() -> None:
    tool = load("rpc_encoded.wsdl").tool("getQuotes")
    assert tool.style == "rpc"
    assert tool.input_schema["properties"] == {
        "symbols": {"type": "array", "items": {"type": "string"}, "description": "SOAP-encoded array"},
        "market": {"type": "string"}}
    quote = tool.output_schema["$defs"]["Quote"]["properties"]
    assert quote["price"]["type"] == "string" and quote["asOf"]["format"] == "date-time"


@pytest.mark.parametrize(("name", "words"), [
    ("malformed.wsdl", "not well-formed XML"),
    ("missing_import.wsdl", "gone.xsd"),
    ("no_service.wsdl", "no service"),
])
def test_a_bad_wsdl_gets_a_clear_error_naming_the_problem(name: str, words: str) -> None:
    with pytest.raises(ValidationFailed) as err:
        load_wsdl(WsdlSource(path=str(WSDL / name)), "x", file_roots=(WSDL,))
    assert words in err.value.reason and err.value.field == "path"


def test_a_missing_companion_schema_leaves_out_only_the_operations_that_need_it() -> None:
    loaded = load_wsdl(WsdlSource(path=str(WSDL / "partial" / "partial.wsdl")), "orders", file_roots=(WSDL,))
    catalog = build_catalog("orders", loaded, revision=1)[0]
    assert sorted(t.operation for t in catalog.tools) == ["GetItem", "GetStatus"]
    assert catalog.tool("GetItem").input_schema["properties"] == {"sku": {"type": "string"}}
    failed = {f.operation: f.reason for f in catalog.failed}
    assert sorted(failed) == ["Annotate", "GetGone"]
    # GetGone's input element is defined there; Annotate's input has a member of one of its types.
    assert "{urn:example:gone}Lookup is to be defined by the import" in failed["GetGone"]
    assert "{urn:example:partial}AnnotateRequest uses definitions of the import" in failed["Annotate"]
    assert all("partial/gone.xsd" in reason and "cannot be read" in reason for reason in failed.values())
    assert any("partial/gone.xsd (namespace urn:example:gone) cannot be read" in note for note in catalog.notes)
    # What is stored is what was really read, untouched by the stand-in, and the missing document as empty:
    # a restart re-imports offline (no file may be read here) to the same tools, refusing it without looking.
    assert {Path(p).name: len(c) > 0 for p, c in loaded.documents.items()} == {
        "partial.wsdl": True, "present.xsd": True, "gone.xsd": False}
    location = next(p for p in loaded.documents if p.endswith("partial.wsdl"))
    restored = load_wsdl(WsdlSource(document=loaded.documents[location], base_url=location,
                                    documents=loaded.documents), "orders", file_roots=())
    assert restored.wsdl_hash == loaded.wsdl_hash
    catalog = build_catalog("orders", restored, revision=1)[0]
    assert sorted(t.operation for t in catalog.tools) == ["GetItem", "GetStatus"]
    assert all("was missing when the WSDL was imported" in f.reason for f in catalog.failed)
    assert sorted(f.operation for f in catalog.failed) == ["Annotate", "GetGone"]


def test_an_upload_without_one_companion_still_yields_the_operations_that_work() -> None:
    folder = (WSDL / "partial").resolve()
    main = folder / "partial.wsdl"
    present = (folder / "present.xsd").as_uri()
    loaded = load_wsdl(WsdlSource(document=main.read_bytes(), base_url=main.as_uri(),
                                  documents={present: (folder / "present.xsd").read_bytes()}), "orders",
                       file_roots=())  # gone.xsd was not uploaded and no file may be read
    catalog = build_catalog("orders", loaded, revision=1)[0]
    assert sorted(t.operation for t in catalog.tools) == ["GetItem", "GetStatus"]
    assert all("is not among the documents of this import" in f.reason for f in catalog.failed)
    # Without present.xsd as well, GetItem goes too, naming its own missing document.
    loaded = load_wsdl(WsdlSource(document=main.read_bytes(), base_url=main.as_uri()), "orders", file_roots=())
    catalog = build_catalog("orders", loaded, revision=1)[0]
    assert [t.operation for t in catalog.tools] == ["GetStatus"]
    assert "partial/present.xsd" in {f.operation: f.reason for f in catalog.failed}["GetItem"]


def test_a_missing_wsdl_import_fails_the_import_naming_it_when_nothing_else_is_left() -> None:
    main = (WSDL / "multi" / "orders.wsdl").resolve()
    loaded = load_wsdl(WsdlSource(document=main.read_bytes(), base_url=main.as_uri()), "orders", file_roots=())
    with pytest.raises(ValidationFailed) as err:  # its portType and messages live in the missing document
        build_catalog("orders", loaded, revision=1)
    assert "no usable port (the import" in err.value.reason and "multi/messages.wsdl" in err.value.reason
    assert "not among the documents" in err.value.reason


def test_a_remote_import_on_another_host_is_refused_unless_asked_for() -> None:
    document = (WSDL / "missing_import.wsdl").read_bytes().replace(b'"gone.xsd"', b'"http://elsewhere.invalid/x.xsd"')
    with pytest.raises(ValidationFailed) as err:
        load_wsdl(WsdlSource(document=document, base_url="http://erp.invalid/svc?wsdl"), "x")
    assert "elsewhere.invalid" in err.value.reason and "allow_remote" in err.value.hint


def test_files_outside_the_allowed_folder_are_not_read() -> None:
    with pytest.raises(ValidationFailed) as err:
        load_wsdl(WsdlSource(path=str(WSDL / "no_service.wsdl")), "x", file_roots=(WSDL / "multi",))
    assert "MNEMESH_ADAPTER_WSDL_DIR" in err.value.reason


def test_an_uploaded_wsdl_with_its_companions_imports_without_reading_any_file() -> None:
    from mnemesh.adapter_cli import companions

    main = (WSDL / "multi" / "orders.wsdl").resolve()
    files = companions(main)
    assert len(files) == 4
    document = files.pop(main.as_uri())
    loaded = load_wsdl(WsdlSource(document=document, base_url=main.as_uri(), documents=files), "orders",
                       file_roots=())  # no file may be read: everything comes with the request
    catalog = build_catalog("orders", loaded, revision=1)[0]
    assert catalog.tool("PlaceOrder") is not None
    assert loaded.wsdl_hash == load_wsdl(WsdlSource(path=str(main)), "orders", file_roots=(WSDL,)).wsdl_hash


def test_real_world_shapes_import_and_what_zeep_cannot_model_is_named() -> None:
    """Two schemas sharing a namespace, xsd:any, an attribute group and circular imports map; a
    substitution group and mixed content cannot be mapped faithfully and are named in the notes."""
    loaded = load_wsdl(WsdlSource(path=str(WSDL / "shapes" / "shapes.wsdl")), "shapes", file_roots=(WSDL,))
    catalog, _ = build_catalog("shapes", loaded, revision=1)
    [tool] = catalog.tools
    schema = tool.input_schema
    assert schema["required"] == ["Shape", "folder", "extra", "by"]  # the attribute group's required attribute
    assert schema["$defs"]["Note"]["properties"]["parent"] == {"$ref": "#/$defs/Folder"}  # a.xsd <-> b.xsd
    assert "xsd:any" in schema["$defs"]["Extra"]["properties"]["_value_1"]["items"]["description"]
    notes = " | ".join(catalog.notes)
    assert "element Circle substitutes for Shape" in notes and "DrawResponse has mixed content" in notes

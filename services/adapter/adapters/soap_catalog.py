"""A loaded WSDL -> the Catalog of tools of one port (one per operation), and the zeep binding to call them."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from zeep.exceptions import Error as ZeepError
from zeep.wsdl.bindings.soap import Soap11Binding, Soap12Binding, SoapBinding

from libs.errors import NotFound, ValidationFailed
from services.adapter.adapters.json_schema import SchemaBuilder
from services.adapter.adapters.wsdl_gaps import WsdlOutline, dropped_operations, dropped_ports, part_references
from services.adapter.adapters.wsdl_import import LoadedWsdl
from services.adapter.adapters.xsd_facets import FacetIndex
from services.adapter.adapters.xsd_notes import unmapped_constructs
from services.adapter.domain.catalog import Catalog, FailedOperation, OperationTool, PortInfo, describe_operation
from services.adapter.domain.naming import tool_name

__all__ = ["build_catalog", "list_ports"]


def _soap_version(binding: object) -> str:
    if isinstance(binding, Soap12Binding):
        return "1.2"
    if isinstance(binding, Soap11Binding):
        return "1.1"
    return ""


def list_ports(loaded: LoadedWsdl, outline: WsdlOutline | None = None) -> list[tuple[PortInfo, object]]:
    """Every (service, port) of the WSDL with its binding, SOAP ones first in document order. A port
    whose address element is of another SOAP version than its binding (a SOAP 1.2 binding with a
    soap:address) still has that address."""
    outline = outline or WsdlOutline.from_documents(loaded.documents)
    found = []
    for service in loaded.document.services.values():
        for port in service.ports.values():
            address = (port.binding_options or {}).get("address") or outline.port_address(service.name, port.name)
            info = PortInfo(service.name, port.name, port.binding.name.localname if port.binding.name is not None
                            else "", _soap_version(port.binding), address)
            found.append((info, port))
    used = {id(port.binding) for _, port in found}
    for binding in loaded.document.bindings.values():  # SOAP bindings no port uses: callable at options.address
        if isinstance(binding, SoapBinding) and id(binding) not in used and binding.name is not None:
            found.append((PortInfo("", "", binding.name.localname, _soap_version(binding), ""),
                          SimpleNamespace(binding=binding)))
    return sorted(found, key=lambda item: (not item[0].soap_version, not item[0].port))


def _choose(ports: list[tuple[PortInfo, object]], service: str, port: str) -> tuple[PortInfo, object]:
    """The first SOAP port matching service and port; a binding no port uses matches by its name."""
    candidates = [(i, p) for i, p in ports if (not service or i.service == service)
                  and (not port or port == (i.port or i.binding))]
    soap = [(i, p) for i, p in candidates if i.soap_version]
    if not soap:
        available = ", ".join(f"{i.service}/{i.port} ({'SOAP ' + i.soap_version if i.soap_version else 'not SOAP'})"
                              if i.port else f"binding {i.binding} (SOAP {i.soap_version}, no port)"
                              for i, _ in ports) or "none"
        wanted = "/".join(filter(None, [service, port])) or "any"
        raise NotFound(f"no SOAP port matches {wanted}; the WSDL has {available}",
                       field="options.port" if port else "options.service",
                       hint="choose one of the listed SOAP ports (or leave service and port empty)")
    return soap[0]


def build_catalog(backend_id: str, loaded: LoadedWsdl, *, revision: int, service: str = "", port: str = "",
                  address: str = "", index: FacetIndex | None = None) -> tuple[Catalog, SoapBinding]:
    """The tools of one port (or of a SOAP binding no port uses, when `address` says where to call it)."""
    outline = WsdlOutline.from_documents(loaded.documents)
    ports = list_ports(loaded, outline)
    lost_ports = dropped_ports(outline, {(i.service, i.port) for i, _ in ports})
    if not ports:
        missing = "".join(f" (the import {location} {why})" for location, (_, why) in loaded.missing.documents.items())
        raise ValidationFailed(f"the WSDL has no usable port{missing}: " + ("; ".join(lost_ports[:5]) or
                                                                 "its services declare none"),
                               field="source", hint="a wsdl:service needs a wsdl:port whose SOAP binding is defined")
    info, chosen = _choose(ports, service, port)
    binding: SoapBinding = chosen.binding
    if not info.port and not address:
        lost = f" ({'; '.join(lost_ports[:3])})" if lost_ports else ""
        raise ValidationFailed(f"binding {info.binding} is used by no wsdl:port, so the WSDL does not say where to "
                               f"call it{lost}", field="options.address",
                               hint="set options.address to the endpoint URL (and options.port to a binding name to "
                                    "choose another binding)")
    if not info.address and not address:
        raise ValidationFailed(f"port {info.service}/{info.port} has no soap:address location", field="source",
                               hint="set options.address to the endpoint URL")
    if address:
        info = dataclasses.replace(info, address=address)
    index = index or FacetIndex.from_documents(loaded.documents)
    tools, failed, taken = [], [], set()
    notes = [*loaded.warnings, *lost_ports, *unmapped_constructs(loaded.documents)]
    builders = SchemaBuilder(index, "input"), SchemaBuilder(index, "output")  # shared: types built once
    for operation in binding._operations.values():
        if binding.name is not None and (gap := _needs_missing(loaded, outline, binding.name.text, operation.name)):
            failed.append(FailedOperation(operation.name, gap))
            continue
        try:
            tool = _tool(backend_id, info, operation, builders, taken, notes)
        except (ZeepError, LookupError, AttributeError, TypeError, KeyError, ValueError) as exc:
            failed.append(FailedOperation(operation.name, f"{exc.__class__.__name__}: {exc}"))
            continue
        taken.add(tool.name)
        tools.append(tool)
    notes += builders[0].notes + builders[1].notes
    if binding.name is not None:  # what zeep left out of the binding is failed, with the reason
        failed += [FailedOperation(f.operation, _needs_missing(loaded, outline, binding.name.text, f.operation)
                                   or f.reason)
                   for f in dropped_operations(outline, loaded.document.types, binding.name.text,
                                               set(binding._operations))]
    catalog = Catalog(backend_id=backend_id, wsdl_hash=loaded.wsdl_hash, revision=revision, location=loaded.location,
                      port=info, ports=tuple(i for i, _ in ports), tools=tuple(tools), failed=tuple(failed),
                      notes=tuple(dict.fromkeys(notes)))
    return catalog, binding


def _needs_missing(loaded: LoadedWsdl, outline: WsdlOutline, binding_name: str, name: str) -> str:
    """Why operation `name` cannot work without a companion document the import could not read, or ''."""
    missing = loaded.missing
    if not missing.documents:
        return ""
    for what, qname in part_references(outline, binding_name, name):
        location = missing.needed_by(qname)
        if location is None:
            continue
        how = "uses definitions of" if qname in missing.defined else "is to be defined by"
        return f"{what}: {qname} {how} the import {location}, which {missing.documents[location][1]}"
    return ""


def _tool(backend_id: str, info: PortInfo, operation, builders: tuple[SchemaBuilder, SchemaBuilder],
          taken: set[str], notes: list[str]) -> OperationTool:
    context = f"{operation.name}"
    inputs, outputs = builders
    input_schema = inputs.message(operation.input.body if operation.input else None, f"{context} input")
    if operation.output is not None:
        output_schema = outputs.message(operation.output.body, f"{context} output")
    else:
        output_schema = {"type": "object", "properties": {}, "description": "one-way operation: no response"}
    header = getattr(operation.input, "header", None)
    if header is not None and getattr(header.type, "_element", None):
        input_schema = _with_headers(input_schema, inputs.message(header, f"{context} input header"))
    faults = tuple(sorted(operation.faults)) if getattr(operation, "faults", None) else ()
    name = tool_name(backend_id, operation.name, taken)
    description = describe_operation(operation.name, info.service, inputs.index.operation_docs.get(operation.name, ""),
                                     input_schema, faults)
    return OperationTool(name=name, operation=operation.name, description=description, input_schema=input_schema,
                         output_schema=output_schema, faults=faults, style=operation.style or "document",
                         soap_action=operation.soapaction or "")


def _with_headers(input_schema: dict, header_schema: dict) -> dict:
    """The input schema with the operation's SOAP header parts as the optional `_soapheaders` object
    (each part optional: a service that needs one says so in its fault)."""
    defs = header_schema.pop("$defs", {})
    header_schema.pop("required", None)
    header_schema["description"] = "SOAP header parts, sent in the envelope's Header (each optional)"
    schema = {**input_schema, "properties": {**input_schema.get("properties", {}), "_soapheaders": header_schema}}
    if defs:
        schema["$defs"] = {**input_schema.get("$defs", {}), **defs}
    return schema

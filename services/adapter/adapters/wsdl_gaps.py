"""What zeep leaves out without an error, found by comparing the raw documents with what it built.

zeep drops a binding operation whose portType operation or messages it cannot resolve, and a
port whose binding it cannot find, with at most a warning. The import must name every one of
them (an operation that is not a tool is a `FailedOperation` with the reason), never lose one
silently. The reasons are read from the documents: which message, which part, which element or
type is missing, and whether its namespace was imported without a schemaLocation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lxml import etree

from services.adapter.domain.catalog import FailedOperation

__all__ = ["WsdlOutline", "dropped_operations", "dropped_ports", "part_references"]

WSDL = "http://schemas.xmlsoap.org/wsdl/"
XSD = "http://www.w3.org/2001/XMLSchema"
_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=False)


def _qname(node: etree._Element, value: str | None, tns: str | None, *, default_ns: bool) -> str | None:
    """Clark notation of a QName attribute; unprefixed names take the default namespace (XSD
    references) or the targetNamespace (WSDL references, as zeep reads them)."""
    if not value:
        return None
    prefix, _, local = value.strip().rpartition(":")
    namespace = node.nsmap.get(prefix) if prefix else (node.nsmap.get(None) if default_ns else tns)
    return f"{{{namespace}}}{local}" if namespace else local


@dataclass
class WsdlOutline:
    """The WSDL definitions of every loaded document, by Clark-notation QName."""

    messages: dict[str, tuple[etree._Element, str | None]] = field(default_factory=dict)
    port_types: dict[str, tuple[etree._Element, str | None]] = field(default_factory=dict)
    bindings: dict[str, tuple[etree._Element, str | None]] = field(default_factory=dict)
    services: list[tuple[etree._Element, str | None]] = field(default_factory=list)
    location_less: set[str] = field(default_factory=set)  # namespaces imported without schemaLocation
    parts: dict[str, dict[str, list[tuple[str, str]]]] = field(default_factory=dict)  # see part_references

    @classmethod
    def from_documents(cls, documents: dict[str, bytes]) -> WsdlOutline:
        outline = cls()
        for content in documents.values():
            try:
                root = etree.fromstring(content, _PARSER)
            except etree.XMLSyntaxError:
                continue
            for imp in root.iter(f"{{{XSD}}}import"):
                if not imp.get("schemaLocation") and imp.get("namespace"):
                    outline.location_less.add(imp.get("namespace"))
            if root.tag != f"{{{WSDL}}}definitions":
                continue
            tns = root.get("targetNamespace")
            for tag, table in (("message", outline.messages), ("portType", outline.port_types),
                               ("binding", outline.bindings)):
                for node in root.findall(f"{{{WSDL}}}{tag}"):
                    table.setdefault(f"{{{tns}}}{node.get('name')}" if tns else node.get("name"), (node, tns))
            outline.services.extend((node, tns) for node in root.findall(f"{{{WSDL}}}service"))
        return outline


    def port_address(self, service: str, port: str) -> str:
        """The location of any address element of the port (soap, soap12 or http)."""
        for node, _ in self.services:
            if node.get("name") != service:
                continue
            for port_node in node.findall(f"{{{WSDL}}}port"):
                if port_node.get("name") == port:
                    for child in port_node:
                        if isinstance(child.tag, str) and etree.QName(child).localname == "address" \
                                and child.get("location"):
                            return child.get("location").strip()
        return ""


def _part_problem(outline: WsdlOutline, types, part: etree._Element) -> str | None:
    for attribute, lookup in (("element", "get_element"), ("type", "get_type")):
        qname = _qname(part, part.get(attribute), None, default_ns=True)
        if qname is None:
            continue
        try:
            getattr(types, lookup)(etree.QName(qname))
        except Exception:  # noqa: BLE001 - zeep raises LookupError or NamespaceError: either way undefined
            namespace = etree.QName(qname).namespace
            why = (f"; its namespace {namespace} is imported without a schemaLocation" if namespace in
                   outline.location_less else "")
            return f"part {part.get('name')}: {attribute} {qname} is defined in no loaded schema{why}"
    return None


def _reason(outline: WsdlOutline, types, binding: etree._Element, tns: str | None, name: str) -> str:
    port_type_name = _qname(binding, binding.get("type"), tns, default_ns=False)
    entry = outline.port_types.get(port_type_name or "")
    if entry is None:
        return f"portType {port_type_name} is defined in no document"
    port_type, pt_tns = entry
    abstract = next((op for op in port_type.findall(f"{{{WSDL}}}operation") if op.get("name") == name), None)
    if abstract is None:
        return f"portType {port_type_name} declares no operation {name}"
    for message_ref in abstract:
        if not isinstance(message_ref.tag, str) or etree.QName(message_ref).localname not in ("input", "output",
                                                                                             "fault"):
            continue
        kind = etree.QName(message_ref).localname
        message_name = _qname(message_ref, message_ref.get("message"), pt_tns, default_ns=False)
        message = outline.messages.get(message_name or "")
        if message is None:
            return f"its {kind} message {message_name} is defined in no document"
        for part in message[0].findall(f"{{{WSDL}}}part"):
            if problem := _part_problem(outline, types, part):
                return f"its {kind} message {message_name} cannot be read: {problem}"
    return "zeep left it out of the binding without saying why"


def part_references(outline: WsdlOutline, binding_name: str, name: str) -> list[tuple[str, str]]:
    """(what, Clark QName) of every element or type the messages of operation `name` of the raw binding
    `binding_name` use, `what` naming the message and part. Indexed once per binding."""
    index = outline.parts.get(binding_name)
    if index is None:
        index = outline.parts[binding_name] = _part_index(outline, binding_name)
    return index.get(name, [])


def _part_index(outline: WsdlOutline, binding_name: str) -> dict[str, list[tuple[str, str]]]:
    entry = outline.bindings.get(binding_name)
    if entry is None:
        return {}
    binding, tns = entry
    port_type = outline.port_types.get(_qname(binding, binding.get("type"), tns, default_ns=False) or "")
    if port_type is None:
        return {}
    index: dict[str, list[tuple[str, str]]] = {}
    for abstract in port_type[0].findall(f"{{{WSDL}}}operation"):
        found = index.setdefault(abstract.get("name") or "", [])
        for ref in abstract:
            message_name = _qname(ref, ref.get("message"), port_type[1], default_ns=False) \
                if isinstance(ref.tag, str) else None
            message = outline.messages.get(message_name or "")
            for part in message[0].findall(f"{{{WSDL}}}part") if message is not None else ():
                for attribute in ("element", "type"):
                    if qname := _qname(part, part.get(attribute), None, default_ns=True):
                        found.append((f"its {etree.QName(ref).localname} message {message_name}, part "
                                      f"{part.get('name')}", qname))
    return index


def dropped_operations(outline: WsdlOutline, types, binding_name: str, kept: set[str]) -> list[FailedOperation]:
    """Operations the raw binding `binding_name` (Clark notation) declares that zeep did not build."""
    entry = outline.bindings.get(binding_name)
    if entry is None:
        return []
    binding, tns = entry
    names = list(dict.fromkeys(op.get("name") for op in binding.findall(f"{{{WSDL}}}operation") if op.get("name")))
    return [FailedOperation(name, _reason(outline, types, binding, tns, name)) for name in names if name not in kept]


def dropped_ports(outline: WsdlOutline, kept: set[tuple[str, str]]) -> list[str]:
    """Notes naming the ports zeep left out (their binding is undefined or unusable)."""
    notes = []
    for service, tns in outline.services:
        for port in service.findall(f"{{{WSDL}}}port"):
            if (service.get("name"), port.get("name")) in kept:
                continue
            binding = _qname(port, port.get("binding"), tns, default_ns=False)
            why = ("names no binding" if binding is None else
                   f"its binding {binding} is defined in no document (or was left out, as noted)"
                   if binding not in outline.bindings else f"its binding {binding} is not usable (not SOAP or HTTP, or left out as noted)")
            notes.append(f"port {service.get('name')}/{port.get('name')} is left out: {why}")
    return notes

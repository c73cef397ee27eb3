"""Repairs for WSDL and XSD documents as they are found in the wild, before zeep reads them.

Each repair fixes a construct that other SOAP stacks accept and zeep trips on, and returns a
sentence naming what it did (the import lists it in its notes). The stored documents stay as
they were read; the repairs run again on every import, so a re-import gives the same result.

- ``xsd:import``/``xsd:include`` placed directly in ``wsdl:types`` (no ``xsd:schema`` around
  them) is read as if wrapped in a schema; zeep ignores it, so every type it brings is missing.
- Namespace prefixes declared on an inner element (``<xs:extension xmlns:q1=...>``, common in
  WCF data-contract schemas) are also declared on the document root when that is unambiguous:
  zeep moves the children of included schemas under a new root and loses such declarations.
- A ``wsdl:binding`` without a ``type`` (the portType it implements) or a ``wsdl:port`` without
  a ``binding`` cannot be used: it is left out (and so are the ports using such a binding).
"""

from __future__ import annotations

import re
from xml.sax.saxutils import quoteattr

from lxml import etree

__all__ = ["drop_elements", "repair_document"]

XSD = "http://www.w3.org/2001/XMLSchema"
WSDL = "http://schemas.xmlsoap.org/wsdl/"
_PARSER = etree.XMLParser(resolve_entities=False, no_network=True)


def _wrap_bare_imports(root: etree._Element) -> list[str]:
    notes = []
    for types in root.iter(f"{{{WSDL}}}types"):
        bare = [child for child in types if child.tag in (f"{{{XSD}}}import", f"{{{XSD}}}include")]
        if not bare:
            continue
        schema = etree.SubElement(types, f"{{{XSD}}}schema")
        for child in bare:
            schema.append(child)
            notes.append(f"wsdl:types holds an xsd:{etree.QName(child).localname} of "
                         f"{child.get('schemaLocation') or child.get('namespace')} outside any xsd:schema; it is read "
                         "as if inside one")
    return notes


def _hoist_namespaces(root: etree._Element, content: bytes) -> etree._Element:
    """The document with its root also declaring every prefix inner elements bind to one namespace
    only, so the prefix still resolves when zeep moves the children under another root."""
    if content.count(b"xmlns:") <= sum(1 for prefix in root.nsmap if prefix):
        return root  # every prefixed declaration is on the root already (the common case): nothing to scan
    declared: dict[str, set[str]] = {}
    for node in root.iter():
        if not isinstance(node.tag, str):
            continue
        parent = node.getparent()
        inherited = parent.nsmap if parent is not None else {}
        for prefix, namespace in node.nsmap.items():
            if prefix is not None and inherited.get(prefix) != namespace:
                declared.setdefault(prefix, set()).add(namespace)
    wanted = {prefix: next(iter(spaces)) for prefix, spaces in declared.items()
              if len(spaces) == 1 and prefix not in root.nsmap}
    if not wanted:
        return root
    # Written into the start tag and parsed again: moving the children under a new root would make
    # lxml drop declarations it deems redundant, which breaks prefixes used in attribute values.
    raw = etree.tostring(root)
    end = re.search(rb"[\s/>]", raw).start()
    declarations = "".join(f" xmlns:{prefix}={quoteattr(namespace)}" for prefix, namespace in sorted(wanted.items()))
    return etree.fromstring(raw[:end] + declarations.encode() + raw[end:], _PARSER)


def _drop_unbound(root: etree._Element) -> list[str]:
    notes = []
    if root.tag != f"{{{WSDL}}}definitions":
        return notes
    for binding in root.findall(f"{{{WSDL}}}binding"):
        if not binding.get("type"):
            root.remove(binding)
            notes.append(f"binding {binding.get('name')} names no portType (no type attribute): it and the ports "
                         "using it are left out")
    for service in root.findall(f"{{{WSDL}}}service"):
        for port in service.findall(f"{{{WSDL}}}port"):
            if not port.get("binding"):
                service.remove(port)
                notes.append(f"port {service.get('name')}/{port.get('name')} names no binding: it is left out")
    return notes


def repair_document(root: etree._Element, content: bytes) -> tuple[etree._Element, list[str]]:
    """The repaired document parsed from `content` (`root` changed in place, or a new root) and
    sentences saying what changed; an unchanged document comes back as `root` with no sentence."""
    notes = _wrap_bare_imports(root)
    notes += _drop_unbound(root)
    return _hoist_namespaces(root, content), notes


def drop_elements(documents: dict[str, bytes], tags: tuple[str, ...], attribute: str,
                  qname: etree.QName) -> dict[str, bytes]:
    """Copies of the documents in which elements `tags` whose `attribute` names `qname` are removed
    (e.g. the bindings of a portType no document defines). Unprefixed names are read in the
    document's targetNamespace, as WSDL 1.1 tools commonly do."""
    changed = {}
    for location, content in documents.items():
        try:
            root = etree.fromstring(content, etree.XMLParser(resolve_entities=False, no_network=True))
        except etree.XMLSyntaxError:
            continue
        tns = root.get("targetNamespace")
        hit = False
        for node in list(root.iter(*tags)):
            value = node.get(attribute) or ""
            prefix, _, local = value.rpartition(":")
            namespace = node.nsmap.get(prefix) if prefix else node.nsmap.get(None, tns)
            if local == qname.localname and namespace in (qname.namespace, None if prefix else tns) \
                    and node.getparent() is not None:
                node.getparent().remove(node)
                hit = True
        if hit:
            changed[location] = etree.tostring(root, xml_declaration=True, encoding="utf-8")
    return changed

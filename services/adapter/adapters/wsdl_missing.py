"""Companion documents that cannot be read: load the rest, and name what needed them.

A WSDL whose xsd:import, xsd:include or wsdl:import points at a document that is missing (a
file left out of the upload, a 404, a host the import may not reach) still has operations that
never touch it. The import answers such a location with an empty document of the imported
namespace (a stand-in) and goes on; afterwards every operation whose messages need a definition
of that namespace, directly or through other types, is reported as failed, naming the document.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lxml import etree
from zeep.loader import absolute_location

__all__ = ["MissingImports", "stand_in"]

XSD = "http://www.w3.org/2001/XMLSchema"
WSDL = "http://schemas.xmlsoap.org/wsdl/"
_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=False)
_REFERENCES = ("type", "base", "ref", "itemType", "substitutionGroup", "element")


def _clark(node: etree._Element, value: str | None) -> str | None:
    """An XSD QName attribute in Clark notation (unprefixed: the default namespace)."""
    if not value:
        return None
    prefix, _, local = value.strip().rpartition(":")
    namespace = node.nsmap.get(prefix or None)
    return f"{{{namespace}}}{local}" if namespace else local


def _namespace(qname: str) -> str:
    return qname[1:qname.index("}")] if qname.startswith("{") else ""


def stand_in(documents: dict[str, bytes], location: str) -> tuple[bytes, str] | None:
    """(an empty document standing in for `location`, the namespace it was imported for), or None
    when no loaded document imports or includes `location` (then it is not a companion)."""
    for base, content in documents.items():
        try:
            root = etree.fromstring(content, _PARSER)
        except etree.XMLSyntaxError:
            continue
        for node in root.iter(f"{{{XSD}}}import", f"{{{XSD}}}include", f"{{{XSD}}}redefine", f"{{{WSDL}}}import"):
            target = node.get("schemaLocation") if node.tag != f"{{{WSDL}}}import" else node.get("location")
            if not target or absolute_location(target.strip(), base) != location:
                continue
            if node.tag == f"{{{WSDL}}}import":
                namespace = node.get("namespace") or ""
                tns = f' targetNamespace="{namespace}"' if namespace else ""
                return f'<wsdl:definitions xmlns:wsdl="{WSDL}"{tns}/>'.encode(), namespace
            if node.tag == f"{{{XSD}}}import":
                namespace = node.get("namespace") or ""
            else:  # an include takes the including schema's namespace
                schema = next((a for a in node.iterancestors(f"{{{XSD}}}schema")), None)
                namespace = schema.get("targetNamespace") or "" if schema is not None else ""
            tns = f' targetNamespace="{namespace}"' if namespace and node.tag == f"{{{XSD}}}import" else ""
            return f'<xs:schema xmlns:xs="{XSD}"{tns}/>'.encode(), namespace
    return None


@dataclass
class MissingImports:
    """The companion documents that could not be read: location -> (namespace, why)."""

    documents: dict[str, tuple[str, str]] = field(default_factory=dict)
    needs: dict[str, str] = field(default_factory=dict)  # global component (Clark) -> missing location
    defined: frozenset[str] = frozenset()

    hints: dict[str, str] = field(default_factory=dict)

    def add(self, location: str, namespace: str, reason: str, hint: str = "") -> None:
        self.documents[location] = (namespace, reason)
        self.hints[location] = hint

    def notes(self) -> list[str]:
        return [f"the import {location}{f' (namespace {ns})' if ns else ''} {reason}: the operations that need "
                "its definitions are left out (listed as failed), the others work"
                + (f" ({self.hints[location]})" if self.hints.get(location) else "")
                for location, (ns, reason) in self.documents.items()]

    def trace(self, documents: dict[str, bytes]) -> None:
        """Find every global schema component that needs, directly or through others, a definition
        that only the missing documents could hold (an undefined name of their namespace)."""
        by_namespace = {ns: location for location, (ns, _) in self.documents.items()}
        uses: dict[str, set[str]] = {}
        for content in documents.values():
            try:
                root = etree.fromstring(content, _PARSER)
            except etree.XMLSyntaxError:
                continue
            for schema in root.iter(f"{{{XSD}}}schema"):
                tns = schema.get("targetNamespace") or ""
                for component in schema:
                    if not isinstance(component.tag, str) or not component.get("name"):
                        continue
                    name = f"{{{tns}}}{component.get('name')}" if tns else component.get("name")
                    found = uses.setdefault(name, set())
                    for node in component.iter():
                        if isinstance(node.tag, str):
                            found.update(q for q in (_clark(node, node.get(a)) for a in _REFERENCES) if q)
                            found.update(q for q in (_clark(node, v) for v in (node.get("memberTypes") or "").split())
                                         if q)
        self.defined = frozenset(uses)
        needs = {q: loc for refs in uses.values() for q in refs
                 if q not in self.defined and (loc := by_namespace.get(_namespace(q))) is not None}
        changed = True
        while changed:  # whoever uses a component that needs a missing definition needs it too
            changed = False
            for name, refs in uses.items():
                if name in needs:
                    continue
                hit = next((needs[q] for q in refs if q in needs), None)
                if hit is not None:
                    needs[name] = hit
                    changed = True
        self.needs = needs

    def needed_by(self, qname: str) -> str | None:
        """The missing location a message part's element or type (Clark) needs, if any."""
        if qname in self.needs:
            return self.needs[qname]
        if qname in self.defined:
            return None
        return next((loc for loc, (ns, _) in self.documents.items() if ns == _namespace(qname)), None)

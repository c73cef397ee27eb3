"""What zeep forgets: restriction facets and documentation, read from the raw schema documents.

zeep keeps a simple type's base but drops its facets (enumeration, pattern, lengths, bounds),
and keeps no xsd:documentation or wsdl:documentation. This index reads them from the documents
the import loaded. Named simple types are keyed by QName; anonymous ones by where they occur:
the nearest named anchor (a global complexType or element) and the local element names down
to them, the same path the schema generator walks (``@name`` for an attribute).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lxml import etree

__all__ = ["FacetIndex", "Facets"]

XSD = "http://www.w3.org/2001/XMLSchema"
WSDL = "http://schemas.xmlsoap.org/wsdl/"
_FACETS = ("minLength", "maxLength", "length", "minInclusive", "maxInclusive", "minExclusive", "maxExclusive",
           "totalDigits", "fractionDigits")


@dataclass
class Facets:
    enumeration: list[str] = field(default_factory=list)
    patterns: list[str] = field(default_factory=list)
    bounds: dict[str, str] = field(default_factory=dict)
    base: str | None = None  # Clark-notation QName of the restricted type, to merge its facets

    def merged(self, inherited: Facets | None) -> Facets:
        if inherited is None:
            return self
        return Facets(self.enumeration or inherited.enumeration, inherited.patterns + self.patterns,
                      inherited.bounds | self.bounds, inherited.base)


def _q(tag: str) -> str:
    return f"{{{XSD}}}{tag}"


def _qname(node: etree._Element, value: str | None, default_ns: str | None) -> str | None:
    if not value:
        return None
    prefix, _, local = value.rpartition(":")
    namespace = node.nsmap.get(prefix or None, default_ns if not prefix else None)
    return f"{{{namespace}}}{local}" if namespace else local


def _documentation(node: etree._Element, ns: str = XSD) -> str:
    texts = [" ".join("".join(doc.itertext()).split())
             for annotation in ([node] if ns == WSDL else node.findall(_q("annotation")))
             for doc in annotation.findall(f"{{{ns}}}documentation")]
    return " ".join(t for t in texts if t)


def _restriction_facets(simple: etree._Element) -> Facets | None:
    restriction = simple.find(_q("restriction"))
    if restriction is None:
        return None
    facets = Facets(base=_qname(restriction, restriction.get("base"), None))
    for child in restriction:
        if not isinstance(child.tag, str):
            continue
        local = etree.QName(child).localname
        value = child.get("value")
        if local == "enumeration" and value is not None:
            facets.enumeration.append(value)
        elif local == "pattern" and value is not None:
            facets.patterns.append(value)
        elif local in _FACETS and value is not None:
            facets.bounds[local] = value
    return facets


class FacetIndex:
    def __init__(self) -> None:
        self.named: dict[str, Facets] = {}
        self.local: dict[tuple[str, tuple[str, ...]], Facets] = {}
        self.docs: dict[tuple[str, tuple[str, ...]], str] = {}
        self.bases: dict[str, str] = {}  # complexType QName -> base QName (extension / restriction)
        self.operation_docs: dict[str, str] = {}

    @classmethod
    def from_documents(cls, documents: dict[str, bytes]) -> FacetIndex:
        index = cls()
        parser = etree.XMLParser(resolve_entities=False, no_network=True, remove_comments=True)
        for content in documents.values():
            try:
                root = etree.fromstring(content, parser)
            except etree.XMLSyntaxError:
                continue  # zeep reports it
            for schema in root.iter(_q("schema")):
                index._schema(schema)
            for op in root.iter(f"{{{WSDL}}}operation"):
                doc = _documentation(op, WSDL)
                if doc and op.get("name"):
                    index.operation_docs.setdefault(op.get("name"), doc)
        return index

    def _schema(self, schema: etree._Element) -> None:
        tns = schema.get("targetNamespace")
        for child in schema:
            if not isinstance(child.tag, str) or not child.get("name"):
                continue
            anchor = f"{{{tns}}}{child.get('name')}" if tns else child.get("name")
            if child.tag == _q("simpleType"):
                facets = _restriction_facets(child)
                if facets:
                    self.named[anchor] = facets
                self.docs[(anchor, ())] = _documentation(child)
            elif child.tag == _q("complexType"):
                self.docs[(anchor, ())] = _documentation(child)
                self._complex(child, anchor, ())
            elif child.tag == _q("element"):
                self.docs[(anchor, ())] = _documentation(child)
                self._element_content(child, anchor, ())

    def _element_content(self, element: etree._Element, anchor: str, path: tuple[str, ...]) -> None:
        simple = element.find(_q("simpleType"))
        if simple is not None and (facets := _restriction_facets(simple)):
            self.local[(anchor, path)] = facets
        complex_ = element.find(_q("complexType"))
        if complex_ is not None:
            self._complex(complex_, anchor, path)

    def _complex(self, node: etree._Element, anchor: str, path: tuple[str, ...]) -> None:
        for derivation in node.iter(_q("extension"), _q("restriction")):
            if derivation.getparent().tag in (_q("complexContent"), _q("simpleContent")) and not path:
                base = _qname(derivation, derivation.get("base"), None)
                if base:
                    self.bases[anchor] = base
                break
        for child in node.iter(_q("element"), _q("attribute")):
            if child.get("name") is None or self._owner(child) is not node:
                continue
            key = (*path, ("@" if child.tag == _q("attribute") else "") + child.get("name"))
            if doc := _documentation(child):
                self.docs[(anchor, key)] = doc
            if child.tag == _q("attribute"):
                simple = child.find(_q("simpleType"))
                if simple is not None and (facets := _restriction_facets(simple)):
                    self.local[(anchor, key)] = facets
            else:
                self._element_content(child, anchor, key)

    @staticmethod
    def _owner(node: etree._Element) -> etree._Element | None:
        """The complexType a local element or attribute belongs to (skipping sequences, choices...)."""
        parent = node.getparent()
        while parent is not None and parent.tag != _q("complexType"):
            parent = parent.getparent()
        return parent

    def facets(self, qname: str | None, anchor: str | None, path: tuple[str, ...]) -> Facets | None:
        """Facets of a named simple type (merged down its restriction chain), else of the anonymous
        one at (anchor, path), looking through the anchor's base types for inherited members."""
        if qname and qname in self.named:
            return self._chain(qname, 0)
        for candidate in self._anchors(anchor):
            if (candidate, path) in self.local:
                found = self.local[(candidate, path)]
                return found.merged(self._chain(found.base, 0) if found.base in self.named else None)
        return None

    def documentation(self, anchor: str | None, path: tuple[str, ...]) -> str:
        for candidate in self._anchors(anchor):
            if doc := self.docs.get((candidate, path)):
                return doc
        return ""

    def _anchors(self, anchor: str | None):
        seen = set()
        while anchor and anchor not in seen:
            seen.add(anchor)
            yield anchor
            anchor = self.bases.get(anchor)

    def _chain(self, qname: str, depth: int) -> Facets:
        facets = self.named[qname]
        if facets.base in self.named and depth < 20:
            return facets.merged(self._chain(facets.base, depth + 1))
        return facets

"""XSD constructs zeep reads but does not model, found in the WSDL's documents and named in the import's
notes (never dropped silently): substitution groups, mixed content, redefinitions, identity constraints."""

from __future__ import annotations

from lxml import etree

__all__ = ["unmapped_constructs"]

XS = "http://www.w3.org/2001/XMLSchema"
_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=False)


def _name(node: etree._Element) -> str:
    while node is not None:
        if node.get("name"):
            return node.get("name")
        node = node.getparent()
    return "(anonymous)"


def unmapped_constructs(documents: dict[str, bytes]) -> list[str]:
    notes: list[str] = []
    for location in sorted(documents):
        try:
            root = etree.fromstring(documents[location], _PARSER)
        except etree.XMLSyntaxError:
            continue  # the import itself reports unreadable documents
        for element in root.iter(f"{{{XS}}}element"):
            head = element.get("substitutionGroup")
            if head:
                notes.append(f"element {element.get('name')} substitutes for {head.split(':')[-1]} (substitution "
                             f"group): only the head's declared type is accepted and returned, not "
                             f"{element.get('name')}'s own fields")
        for complex_type in root.iter(f"{{{XS}}}complexType", f"{{{XS}}}complexContent"):
            if complex_type.get("mixed") in ("true", "1"):
                notes.append(f"{_name(complex_type)} has mixed content: the text between its child elements is "
                             "not mapped")
        for node in root.iter(f"{{{XS}}}redefine", f"{{{XS}}}override"):
            notes.append(f"xs:{etree.QName(node).localname} of {node.get('schemaLocation')}: the redefined types "
                         "are used as zeep resolves them; check their schemas")
        for node in root.iter(f"{{{XS}}}key", f"{{{XS}}}keyref", f"{{{XS}}}unique"):
            notes.append(f"identity constraint {node.get('name')} (xs:{etree.QName(node).localname}) is not checked")
    return list(dict.fromkeys(notes))

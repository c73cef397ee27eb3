"""XSD types (as zeep resolved them) -> JSON Schema (draft 2020-12).

Property names are the keyword names zeep accepts and returns for each type (flattened
sequences and single choices, ``_value_N`` for repeated groups and xsd:any), so a JSON
object that validates here is exactly what the call converts into a SOAP body. Named
complex types become ``$defs`` (recursive types are references); facets zeep drops come
from the FacetIndex. In "input" mode optional members may be absent; in "output" mode
every member is present and absent ones are null (that is what a response carries).
What has no faithful JSON form is named in ``notes`` rather than dropped.
"""

from __future__ import annotations

import re

from zeep.xsd import AnyObject, ComplexType, Element  # noqa: F401 - re-exported for the walkers
from zeep.xsd.elements.any import Any, AnyAttribute
from zeep.xsd.elements.indicators import Choice, OrderIndicator
from zeep.xsd.types.any import AnyType
from zeep.xsd.types.collection import ListType, UnionType

from libs.safe_schema import UnsupportedPattern, compile_pattern
from services.adapter.adapters.xsd_facets import FacetIndex, Facets
from services.adapter.adapters.xsd_structure import choice_rule, options, reachable, structure

__all__ = ["SchemaBuilder", "builtin_name"]

XSD = "http://www.w3.org/2001/XMLSchema"
_INTEGER_BOUNDS = {
    "integer": (None, None), "long": (-2**63, 2**63 - 1), "int": (-2**31, 2**31 - 1), "short": (-2**15, 2**15 - 1),
    "byte": (-128, 127), "nonNegativeInteger": (0, None), "positiveInteger": (1, None),
    "nonPositiveInteger": (None, 0), "negativeInteger": (None, -1), "unsignedLong": (0, 2**64 - 1),
    "unsignedInt": (0, 2**32 - 1), "unsignedShort": (0, 65535), "unsignedByte": (0, 255),
}
_STRING_FORMATS = {"dateTime": "date-time", "date": "date", "time": "time", "duration": "duration", "anyURI": "uri"}
_PATTERNS = {"gYear": r"^-?\d{4,}(Z|[+-]\d{2}:\d{2})?$", "gYearMonth": r"^-?\d{4,}-\d{2}(Z|[+-]\d{2}:\d{2})?$",
             "gMonth": r"^--\d{2}(Z|[+-]\d{2}:\d{2})?$", "gDay": r"^---\d{2}(Z|[+-]\d{2}:\d{2})?$",
             "gMonthDay": r"^--\d{2}-\d{2}(Z|[+-]\d{2}:\d{2})?$", "hexBinary": r"^([0-9a-fA-F]{2})*$",
             "decimal": r"^[+-]?(\d+(\.\d*)?|\.\d+)$"}


def builtin_name(xsd_type: object) -> str | None:
    """The XML Schema built-in a simple type derives from ('string', 'decimal'...), if any."""
    for klass in type(xsd_type).__mro__:
        qname = getattr(klass, "_default_qname", None)
        if qname is not None and klass.__module__.startswith("zeep.xsd.types.builtins"):
            return qname.localname
    return None


def _nullable(schema: dict) -> dict:
    kind = schema.get("type")
    if isinstance(kind, str) and "enum" not in schema:
        return {**schema, "type": [kind, "null"]}
    if isinstance(kind, list) and "enum" not in schema:
        return {**schema, "type": [*kind, "null"]} if "null" not in kind else schema
    return {"anyOf": [schema, {"type": "null"}]}


def _apply_facets(schema: dict, facets: Facets | None, kind: str | None) -> dict:
    if facets is None:
        return schema
    schema = dict(schema)
    if facets.enumeration:
        if schema.get("type") == "integer":
            values = [int(v) for v in facets.enumeration if re.fullmatch(r"[+-]?\d+", v.strip())]
        else:
            values = list(facets.enumeration)
        schema["enum"] = values
    # XSD patterns are implicitly anchored; JSON Schema ones are not. Patterns are matched with RE2
    # (libs.safe_schema): one it cannot run (XSD class subtraction, \\i \\c...) is left to the service.
    anchored, skipped = [], []
    for pattern in facets.patterns:
        try:
            compile_pattern(f"^(?:{pattern})$")
            anchored.append(f"^(?:{pattern})$")
        except UnsupportedPattern:
            skipped.append(pattern)
    if len(anchored) == 1:
        schema["pattern"] = anchored[0]
    elif anchored:
        schema["allOf"] = [{"pattern": p} for p in anchored]
    if skipped:
        schema["description"] = (schema.get("description", "") + " Must match the XML Schema pattern "
                                 + " and ".join(repr(p) for p in skipped) + " (checked by the service).").strip()
    numeric = schema.get("type") in ("integer", "number") or kind in ("decimal", "float", "double")
    for name, value in facets.bounds.items():
        try:
            if name in ("minLength", "maxLength", "length") and not numeric:
                key = {"minLength": ["minLength"], "maxLength": ["maxLength"],
                       "length": ["minLength", "maxLength"]}[name]
                for k in key:
                    schema[k] = int(value)
            elif numeric and name in ("minInclusive", "maxInclusive", "minExclusive", "maxExclusive"):
                target = {"minInclusive": "minimum", "maxInclusive": "maximum", "minExclusive": "exclusiveMinimum",
                          "maxExclusive": "exclusiveMaximum"}[name]
                number = float(value) if any(c in value for c in ".eE") else int(value)
                if schema.get("type") in ("integer", "number"):
                    schema[target] = number
                else:
                    schema.setdefault("description", "")
                    schema["description"] = (schema["description"] + f" {target} {value}.").strip()
            elif name in ("totalDigits", "fractionDigits"):
                schema["description"] = (schema.get("description", "") + f" {name} {value}.").strip()
        except ValueError:
            continue
    return schema


class SchemaBuilder:
    def __init__(self, index: FacetIndex, mode: str = "input") -> None:
        self.index, self.mode = index, mode
        self.defs: dict[str, dict] = {}
        self._def_names: dict[str, str] = {}
        self._keep: list[object] = []
        self.notes: list[str] = []

    # -- entry point ------------------------------------------------------------------------------
    def message(self, body: Element | None, context: str) -> dict:
        """The object schema of one SOAP body (the keyword arguments zeep takes or returns). One builder
        may serve many messages: named types are built once and shared."""
        if body is None:
            schema: dict = {"type": "object", "properties": {}, "additionalProperties": False}
        else:
            anchor = body.qname.text if getattr(body, "qname", None) is not None else None
            body_type = body.type
            if isinstance(body_type, ComplexType) and not body_type._array_type:
                schema = self._complex_inline(body_type, anchor, (), context)
            else:
                inner = self._type(body_type, anchor, (), context)
                schema = {"type": "object", "properties": {body.name: inner}, "additionalProperties": False,
                          "required": [body.name]}
        used = reachable(schema, self.defs)
        if used:
            schema = {**schema, "$defs": {name: self.defs[name] for name in self.defs if name in used}}
        return schema

    # -- types -------------------------------------------------------------------------------------
    def _type(self, xsd_type: object, anchor: str | None, path: tuple[str, ...], context: str) -> dict:
        if isinstance(xsd_type, ComplexType):
            if xsd_type._array_type is not None:
                return self._soap_array(xsd_type, context)
            if xsd_type.qname is not None:
                return self._ref(xsd_type, anchor, path, context)
            return self._complex_inline(xsd_type, anchor, path, context)
        return self._simple(xsd_type, anchor, path, context)

    def _ref(self, xsd_type: ComplexType, anchor: str | None, path: tuple[str, ...], context: str) -> dict:
        """A reference to the definition of a complex type. A named (global) type is keyed by its QName.
        An anonymous one carries the name of its element in zeep, and local elements of one name may
        declare different types, so it is keyed by the type object itself and read at its own place
        (anchor and path) in the schema."""
        if getattr(xsd_type, "is_global", True):
            key, anchor, path = xsd_type.qname.text, xsd_type.qname.text, ()
        else:
            key = f"anonymous:{id(xsd_type)}"
            self._keep.append(xsd_type)  # the id stays unique while the builder lives
        if key not in self._def_names:
            base = re.sub(r"[^A-Za-z0-9_.-]", "_", xsd_type.qname.localname) or "type"
            name, n = base, 2
            while name in self.defs:
                name, n = f"{base}_{n}", n + 1
            self._def_names[key] = name
            self.defs[name] = {}  # placeholder: recursive references find it
            try:
                self.defs[name] = self._complex_inline(xsd_type, anchor, path, context)
            except Exception:
                # the operation fails; the next one that uses this type tries again, not an empty def
                del self.defs[name], self._def_names[key]
                raise
        return {"$ref": f"#/$defs/{self._def_names[key]}"}

    def _soap_array(self, xsd_type: ComplexType, context: str) -> dict:
        item_type = getattr(xsd_type._array_type, "array_type", None)
        items = self._type(item_type, None, (), context) if item_type is not None else {}
        if item_type is None:
            self.notes.append(f"{context}: SOAP-encoded array {xsd_type.qname} declares no item type; items are "
                              "untyped")
        return {"type": "array", "items": items, "description": "SOAP-encoded array"}

    def _simple(self, xsd_type: object, anchor: str | None, path: tuple[str, ...], context: str) -> dict:
        if isinstance(xsd_type, ListType):
            return {"type": "array", "items": self._simple(xsd_type.item_type, None, (), context)}
        if isinstance(xsd_type, UnionType):
            return {"anyOf": [self._simple(t, None, (), context) for t in xsd_type.item_types]}
        kind = builtin_name(xsd_type)
        if kind is None:
            if not isinstance(xsd_type, AnyType) or type(xsd_type) is not AnyType:
                self.notes.append(f"{context}: type {getattr(xsd_type, 'qname', xsd_type)} is not a known XML "
                                  "Schema type; any JSON value is accepted")
            return {}
        schema = self._builtin(kind)
        qname = getattr(xsd_type, "qname", None)
        named = qname.text if qname is not None and qname.namespace != XSD else None
        return _apply_facets(schema, self.index.facets(named, anchor, path), kind)

    def _builtin(self, kind: str) -> dict:
        if kind == "boolean":
            return {"type": "boolean"}
        if kind in _INTEGER_BOUNDS:
            low, high = _INTEGER_BOUNDS[kind]
            schema: dict = {"type": "integer"}
            if low is not None:
                schema["minimum"] = low
            if high is not None:
                schema["maximum"] = high
            return schema
        if kind in ("float", "double"):
            return {"type": "number"} if self.mode == "input" else {
                "type": ["number", "string"], "description": "INF, -INF and NaN come as strings"}
        if kind == "decimal":
            # Precision matters (money): strings both ways; numbers accepted on input.
            return ({"type": ["string", "number"], "pattern": _PATTERNS["decimal"]} if self.mode == "input"
                    else {"type": "string", "pattern": _PATTERNS["decimal"]})
        if kind == "base64Binary":
            return {"type": "string", "contentEncoding": "base64"}
        if kind in _STRING_FORMATS:
            return {"type": "string", "format": _STRING_FORMATS[kind]}
        if kind in _PATTERNS:
            return {"type": "string", "pattern": _PATTERNS[kind]}
        if kind in ("anyType", "anySimpleType"):
            return {}
        return {"type": "string"}

    # -- complex content ---------------------------------------------------------------------------
    def _complex_inline(self, xsd_type: ComplexType, anchor: str | None, path: tuple[str, ...],
                        context: str) -> dict:
        optional, choices = structure(xsd_type._element)
        properties: dict[str, dict] = {}
        required: list[str] = []
        for name, member in xsd_type.elements:
            schema, is_required = self._member(name, member, anchor, path, context, name in optional)
            properties[name] = schema
            if is_required:
                required.append(name)
        for name, attribute in xsd_type.attributes:
            if isinstance(attribute, AnyAttribute):
                properties[name] = {"type": "object", "additionalProperties": {"type": "string"},
                                    "description": "attributes of other namespaces (xsd:anyAttribute)"}
                continue
            schema = self._simple(attribute.type, anchor, (*path, f"@{attribute.name}"), context)
            if attribute.default is not None:
                schema = {**schema, "default": attribute.default}
            if attribute.required and self.mode == "input":
                required.append(name)
            elif self.mode == "output" and not attribute.required:
                schema = _nullable(schema)
            properties[name] = schema
        schema = {"type": "object", "properties": properties, "additionalProperties": False}
        if required:
            schema["required"] = required
        if doc := self.index.documentation(anchor, path):
            schema["description"] = doc
        if self.mode == "input":
            rules = [choice_rule(group, optional_choice) for group, optional_choice in choices]
            if len(rules) == 1:
                schema.update(rules[0])
            elif rules:
                schema["allOf"] = rules
        return schema

    def _member(self, name: str, member: object, anchor: str | None, path: tuple[str, ...], context: str,
                optional: bool) -> tuple[dict, bool]:
        if isinstance(member, Any):
            schema: dict = {"type": "string", "description": "an XML fragment (xsd:any)"} \
                if self.mode == "input" else {"description": "XML content (xsd:any) as JSON"}
            multiple = member.max_occurs != 1
            return ({"type": "array", "items": schema} if multiple else schema), False
        if isinstance(member, OrderIndicator):  # a repeated sequence or choice: a list of objects
            item = self._indicator_item(member, anchor, path, context)
            return {"type": "array", "items": item}, self.mode == "input" and member.min_occurs > 0 and not optional
        element: Element = member
        if element.is_global or getattr(element, "ref", None) is not None:
            e_anchor, e_path = element.qname.text if element.qname is not None else anchor, ()
        else:
            e_anchor, e_path = anchor, (*path, element.name)
        schema = self._type(element.type, e_anchor, e_path, context)
        if doc := self.index.documentation(e_anchor, e_path):
            schema = {**schema, "description": doc} if "$ref" not in schema else {"allOf": [schema],
                                                                                     "description": doc}
        if element.default is not None:
            schema = {**schema, "default": element.default}
        is_optional = optional or element.min_occurs == 0
        if element.nillable or (self.mode == "output" and is_optional and element.max_occurs == 1):
            schema = _nullable(schema)
        if element.max_occurs != 1:
            schema = {"type": "array", "items": schema}
            if element.min_occurs > 1:
                schema["minItems"] = element.min_occurs
            if element.max_occurs != "unbounded":
                schema["maxItems"] = element.max_occurs
        return schema, not is_optional and (self.mode == "input" or element.max_occurs == 1)

    def _indicator_item(self, indicator: OrderIndicator, anchor: str | None, path: tuple[str, ...],
                        context: str) -> dict:
        properties = {}
        for name, member in indicator.elements:
            properties[name], _ = self._member(name, member, anchor, path, context, True)
        item: dict = {"type": "object", "properties": properties, "additionalProperties": False}
        if isinstance(indicator, Choice) and self.mode == "input":
            item.update(choice_rule(options(indicator), False))
        return item

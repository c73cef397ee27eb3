"""JSON arguments -> zeep values for a SOAP body, and zeep results -> plain JSON.

Inbound, JSON strings in a non-string XSD type are read as that type's XML lexical form
(``"2024-03-01"`` for a date, base64 text for base64Binary), decimals become Decimal
without passing through float, and xsd:any takes an XML fragment. Outbound, dates and
durations are ISO 8601, decimals are strings (precision matters), bytes are base64,
nil is null, any XML is turned into JSON (attributes as ``@name``, text as ``#text``).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import math
from decimal import Decimal, InvalidOperation

import isodate
from lxml import etree
from zeep.xsd import AnyObject, CompoundValue
from zeep.xsd.elements.any import Any
from zeep.xsd.elements.indicators import OrderIndicator
from zeep.xsd.types.collection import ListType
from zeep.xsd.types.complex import ComplexType
from zeep.xsd.valueobjects import ArrayValue

from libs.errors import ValidationFailed
from services.adapter.adapters.json_schema import _INTEGER_BOUNDS, builtin_name

__all__ = ["body_arguments", "header_arguments", "to_json", "xml_to_json"]

_STRINGS = {"string", "normalizedString", "token", "language", "Name", "NCName", "NMTOKEN", "NMTOKENS", "ID",
            "IDREF", "IDREFS", "ENTITY", "ENTITIES", "anyURI", "QName", "NOTATION", "anyType", "anySimpleType"}


def body_arguments(body, arguments: dict) -> tuple[tuple, dict]:
    """(args, kwargs) for zeep's message serializer of `body` (a zeep Element or None)."""
    if body is None:
        return (), {}
    if isinstance(body.type, ComplexType) and body.type._array_type is None:
        return (), _complex(body.type, arguments, "")
    return (_value(body.type, arguments.get(body.name), body.name),), {}


def header_arguments(header, values: dict) -> dict:
    """The `_soapheaders` mapping zeep renders into the envelope's Header, from the JSON object of
    header parts (the input schema's `_soapheaders`)."""
    if header is None or not isinstance(header.type, ComplexType):
        raise ValidationFailed("this operation declares no SOAP header", field="_soapheaders")
    return _complex(header.type, values, "_soapheaders")


def _where(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _complex(xsd_type: ComplexType, data: dict, path: str) -> dict:
    if not isinstance(data, dict):
        raise ValidationFailed(f"must be an object, not {type(data).__name__}", field=path or "(root)")
    members = dict(xsd_type.elements)
    attributes = dict(xsd_type.attributes)
    result = {}
    for key, value in data.items():
        where = _where(path, key)
        if key in members:
            result[key] = _member(members[key], value, where)
        elif key in attributes:
            attribute = attributes[key]
            result[key] = value if not hasattr(attribute, "type") else _value(attribute.type, value, where)
        else:
            raise ValidationFailed("is not a member of this type", field=where,
                                   hint=f"use one of {', '.join([*members, *attributes]) or '(none)'}")
    return result


def _member(member, value, path: str):
    if value is None:
        return None
    if isinstance(member, Any):
        return [_fragment(v, f"{path}[{i}]") for i, v in enumerate(value)] if isinstance(value, list) \
            else _fragment(value, path)
    if isinstance(member, OrderIndicator):
        names = dict(member.elements)
        items = value if isinstance(value, list) else [value]
        return [{k: _member(names[k], v, f"{path}[{i}].{k}") if k in names else _unknown(f"{path}[{i}].{k}", names)
                 for k, v in item.items()} for i, item in enumerate(items)]
    if member.max_occurs != 1 and isinstance(value, list):
        return [_value(member.type, v, f"{path}[{i}]") for i, v in enumerate(value)]
    return _value(member.type, value, path)


def _unknown(path: str, names: dict):
    raise ValidationFailed("is not a member of this group", field=path, hint=f"use one of {', '.join(names)}")


def _fragment(value, path: str):
    if not isinstance(value, str):
        raise ValidationFailed("must be an XML fragment (a string)", field=path)
    try:
        return etree.fromstring(value, etree.XMLParser(resolve_entities=False, no_network=True))
    except etree.XMLSyntaxError as exc:
        raise ValidationFailed(f"is not well-formed XML: {exc}", field=path) from None


def _value(xsd_type, value, path: str):
    if value is None:
        return None
    if isinstance(xsd_type, ComplexType):
        if xsd_type._array_type is not None:
            item_type = getattr(xsd_type._array_type, "array_type", None)
            items = value if isinstance(value, list) else [value]
            converted = [_value(item_type, v, f"{path}[{i}]") if item_type is not None else v
                         for i, v in enumerate(items)]
            return xsd_type(converted)
        return _complex(xsd_type, value, path)
    if isinstance(xsd_type, ListType):
        items = value if isinstance(value, list) else str(value).split()
        return [_value(xsd_type.item_type, v, f"{path}[{i}]") for i, v in enumerate(items)]
    kind = builtin_name(xsd_type)
    if kind in _INTEGER_BOUNDS and isinstance(value, float) and value.is_integer():
        return int(value)  # JSON numbers that crossed protobuf Struct arrive as doubles
    if kind == "decimal":
        try:
            return Decimal(str(value)) if not isinstance(value, bool) else _bad(path, value, kind)
        except InvalidOperation:
            return _bad(path, value, kind)
    if kind == "base64Binary" and isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            return _bad(path, value, kind)
    if isinstance(value, str) and kind not in _STRINGS and kind is not None:
        try:
            return xsd_type.pythonvalue(value.strip())
        except (ValueError, TypeError, ArithmeticError, isodate.ISO8601Error):
            return _bad(path, value, kind)
    return value


def _bad(path: str, value, kind: str):
    raise ValidationFailed(f"{str(value)[:40]!r} is not a valid xsd:{kind}", field=path,
                           hint="dates as 2024-03-01, times as 2024-03-01T09:30:00Z, decimals as \"12.50\"")


def to_json(value):
    """A zeep result as plain JSON (see the module docstring for the conventions)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else ("NaN" if math.isnan(value) else ("INF" if value > 0 else "-INF"))
    if isinstance(value, Decimal):
        return format(value, "f") if value.is_finite() else str(value)
    if isinstance(value, (CompoundValue, ArrayValue)) and not isinstance(value, list):
        return {key: to_json(item) for key, item in value.__values__.items()}
    if isinstance(value, (list, tuple, ArrayValue)):
        return [to_json(item) for item in value]
    if isinstance(value, dict):
        return {str(key): to_json(item) for key, item in value.items()}
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, (dt.timedelta, isodate.Duration)):
        return isodate.duration_isoformat(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, etree.QName):
        return value.text
    if isinstance(value, AnyObject):
        return to_json(value.value)
    if isinstance(value, etree._Element):
        return xml_to_json(value)
    return str(value)


def xml_to_json(element: etree._Element):
    """Untyped XML as JSON: children by local name (repeated ones as lists), @attributes, #text."""
    children = [c for c in element if isinstance(c.tag, str)]
    attributes = {f"@{etree.QName(k).localname}": v for k, v in element.attrib.items()}
    text = (element.text or "").strip()
    if not children and not attributes:
        return text or None
    result: dict = dict(attributes)
    for child in children:
        key = etree.QName(child).localname
        value = xml_to_json(child)
        if key in result:
            result[key] = result[key] if isinstance(result[key], list) else [result[key]]
            result[key].append(value)
        else:
            result[key] = value
    if text:
        result["#text"] = text
    return result

"""Proto3 JSON to a message, fast, for the plain payloads that make up nearly all stream traffic.

protobuf's `json_format.Parse` walks the JSON in pure Python, field by field, with a path string and
a few checks per value: on the memory commands stream it was about a tenth of the writer's CPU.
`parse_plain` takes the common case from `json.loads` straight into the message: string, bool,
integer, enum and double fields (finite numbers), repeated ones, nested messages of the same kinds,
and Struct fields (any JSON object). Whatever it is not certain to read exactly as `json_format`
would (another well-known type such as Timestamp, a float field, bytes, a map, a oneof, a null, a
number given as a string, an enum it does not know, an unknown or repeated field name, a lone
surrogate...) makes it answer None, and the caller parses the
payload with `json_format`, which gives the same message or the same precise error as always.
`tests/unit/test_fast_json.py` checks it against `json_format` on generated payloads.
"""

from __future__ import annotations

import json
import math
import re
from functools import cache

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

__all__ = ["parse_plain"]

# As json_format's: a lone surrogate is refused there, so it is left to it here.
_LONE_SURROGATE = re.compile("(?<![\ud800-\udbff])[\udc00-\udfff]|[\ud800-\udbff](?![\udc00-\udfff])")
_INT_TYPES = frozenset({FieldDescriptor.CPPTYPE_INT32, FieldDescriptor.CPPTYPE_INT64,
                        FieldDescriptor.CPPTYPE_UINT32, FieldDescriptor.CPPTYPE_UINT64})

# Kinds of field this parser reads itself.
_STRING, _BOOL, _INT, _ENUM, _MESSAGE, _DOUBLE, _STRUCT = range(7)
_EXACT_INT = 2 ** 53  # an integer a double holds exactly


class _NotPlain(Exception):
    """The payload is not one this parser reads exactly as json_format: json_format reads it."""


def _pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    result = dict(pairs)
    if len(result) != len(pairs):  # a repeated key: json_format refuses it, with its own error
        raise _NotPlain
    return result


_decoder = json.JSONDecoder(object_pairs_hook=_pairs)


@cache
def _fields(descriptor: Descriptor) -> dict[str, tuple[str, int, bool, object]] | None:
    """JSON name and field name -> (attribute, kind, repeated, enum numbers by name or nested descriptor);
    None when the message is a well-known type (json_format gives those their own JSON form)."""
    if descriptor.full_name.startswith("google.protobuf."):
        return None
    by_name: dict[str, tuple[str, int, bool, object] | None] = {}
    by_json_name: dict[str, tuple[str, int, bool, object] | None] = {}
    for f in descriptor.fields:
        by_name[f.name] = by_json_name[f.json_name] = _entry(f)
    return by_name | by_json_name  # a JSON name first, as json_format looks names up


def _entry(f: FieldDescriptor) -> tuple[str, int, bool, object] | None:
    """None: a field json_format reads (bytes, floats, maps, oneofs, well-known enums)."""
    if f.containing_oneof is not None or (f.message_type is not None and f.message_type.GetOptions().map_entry):
        return None
    extra: object = None
    if f.cpp_type == FieldDescriptor.CPPTYPE_STRING and f.type == FieldDescriptor.TYPE_STRING:
        kind = _STRING
    elif f.cpp_type == FieldDescriptor.CPPTYPE_BOOL:
        kind = _BOOL
    elif f.cpp_type in _INT_TYPES:
        kind = _INT
    elif f.cpp_type == FieldDescriptor.CPPTYPE_ENUM and not f.enum_type.full_name.startswith("google.protobuf."):
        kind, extra = _ENUM, ({v.name: v.number for v in f.enum_type.values},
                              frozenset(v.number for v in f.enum_type.values))
    elif f.cpp_type == FieldDescriptor.CPPTYPE_DOUBLE:
        kind = _DOUBLE
    elif f.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE and f.message_type.full_name == "google.protobuf.Struct":
        if f.is_repeated:
            return None
        kind = _STRUCT
    elif f.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
        kind, extra = _MESSAGE, f.message_type
    else:
        return None
    return (f.name, kind, f.is_repeated, extra)


def _scalar(kind: int, extra: object, value: object) -> object:
    if kind == _STRING:
        if type(value) is not str or (not value.isascii() and _LONE_SURROGATE.search(value)):
            raise _NotPlain
        return value
    if kind == _BOOL:
        if type(value) is not bool:
            raise _NotPlain
        return value
    if kind == _INT:
        if type(value) is not int:  # a bool, a float or a string: json_format's rules
            raise _NotPlain
        return value
    if kind == _DOUBLE:  # a finite number; "NaN", "Infinity" and numbers as strings are json_format's
        if not ((type(value) is float and math.isfinite(value)) or (type(value) is int and -_EXACT_INT < value < _EXACT_INT)):
            raise _NotPlain
        return float(value)
    by_name, numbers = extra  # _ENUM
    if type(value) is str and value in by_name:
        return by_name[value]
    if type(value) is int and value in numbers:
        return value
    raise _NotPlain


def _fill(message: Message, js: object) -> None:
    if type(js) is not dict:
        raise _NotPlain
    table = _fields(message.DESCRIPTOR)
    if table is None:
        raise _NotPlain
    seen: set[str] = set()
    for name, value in js.items():
        entry = table.get(name)
        if entry is None or value is None:
            raise _NotPlain
        attribute, kind, repeated, extra = entry
        if attribute in seen:  # both its JSON name and its field name: json_format's error
            raise _NotPlain
        seen.add(attribute)
        if repeated:
            if type(value) is not list:
                raise _NotPlain
            target = getattr(message, attribute)
            if kind == _MESSAGE:
                for item in value:
                    _fill(target.add(), item)
            else:
                target.extend([_scalar(kind, extra, item) for item in value])
        elif kind == _MESSAGE:
            sub = getattr(message, attribute)
            sub.SetInParent()
            _fill(sub, value)
        elif kind == _STRUCT:  # any JSON object, as json_format reads it (Struct.update converts alike)
            if type(value) is not dict:
                raise _NotPlain
            sub = getattr(message, attribute)
            sub.SetInParent()
            try:
                sub.update(value)
            except (ValueError, TypeError, OverflowError):  # e.g. a lone surrogate, a huge number
                raise _NotPlain from None
        else:
            setattr(message, attribute, _scalar(kind, extra, value))


def parse_plain(payload: str, message: Message) -> Message | None:
    """`message` filled from the proto3 JSON `payload`, as json_format.Parse would fill it; None (and
    `message` left in any state) when the payload is not a plain one: parse it with json_format then."""
    try:
        _fill(message, _decoder.decode(payload))
    except (_NotPlain, ValueError, TypeError, RecursionError):
        return None
    return message

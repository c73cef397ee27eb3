"""Structured queries: exact conditions over a memory's entity key, its typed fields and its attributes.

A condition is (field, op, value). Each field has a type, and the type decides which operators and
which values are accepted; anything else is refused with the precise field, reason and what to do.
The value's own JSON type decides how an attribute compares (a number numerically, a string as text).
No I/O here: the PostgreSQL adapter turns validated conditions into SQL.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from libs.errors import ValidationFailed
from libs.validation import check_uuid, quote

__all__ = ["ATTRIBUTE_PREFIX", "FIELDS", "OPS", "Condition", "StructuredQuery"]

ATTRIBUTE_PREFIX = "attributes."
MAX_CONDITIONS = 16
MAX_IN = 100
MAX_LIMIT = 1_000
DEFAULT_LIMIT = 50
MAX_PATH_DEPTH = 8
_SEGMENT = re.compile(r"[^\s.\x00-\x1f\"'\\]{1,64}")  # an attribute name: no dots, quotes, spaces or controls

# field -> its type. `value`: the entity value of a keyed memory (its content), typed as it parses.
FIELDS: dict[str, str] = {
    "key": "text", "value": "json", "memory_id": "uuid", "user_id": "text", "session_id": "text",
    "layer": "integer", "source": "integer", "confidence": "integer", "tags": "tags",
    "created_at": "time", "expires_at": "time", "content": "text",
}
_ORDER = ("eq", "ne", "gt", "gte", "lt", "lte", "in", "prefix", "contains", "exists")
OPS: dict[str, tuple[str, ...]] = {  # type -> the operators it takes
    "text": ("eq", "ne", "gt", "gte", "lt", "lte", "in", "prefix", "contains"),
    "uuid": ("eq", "ne", "in"),
    "integer": ("eq", "ne", "gt", "gte", "lt", "lte", "in"),
    "tags": ("contains", "in"),  # has this tag / has any of these
    "time": ("eq", "gt", "gte", "lt", "lte", "exists"),
    "json": _ORDER,
}
_COMPARISONS = ("gt", "gte", "lt", "lte")
_FIELD_HINT = (f"use one of {', '.join(FIELDS)}, or {ATTRIBUTE_PREFIX}<name>[.<name>...] for an attribute")


@dataclass(frozen=True)
class Condition:
    """`path`: the attribute path (attributes.customer -> ("customer",)); empty for a memory's own field."""

    field: str
    op: str
    value: object = None
    path: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        return "json" if self.path else FIELDS[self.field]

    def validated(self, where: str) -> Condition:
        field, path = self.field.strip(), ()
        if field.startswith(ATTRIBUTE_PREFIX):
            path = tuple(field[len(ATTRIBUTE_PREFIX):].split("."))
            if not 1 <= len(path) <= MAX_PATH_DEPTH or not all(_SEGMENT.fullmatch(s) for s in path):
                raise ValidationFailed(f"is {quote(field)}, which is not an attribute path", field=f"{where}.field",
                                       hint=f"write {ATTRIBUTE_PREFIX}name or {ATTRIBUTE_PREFIX}name.sub (at most "
                                            f"{MAX_PATH_DEPTH} names of 1-64 characters, no spaces or quotes)")
        elif field not in FIELDS:
            raise ValidationFailed(f"is {quote(field)}, which is no field a query can test", field=f"{where}.field",
                                   hint=_FIELD_HINT)
        c = replace(self, field=field, op=self.op.strip().lower(), path=path)
        allowed = OPS[c.kind]
        if c.op not in allowed:
            raise ValidationFailed(f"is {quote(self.op)}, which {field} does not take", field=f"{where}.op",
                                   hint=f"use one of {', '.join(allowed)}")
        return replace(c, value=_value(c, f"{where}.value"))


def _value(c: Condition, where: str) -> object:
    """The condition's value, checked against its field's type and operator, in its Python form."""
    v = c.value
    if c.op == "exists":
        if v is not None and not isinstance(v, bool):
            raise ValidationFailed("must be unset, true or false with exists", field=where,
                                   hint="exists tests that the field is present (false: absent)")
        return True if v is None else v
    if c.op == "in":
        if not isinstance(v, list) or not 1 <= len(v) <= MAX_IN:
            raise ValidationFailed(f"must be a list of 1 to {MAX_IN} values with in", field=where,
                                   hint='e.g. ["Acme", "Globex"]')
        values = [_scalar(c, item, f"{where}[{i}]") for i, item in enumerate(v)]
        if c.kind == "json" and len({type(x) for x in values}) > 1:
            raise ValidationFailed("mixes value types", field=where, hint="compare with values of one type")
        return values
    value = _scalar(c, v, where)
    if c.op in ("prefix", "contains") and c.kind in ("json", "text") and not isinstance(value, str):
        raise ValidationFailed(f"must be text with {c.op}", field=where, hint="give the text to look for")
    if c.op in _COMPARISONS and isinstance(value, bool):
        raise ValidationFailed(f"is a boolean, which {c.op} cannot order", field=where, hint="use eq or ne")
    return value


def _scalar(c: Condition, v: object, where: str) -> object:
    kind, name = c.kind, c.field
    if v is None or isinstance(v, (list, dict)):
        what = "missing" if v is None else f"a {'list' if isinstance(v, list) else 'object'}"
        raise ValidationFailed(f"is {what}; {name} {c.op} takes one value", field=where,
                               hint="give a string, number or boolean (a list only with in)")
    if isinstance(v, float) and not math.isfinite(v):
        raise ValidationFailed("is not a finite number", field=where, hint="give a finite number")
    if kind == "json":
        return int(v) if isinstance(v, float) and v.is_integer() and abs(v) < 2**53 else v
    if kind == "integer":
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not float(v).is_integer():
            raise ValidationFailed(f"is {_type(v)}; {name} takes a whole number", field=where,
                                   hint=f"e.g. {name} eq 1")
        return int(v)
    if not isinstance(v, str):
        raise ValidationFailed(f"is {_type(v)}; {name} takes a string", field=where, hint=f'e.g. {name} eq "..."')
    if kind == "uuid":
        return check_uuid(v, where)
    if kind == "time":
        try:
            at = datetime.fromisoformat(v.replace("Z", "+00:00"))
        except ValueError:
            raise ValidationFailed(f"is {quote(v)}, which is not a timestamp", field=where,
                                   hint="use ISO 8601, e.g. 2025-03-01T00:00:00Z") from None
        return at if at.tzinfo else at.replace(tzinfo=UTC)
    if not v:
        raise ValidationFailed("is empty", field=where, hint=f"give the {name} to compare with")
    return v


def _type(v: object) -> str:
    return {bool: "a boolean", str: "a string", int: "a number", float: "a number"}.get(type(v), type(v).__name__)


@dataclass(frozen=True)
class StructuredQuery:
    """Every condition must hold (AND). The tenant is the caller's (from its token); user and session narrow."""

    tenant_id: str
    conditions: tuple[Condition, ...]
    user_id: str = ""
    session_id: str = ""
    limit: int = 0
    include_archived: bool = False
    order_by: str = "created_at"
    ascending: bool = False
    order_path: tuple[str, ...] = ()

    def validated(self) -> StructuredQuery:
        if not self.tenant_id:
            raise ValidationFailed("is required", field="tenant.tenant_id")
        if not 1 <= len(self.conditions) <= MAX_CONDITIONS:
            raise ValidationFailed(f"has {len(self.conditions)} conditions; a query takes 1 to {MAX_CONDITIONS}",
                                   field="where", hint='e.g. {"field": "attributes.customer", "op": "eq", '
                                                       '"value": "Acme"}')
        if not 0 <= self.limit <= MAX_LIMIT:
            raise ValidationFailed(f"must be between 1 and {MAX_LIMIT} (0 means {DEFAULT_LIMIT})", field="limit")
        conditions = tuple(c.validated(f"where[{i}]") for i, c in enumerate(self.conditions))
        order_by, order_path = (self.order_by or "created_at").strip(), ()
        if order_by.startswith(ATTRIBUTE_PREFIX):
            order_path = Condition(order_by, "exists").validated("order_by").path
        elif order_by not in FIELDS or FIELDS[order_by] == "tags":
            raise ValidationFailed(f"is {quote(order_by)}, which a query cannot order by", field="order_by",
                                   hint=_FIELD_HINT.replace("use one of", "use created_at or one of") + " (not tags)")
        return replace(self, conditions=conditions, limit=self.limit or DEFAULT_LIMIT, order_by=order_by,
                       order_path=order_path)

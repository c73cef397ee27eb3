"""COM VARIANTs <-> JSON, without COM: pure conversion, testable on any host. No I/O here.

A `Variant(vt, value)` mirrors an automation VARIANT: `vt` is a VARTYPE (VT_* below, with VT_ARRAY
for a SAFEARRAY whose elements are of the base type, nested tuples for several dimensions).
Arguments go JSON -> Variant by the type the method allow-list declares (VT_VARIANT: inferred);
results come back as pywin32 gives them (ints, floats, str, bool, None, Decimal, datetime, tuples,
bytes) or as Variants, and leave as JSON: integers beyond 2^53 and decimals/currency as strings
(a protobuf Struct carries numbers as doubles), dates as ISO 8601 without an offset (automation
dates are wall-clock times with no zone), bytes as base64. What JSON cannot carry (an object
reference, a non-finite float) is refused naming its path, never dropped.
"""

from __future__ import annotations

import base64
import datetime as dt
import math
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from libs.errors import ValidationFailed

__all__ = ["VT", "Variant", "VariantError", "datetime_to_ole", "from_json", "ole_to_datetime", "to_json",
           "vt_name", "vt_of", "vt_schema"]

VT = {"VT_EMPTY": 0, "VT_NULL": 1, "VT_I2": 2, "VT_I4": 3, "VT_R4": 4, "VT_R8": 5, "VT_CY": 6, "VT_DATE": 7,
      "VT_BSTR": 8, "VT_DISPATCH": 9, "VT_ERROR": 10, "VT_BOOL": 11, "VT_VARIANT": 12, "VT_UNKNOWN": 13,
      "VT_DECIMAL": 14, "VT_I1": 16, "VT_UI1": 17, "VT_UI2": 18, "VT_UI4": 19, "VT_I8": 20, "VT_UI8": 21,
      "VT_INT": 22, "VT_UINT": 23}
VT_ARRAY, VT_BYREF = 0x2000, 0x4000
_NAMES = {v: k for k, v in VT.items()}
_INT_RANGES = {2: (-2**15, 2**15 - 1), 3: (-2**31, 2**31 - 1), 16: (-128, 127), 17: (0, 255), 18: (0, 2**16 - 1),
               19: (0, 2**32 - 1), 20: (-2**63, 2**63 - 1), 21: (0, 2**64 - 1), 22: (-2**31, 2**31 - 1),
               23: (0, 2**32 - 1)}
_EXACT = 2**53  # beyond this a JSON number (a double in a protobuf Struct) loses digits
_R4_MAX = 3.4028234663852886e38
_CY_MIN, _CY_MAX = Decimal(-2**63) / 10_000, Decimal(2**63 - 1) / 10_000
_DEC_MAX = Decimal(2**96 - 1)
OLE_EPOCH = dt.datetime(1899, 12, 30)
_OLE_MIN, _OLE_MAX = dt.datetime(100, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999000)


class VariantError(ValidationFailed):
    """A value that cannot cross between JSON and a VARIANT; `field` is its path."""


@dataclass(frozen=True)
class Variant:
    vt: int
    value: object = None


def vt_name(vt: int) -> str:
    base = _NAMES.get(vt & 0x0FFF, f"VT_{vt & 0x0FFF}")
    return ("VT_ARRAY|" if vt & VT_ARRAY else "") + ("VT_BYREF|" if vt & VT_BYREF else "") + base


def vt_of(name: str) -> int:
    """`VT_I4`, `VT_ARRAY|VT_BSTR` (or `VT_BSTR[]`) -> the VARTYPE; ValidationFailed naming unknown ones."""
    text = name.strip().upper()
    vt = 0
    if text.endswith("[]"):
        vt, text = VT_ARRAY, text[:-2]
    for part in text.split("|"):
        part = part.strip() if part.strip().startswith("VT_") else f"VT_{part.strip()}"
        if part == "VT_ARRAY":
            vt |= VT_ARRAY
        elif part in VT:
            vt |= VT[part]
        else:
            raise ValidationFailed(f"{name!r} is not an automation type", field="vt",
                                   hint="use VT_I4, VT_R8, VT_BSTR, VT_BOOL, VT_DATE, VT_CY, VT_DECIMAL, VT_VARIANT, "
                                        "... or VT_ARRAY|<type>")
    return vt


# --- dates -------------------------------------------------------------------------------------

def ole_to_datetime(days: float) -> dt.datetime:
    """An OLE automation date (days since 1899-12-30; before it, the fraction still counts forward
    from midnight: -1.25 is 1899-12-29 06:00) -> a naive datetime, to the millisecond."""
    if not math.isfinite(days):
        raise VariantError(f"{days} is not a date", field="")
    whole = math.trunc(days)
    ms = round(abs(days - whole) * 86_400_000)
    try:
        return OLE_EPOCH + dt.timedelta(days=whole, milliseconds=ms)
    except OverflowError:
        raise VariantError(f"{days} is outside the automation date range", field="") from None


def datetime_to_ole(value: dt.datetime) -> float:
    day = dt.datetime.combine(value.date(), dt.time())
    days = (day - OLE_EPOCH).days
    fraction = (value - day) / dt.timedelta(days=1)
    return days - fraction if days < 0 else days + fraction


def _date_in(value: object, path: str) -> dt.datetime:
    if isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value)
        except ValueError:
            raise VariantError(f"{value!r} is not an ISO 8601 date", field=path,
                               hint="e.g. 2024-03-01 or 2024-03-01T14:30:00") from None
        if parsed.tzinfo is not None:
            raise VariantError("has a time zone, which automation dates cannot carry", field=path,
                               hint="give the COM server's local time without an offset, e.g. 2024-03-01T14:30:00")
        value = parsed
    if not isinstance(value, dt.datetime) or not _OLE_MIN <= value.replace(tzinfo=None) <= _OLE_MAX:
        raise VariantError("must be an ISO 8601 date between 0100-01-01 and 9999-12-31", field=path)
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


# --- JSON -> Variant (arguments) ---------------------------------------------------------------

def _int_in(value: object, vt: int, path: str) -> int:
    if isinstance(value, str) and vt in (20, 21):  # 64-bit integers travel as strings to stay exact
        try:
            value = int(value.strip())
        except ValueError:
            raise VariantError(f"{value!r} is not an integer", field=path) from None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise VariantError(f"must be an integer for {vt_name(vt)}", field=path)
    low, high = _INT_RANGES[vt]
    if not low <= value <= high:
        raise VariantError(f"{value} is outside {vt_name(vt)} ({low}..{high})", field=path)
    return value


def _decimal_in(value: object, vt: int, path: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float, str, Decimal)):
        raise VariantError(f"must be a decimal number (a string keeps every digit) for {vt_name(vt)}", field=path)
    try:
        number = Decimal(str(value).strip()) if not isinstance(value, Decimal) else value
    except InvalidOperation:
        raise VariantError(f"{value!r} is not a decimal number", field=path, hint='e.g. "1234.5678"') from None
    if not number.is_finite():
        raise VariantError(f"{value!r} is not a finite number", field=path)
    if vt == VT["VT_CY"]:
        if number != number.quantize(Decimal("0.0001")) or not _CY_MIN <= number <= _CY_MAX:
            raise VariantError(f"{value} does not fit currency (4 decimals, about ±9.2e14)", field=path,
                               hint="round to 4 decimal places")
        return number
    scale = max(0, -int(number.normalize().as_tuple().exponent))
    if scale > 28 or abs(number.scaleb(scale)) > _DEC_MAX:
        raise VariantError(f"{value} does not fit VT_DECIMAL (96-bit mantissa, up to 28 decimals)", field=path)
    return number


def _infer(value: object, path: str) -> Variant:
    if value is None:
        return Variant(VT["VT_NULL"])
    if isinstance(value, bool):
        return Variant(VT["VT_BOOL"], value)
    if isinstance(value, int):
        return Variant(VT["VT_I4"] if -2**31 <= value < 2**31 else VT["VT_I8"], _int_in(value, 20, path))
    if isinstance(value, float):
        return from_json(value, VT["VT_R8"], path)
    if isinstance(value, str):
        return Variant(VT["VT_BSTR"], value)
    if isinstance(value, list):
        return from_json(value, VT_ARRAY | VT["VT_VARIANT"], path)
    raise VariantError("a JSON object has no automation equivalent", field=path,
                       hint="pass scalars or arrays; declare the parameter's type in the method allow-list")


def from_json(value: object, vt: int, path: str = "arguments") -> Variant:
    """A JSON value as the VARIANT of type `vt` (VT_VARIANT: inferred from the JSON type)."""
    vt &= ~VT_BYREF
    base = vt & 0x0FFF
    if vt & VT_ARRAY:
        if not isinstance(value, list):
            raise VariantError(f"must be an array for {vt_name(vt)}", field=path)
        if base == VT["VT_UI1"] and all(isinstance(v, int) for v in value):
            return Variant(vt, bytes(_int_in(v, base, f"{path}.{i}") for i, v in enumerate(value)))
        return Variant(vt, tuple(_element(v, base, f"{path}.{i}") for i, v in enumerate(value)))
    if base == VT["VT_VARIANT"]:
        return _infer(value, path)
    if value is None:
        if base in (VT["VT_EMPTY"], VT["VT_NULL"]):
            return Variant(base)
        raise VariantError(f"must not be null for {vt_name(vt)}", field=path, hint="declare it VT_VARIANT to allow null")
    if base in _INT_RANGES:
        return Variant(base, _int_in(value, base, path))
    if base in (VT["VT_R4"], VT["VT_R8"]):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise VariantError(f"must be a finite number for {vt_name(vt)}", field=path)
        if base == VT["VT_R4"] and abs(value) > _R4_MAX:
            raise VariantError(f"{value} is outside VT_R4 (±3.4e38)", field=path)
        return Variant(base, float(value))
    if base in (VT["VT_CY"], VT["VT_DECIMAL"]):
        return Variant(base, _decimal_in(value, base, path))
    if base == VT["VT_DATE"]:
        return Variant(base, _date_in(value, path))
    if base == VT["VT_BSTR"]:
        if not isinstance(value, str):
            raise VariantError("must be a string for VT_BSTR", field=path)
        return Variant(base, value)
    if base == VT["VT_BOOL"]:
        if not isinstance(value, bool):
            raise VariantError("must be true or false for VT_BOOL", field=path)
        return Variant(base, value)
    raise VariantError(f"{vt_name(vt)} cannot be given as JSON", field=path,
                       hint="object references, errors and IUnknown are not arguments an agent can give")


def _element(value: object, base: int, path: str) -> object:
    if base == VT["VT_VARIANT"]:
        if isinstance(value, list):  # a nested array inside a VARIANT array: a VARIANT holding a SAFEARRAY
            return from_json(value, VT_ARRAY | VT["VT_VARIANT"], path)
        return _infer(value, path)
    return from_json(value, base, path).value


# --- Variant / pywin32 values -> JSON (results) ------------------------------------------------

def _number_out(value: float, path: str) -> object:
    if isinstance(value, int):
        return value if -_EXACT <= value <= _EXACT else str(value)
    if not math.isfinite(value):
        raise VariantError(f"{value} has no JSON form", field=path, hint="the method returned a non-finite float")
    return value


def _decimal_out(value: Decimal) -> str:
    return format(value, "f")


def to_json(value: object, path: str = "result") -> object:
    """A result (a Variant, or a value as pywin32 returns it) as JSON; VariantError names what cannot be."""
    if isinstance(value, Variant):
        return _variant_out(value, path)
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        return _number_out(value, path)
    if isinstance(value, Decimal):
        return _decimal_out(value)
    if isinstance(value, dt.datetime):
        # pywin32 labels automation dates UTC although they carry no zone: keep the wall-clock time.
        return value.replace(tzinfo=None).isoformat(timespec="milliseconds" if value.microsecond else "seconds")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, (tuple, list)):
        return [to_json(v, f"{path}.{i}") for i, v in enumerate(value)]
    raise VariantError(f"a {type(value).__name__} (a COM object reference?) cannot be returned as JSON", field=path,
                       hint="allow-list a method that returns the object's data rather than the object")


def _variant_out(v: Variant, path: str) -> object:
    vt, base = v.vt & ~VT_BYREF, v.vt & 0x0FFF
    if vt & VT_ARRAY:
        if isinstance(v.value, (bytes, bytearray, memoryview)):
            return base64.b64encode(bytes(v.value)).decode()
        out = []
        for i, element in enumerate(v.value or ()):
            if base == VT["VT_VARIANT"]:
                out.append(to_json(element, f"{path}.{i}"))
            elif isinstance(element, (tuple, list)):  # another dimension
                out.append(_variant_out(Variant(vt, element), f"{path}.{i}"))
            else:
                out.append(_variant_out(Variant(base, element), f"{path}.{i}"))
        return out
    if base in (VT["VT_EMPTY"], VT["VT_NULL"]):
        return None
    if base == VT["VT_VARIANT"]:
        return to_json(v.value, path)
    if base == VT["VT_BOOL"]:
        return bool(v.value)  # VARIANT_TRUE is -1
    if base == VT["VT_CY"]:
        amount = v.value if isinstance(v.value, Decimal) else Decimal(int(v.value)) / 10_000  # raw: 1/10000 units
        return _decimal_out(amount.quantize(Decimal("0.0001")))
    if base == VT["VT_DATE"]:
        when = v.value if isinstance(v.value, dt.datetime) else ole_to_datetime(float(v.value))
        return to_json(when, path)
    if base == VT["VT_ERROR"]:
        return {"scode": f"0x{int(v.value) & 0xFFFFFFFF:08X}"}
    if base in (VT["VT_DISPATCH"], VT["VT_UNKNOWN"]):
        raise VariantError(f"{vt_name(base)} (a COM object reference) cannot be returned as JSON", field=path,
                           hint="allow-list a method that returns the object's data rather than the object")
    return to_json(v.value, path)


# --- JSON Schema of a declared type ------------------------------------------------------------

def vt_schema(vt: int) -> dict:
    """The JSON Schema an argument of type `vt` must match (what from_json accepts)."""
    base = vt & 0x0FFF
    if vt & VT_ARRAY:
        return {"type": "array", "items": vt_schema(base)}
    if base in _INT_RANGES:
        low, high = _INT_RANGES[base]
        if base in (20, 21):
            return {"type": ["integer", "string"], "minimum": low, "maximum": high, "pattern": r"^-?[0-9]+$",
                    "description": f"{vt_name(base)}; give big values as a string to keep every digit"}
        return {"type": "integer", "minimum": low, "maximum": high}
    if base in (VT["VT_R4"], VT["VT_R8"]):
        return {"type": "number"}
    if base in (VT["VT_CY"], VT["VT_DECIMAL"]):
        return {"type": ["string", "number"], "pattern": r"^-?[0-9]+(\.[0-9]+)?$",
                "description": "currency, 4 decimals" if base == VT["VT_CY"] else "decimal, up to 28 decimals"}
    if base == VT["VT_DATE"]:
        return {"type": "string", "description": "ISO 8601 local date-time without an offset"}
    if base == VT["VT_BSTR"]:
        return {"type": "string"}
    if base == VT["VT_BOOL"]:
        return {"type": "boolean"}
    if base in (VT["VT_EMPTY"], VT["VT_NULL"]):
        return {"type": "null"}
    return {"type": ["string", "number", "integer", "boolean", "null", "array"]}

"""Entity values by format: what a phone number, an e-mail, a date, an amount, an ID or a card must be.

Each format checks one value and returns it normalised, or raises ValidationFailed naming the
field and saying, in words an agent can relay to the user, what is wrong and what to do
("the phone number has 10 digits; Chinese mobile numbers have 11"). The format of an entity
key is chosen by its last segment (`user.phone`, `billing.email`, `contract.start_date`), or by
a JSON Schema the tenant registered for that exact key (it takes precedence). No I/O here.
"""

from __future__ import annotations

import calendar
import json
import re
import unicodedata
from collections.abc import Callable, Mapping
from datetime import date
from decimal import Decimal, InvalidOperation

import jsonschema

from libs.errors import ValidationFailed

__all__ = ["FORMATS", "PROVINCES", "check_entity", "check_schema", "format_of", "luhn_ok", "resident_id_check_digit"]

FIELD = "content"


def _refuse(reason: str, hint: str) -> ValidationFailed:
    return ValidationFailed(reason, field=FIELD, hint=hint)


def _digits_only(value: str, what: str, allowed: str = " -") -> str:
    text = unicodedata.normalize("NFKC", value).strip()  # full-width digits become ASCII
    cleaned = "".join(ch for ch in text if ch not in allowed)
    if cleaned and (not cleaned.isascii() or not cleaned.isdigit()):  # none at all: the caller counts them
        bad = next((ch for ch in cleaned if not (ch.isascii() and ch.isdigit())), "")
        raise _refuse(f"the {what} contains {bad!r}; it may hold only digits (spaces and hyphens are ignored)",
                      f"give the {what} as digits only")
    return cleaned


def _count(digits: str) -> str:
    return f"{len(digits)} digits" if digits else "no digits"


# --- Chinese mobile numbers ------------------------------------------------------------------------------

_MOBILE_PREFIX = re.compile(r"^1(3\d|4[5-9]|5[0-35-9]|6[2567]|7[0-8]|8\d|9[0-35-9])")


def cn_mobile(value: str) -> str:
    text = unicodedata.normalize("NFKC", value).strip()
    for prefix in ("+86", "0086"):
        if text.startswith(prefix):
            text = text[len(prefix):]
    digits = _digits_only(text, "phone number")
    if len(digits) == 13 and digits.startswith("86"):
        digits = digits[2:]
    if len(digits) != 11:
        raise _refuse(f"the phone number has {_count(digits)}; Chinese mobile numbers have 11",
                      "ask the user for the full 11-digit mobile number, e.g. 138 1234 5678")
    if not _MOBILE_PREFIX.match(digits):
        raise _refuse(f"the phone number starts with {digits[:3]}, which is not a Chinese mobile prefix",
                      "Chinese mobile numbers start with 13, 14, 15, 16, 17, 18 or 19; check the first digits")
    return digits


# --- e-mail ----------------------------------------------------------------------------------------------

_LOCAL = re.compile(r"^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*$")
_LABEL = re.compile(r"^(?!-)[^\W_](?:[\w-]{0,61}[^\W_])?$")


def email(value: str) -> str:
    text = value.strip()
    hint = "ask the user for an address like name@example.com"
    if text.count("@") != 1:
        raise _refuse("the e-mail address has no @" if "@" not in text else "the e-mail address has more than one @",
                      hint)
    local, domain = text.split("@")
    if not local or len(local) > 64 or not _LOCAL.match(local):
        raise _refuse("the part before @ is empty, too long or holds characters an address cannot", hint)
    labels = domain.split(".")
    if len(labels) < 2 or not all(_LABEL.match(label) for label in labels):
        raise _refuse(f"the domain {domain!r} is not a valid domain (like example.com)", hint)
    tld = labels[-1]
    if len(tld) < 2 or tld.isdigit():
        raise _refuse(f"the domain ends in {tld!r}, which is not a top-level domain", hint)
    if len(text) > 254:
        raise _refuse("the e-mail address is longer than 254 characters", hint)
    return f"{local}@{domain.lower()}"


# --- dates -----------------------------------------------------------------------------------------------

_DATE = re.compile(r"^(\d{4})\s*(?:[-/.]|年)\s*(\d{1,2})\s*(?:[-/.]|月)\s*(\d{1,2})\s*日?$")


def a_date(value: str) -> str:
    text = unicodedata.normalize("NFKC", value).strip()
    hint = "give the date as YYYY-MM-DD, e.g. 2025-03-01 (or 2025年3月1日)"
    match = _DATE.match(text)
    if not match:
        raise _refuse(f"{text[:40]!r} is not a date in a form we accept", hint)
    year, month, day = (int(g) for g in match.groups())
    if not 1900 <= year <= 2200:
        raise _refuse(f"the year {year} is out of range (1900-2200)", hint)
    if not 1 <= month <= 12:
        raise _refuse(f"the month {month} does not exist; months are 1 to 12", hint)
    days = calendar.monthrange(year, month)[1]
    if not 1 <= day <= days:
        raise _refuse(f"{year}-{month:02d} has {days} days, so day {day} does not exist", hint)
    return date(year, month, day).isoformat()


# --- amounts with a currency -----------------------------------------------------------------------------

_SYMBOLS = {"¥": "CNY", "￥": "CNY", "元": "CNY", "人民币": "CNY", "RMB": "CNY", "$": "USD", "US$": "USD",
            "€": "EUR", "£": "GBP", "HK$": "HKD", "美元": "USD", "欧元": "EUR", "港币": "HKD", "日元": "JPY"}
CURRENCIES = {"CNY": 2, "USD": 2, "EUR": 2, "GBP": 2, "HKD": 2, "JPY": 0, "KRW": 0, "SGD": 2, "AUD": 2,
              "CAD": 2, "CHF": 2, "TWD": 2, "MOP": 2}
_AMOUNT = re.compile(r"^(?P<pre>[^\d\s+-]*)\s*(?P<num>[+-]?[\d,]*\.?\d+)\s*(?P<post>\S*)$")


def amount(value: str) -> str:
    text = unicodedata.normalize("NFKC", value).strip()
    hint = "give the amount with its currency, e.g. 12.50 CNY, ¥12.50 or 100 USD"
    match = _AMOUNT.match(text)
    if not match:
        raise _refuse(f"{text[:40]!r} is not an amount", hint)
    marks = [m for m in (match["pre"], match["post"]) if m]
    if not marks:
        raise _refuse("the amount has no currency", hint)
    if len(marks) > 1:
        raise _refuse(f"the amount names two currencies ({marks[0]} and {marks[1]})", hint)
    mark = marks[0]
    currency = _SYMBOLS.get(mark) or _SYMBOLS.get(mark.upper()) or mark.upper()
    if currency not in CURRENCIES:
        raise _refuse(f"{mark!r} is not a currency we know", f"use one of {', '.join(sorted(CURRENCIES))}")
    raw = match["num"]
    if "," in raw and not re.fullmatch(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?", raw):
        raise _refuse(f"the thousands separators in {raw!r} are misplaced", hint)
    try:
        number = Decimal(raw.replace(",", ""))
    except InvalidOperation:
        raise _refuse(f"{raw!r} is not a number", hint) from None
    places = CURRENCIES[currency]
    exponent = number.as_tuple().exponent
    if isinstance(exponent, int) and -exponent > places:
        raise _refuse(f"{currency} amounts have at most {places} decimal places; {raw} has {-exponent}",
                      f"round the amount to {places} decimal places")
    if abs(number) >= Decimal(10) ** 15:
        raise _refuse("the amount is too large (15 digits at most before the point)", hint)
    return f"{number:.{places}f} {currency}"


# --- Chinese resident ID numbers -------------------------------------------------------------------------

_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
PROVINCES = frozenset({11, 12, 13, 14, 15, 21, 22, 23, 31, 32, 33, 34, 35, 36, 37, 41, 42, 43, 44, 45, 46, 50, 51,
                       52, 53, 54, 61, 62, 63, 64, 65, 71, 81, 82, 83, 91})  # the first two digits of a resident ID


def resident_id_check_digit(first17: str) -> str:
    """The 18th character of a resident ID number (GB 11643-1999, ISO 7064 MOD 11-2)."""
    return "10X98765432"[sum(int(d) * w for d, w in zip(first17, _WEIGHTS, strict=True)) % 11]


def cn_resident_id(value: str) -> str:
    text = unicodedata.normalize("NFKC", value).strip().replace(" ", "").upper()
    hint = "ask the user to read the 18-character number again from the ID card"
    if len(text) != 18:
        raise _refuse(f"the ID number has {len(text)} characters; Chinese resident ID numbers have 18", hint)
    body, last = text[:17], text[17]
    if not (body.isascii() and body.isdigit()) or not (last.isdigit() or last == "X"):
        raise _refuse("the ID number may hold only digits, and X as its last character", hint)
    if int(body[:2]) not in PROVINCES:
        raise _refuse("the ID number's first two digits are no region code", hint)
    try:
        a_date(f"{body[6:10]}-{body[10:12]}-{body[12:14]}")
    except ValidationFailed:
        raise _refuse("the birth date inside the ID number (digits 7 to 14) is not a real date", hint) from None
    if last != resident_id_check_digit(body):
        # The digits themselves are never quoted: refusals end up in logs and dead letters.
        raise _refuse("the ID number's last character (its check digit) does not match the other 17; a digit is "
                      "probably wrong", hint)
    return text


# --- bank cards ------------------------------------------------------------------------------------------


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def bank_card(value: str) -> str:
    digits = _digits_only(value, "card number")
    hint = "ask the user to read the card number again"
    if not 12 <= len(digits) <= 19:
        raise _refuse(f"the card number has {_count(digits)}; bank card numbers have 12 to 19", hint)
    if not luhn_ok(digits):
        raise _refuse("the card number fails its check digit (Luhn); a digit is probably wrong", hint)
    return digits


# --- choosing a format -----------------------------------------------------------------------------------

Format = Callable[[str], str]
FORMATS: dict[str, Format] = {
    "phone": cn_mobile, "mobile": cn_mobile, "phone_number": cn_mobile, "mobile_phone": cn_mobile,
    "email": email, "e_mail": email,
    "date": a_date, "birthday": a_date, "birth_date": a_date, "date_of_birth": a_date,
    "amount": amount, "price": amount, "balance": amount, "salary": amount,
    "id_card": cn_resident_id, "resident_id": cn_resident_id, "id_number": cn_resident_id,
    "bank_card": bank_card, "card_number": bank_card,
}


def format_of(key: str) -> Format | None:
    """The built-in format of an entity key, by its last segment (`billing.email` → e-mail)."""
    last = key.rsplit(".", 1)[-1].lower()
    if last in FORMATS:
        return FORMATS[last]
    for suffix, fmt in (("_date", a_date), ("_amount", amount), ("_phone", cn_mobile), ("_email", email)):
        if last.endswith(suffix):
            return fmt
    return None


def check_schema(schema: Mapping) -> None:
    """Refuse a JSON Schema that is not one (so no write is later checked against nonsense)."""
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        raise ValidationFailed(f"is not a valid JSON Schema{' at ' + where if where else ''}: {exc.message}",
                               field="schema", hint="send a JSON Schema (draft 2020-12)") from None


def _by_schema(key: str, value: str, schema: Mapping) -> str:
    try:
        instance = json.loads(value)
    except ValueError:
        instance = value  # plain text is validated as a JSON string
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(instance))
    if error is None:
        return value
    where = "/".join(str(p) for p in error.absolute_path)
    raise _refuse(f"the value of {key} {('at ' + where + ' ') if where else ''}does not match the tenant's format: "
                  f"{error.message}", f"give a value the format registered for {key} accepts")


def check_entity(key: str, value: str, schema: Mapping | None = None) -> str:
    """`value` normalised by the format of `key` (the tenant's schema first); unchanged without a format."""
    if schema is not None:
        return _by_schema(key, value, schema)
    fmt = format_of(key)
    return fmt(value) if fmt else value

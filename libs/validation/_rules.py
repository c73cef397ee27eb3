"""The input rules every entry point shares: text, identifiers, tenants, UUIDs, timestamps, quoting.

Each rule raises ValidationFailed naming the field, saying why and what to do; none of
them repeats more of the input than a short, escaped prefix (see `quote`).
"""

from __future__ import annotations

import math
import re
import unicodedata

from libs.errors import ValidationFailed
from libs.text import MAX_TERM_CHARS, tokenize

__all__ = ["MAX_TERM_CHARS", "QUOTE_CHARS", "SESSION_ID", "TENANT_ID", "TENANT_ID_RULE", "TIMESTAMP_RANGE",
           "canonical_uuid", "check_content", "is_tenant_id", "shows_something",
           "check_finite", "check_identifier", "check_session_id", "check_tenant_id", "check_text",
           "check_timestamp", "check_uuid", "quote", "visible"]

QUOTE_CHARS = 32
# Tenant ids appear in keys and stream ids; a closed alphabet keeps those unambiguous.
# Tenant ids appear in keys, stream ids and row-level-security settings; a closed alphabet keeps those
# unambiguous (and no tenant can be named "*", which the database reads as "every tenant").
TENANT_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
TENANT_ID_RULE = "1-64 letters, digits, '_', '.' or '-'"
SESSION_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
# google.protobuf.Timestamp's own range: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999999Z.
TIMESTAMP_RANGE = (-62_135_596_800, 253_402_300_799)
# Characters that take no room on screen but are not categorised as format characters.
_INVISIBLE_EXTRA = frozenset("\u115f\u1160\u3164\uffa0\u2800\u180e")


def quote(value: str, limit: int = QUOTE_CHARS) -> str:
    """`value` fit to repeat in an error: escaped, and cut to `limit` characters with its length said."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


_SURROGATE = re.compile("[\ud800-\udfff]")


def _surrogate(value: str) -> bool:
    return _SURROGATE.search(value) is not None


def check_text(value: str, field: str, max_chars: int) -> str:
    """Free text: no NUL (PostgreSQL text cannot hold it), no lone surrogate, at most `max_chars`."""
    if len(value) > max_chars:
        raise ValidationFailed(f"is {len(value)} characters; the limit is {max_chars}", field=field,
                               hint="send less; the README's section 'Input limits' lists every limit")
    if "\x00" in value:
        raise ValidationFailed(f"contains a NUL character at position {value.index(chr(0))}", field=field,
                               hint="remove the NUL (\\x00) characters; text fields cannot hold them")
    if _surrogate(value):
        raise ValidationFailed("contains a lone surrogate, which is not valid Unicode", field=field,
                               hint="send valid UTF-8 text")
    return value


def check_identifier(value: str, field: str, max_chars: int) -> str:
    """A name or id chosen by the caller (user id, key, tag, idempotency key...): text without
    control or invisible format characters, so that it reads and compares as it looks."""
    check_text(value, field, max_chars)
    bad = next((c for c in value if unicodedata.category(c) in ("Cc", "Cf")), None)
    if bad is not None:
        raise ValidationFailed(f"contains the control character U+{ord(bad):04X} at position {value.index(bad)}",
                               field=field, hint="ids and keys are printable text: remove control characters")
    return value


def is_tenant_id(value: object) -> bool:
    """The one tenant-id rule, for token claims, envelopes and requests alike: a tenant id anything
    carries is one a token could hold."""
    return isinstance(value, str) and TENANT_ID.fullmatch(value) is not None


def check_tenant_id(value: str, field: str = "tenant_id") -> str:
    """The one tenant-id rule (gRPC requests, tokens, stream commands), raising a structured error."""
    if not is_tenant_id(value):
        said = "is required" if not value else f"is {quote(value)}"
        raise ValidationFailed(f"{said}; a tenant id is {TENANT_ID_RULE}", field=field,
                               hint="use the tenant your token names (on gRPC, leave it empty to mean that one)")
    return value


def check_session_id(value: str, field: str = "session_id") -> str:
    if not SESSION_ID.fullmatch(value):
        raise ValidationFailed(f"is {quote(value)}; it must be 1-128 letters, digits, '_', '.', ':' or '-'",
                               field=field, hint="e.g. a UUID")
    return value


_UUID_HINT = "use the id a previous call returned, e.g. 0b6f2c1e-4a53-4c1e-9a51-6ad3c3f1b2aa"


def canonical_uuid(value: str) -> str | None:
    """`value` in the one form ids are stored and compared in (lower-case 8-4-4-4-12), or None if no UUID."""
    return value.lower() if _UUID.fullmatch(value) else None


def check_uuid(value: str, field: str) -> str:
    """A server-issued id, returned in its canonical form (lower-case): "0B6F...-..." names the same memory
    as "0b6f...-...", so every entry point must hand on the one form the store compares."""
    canonical = canonical_uuid(value)
    if canonical is None:
        said = "is required" if not value else f"is {quote(value)}, which is not a UUID"
        raise ValidationFailed(said, field=field, hint=_UUID_HINT)
    return canonical


def check_timestamp(seconds: int, nanos: int, field: str) -> None:
    low, high = TIMESTAMP_RANGE
    if not low <= seconds <= high or not 0 <= nanos <= 999_999_999:
        raise ValidationFailed("is out of range: seconds must lie between 0001-01-01 and 9999-12-31 and nanos "
                               "between 0 and 999999999", field=field,
                               hint="send a real date (google.protobuf.Timestamp), or leave it unset")


def check_finite(value: float, field: str) -> float:
    if not math.isfinite(value):
        raise ValidationFailed(f"is {value}, not a finite number", field=field, hint="send a finite number")
    return value


def visible(value: str) -> str:
    """What a reader sees: NFKC-normalised, invisible characters removed, surrounding space stripped."""
    normal = unicodedata.normalize("NFKC", value)
    return "".join(c for c in normal
                   if unicodedata.category(c) not in ("Cf", "Cc", "Zl", "Zp") and c not in _INVISIBLE_EXTRA).strip()


# Show nothing by themselves: marks (combining accents, variation selectors) modify the character before them.
_SHOWS_NOTHING = frozenset(("Cf", "Cc", "Zl", "Zp", "Mn", "Mc", "Me"))


def _shows_something(normal: str) -> bool:
    """Whether the NFKC form `normal` of a value holds a character a reader sees by itself (not a space, an
    invisible character, nor a mark with nothing to modify), stopping at the first."""
    return any(not c.isspace() and c not in _INVISIBLE_EXTRA and unicodedata.category(c) not in _SHOWS_NOTHING
               for c in normal)


def shows_something(value: str) -> bool:
    """Whether `value` holds something to read: not only spaces, zero-width characters, BOMs or marks."""
    return _shows_something(unicodedata.normalize("NFKC", value))


def check_content(value: str, field: str, max_chars: int) -> str:
    """Text to remember or say: the text rule, not empty to the eye, and no word too long to index."""
    check_text(value, field, max_chars)
    normal = unicodedata.normalize("NFKC", value)
    if not _shows_something(normal):
        raise ValidationFailed("must not be empty (it has no visible characters)", field=field,
                               hint="send the text itself; spaces, zero-width characters, BOMs, and combining "
                                    "marks or variation selectors on their own do not count")
    if len(normal.lower()) <= MAX_TERM_CHARS:  # no word of the text tokenize reads can be longer
        return value
    longest = max(tokenize(value, cap=None), key=len, default="")
    if len(longest) > MAX_TERM_CHARS:
        raise ValidationFailed(f"has a word of {len(longest)} characters ({quote(longest, 16)}); words are "
                               f"limited to {MAX_TERM_CHARS} characters so that search can index them",
                               field=field, hint="break the word up, or store a blob as an attribute")
    return value

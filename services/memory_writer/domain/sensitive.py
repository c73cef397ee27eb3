"""Sensitive values: found by entity key and by content, and the text the read side may see instead.

Passwords, secrets and API keys, resident ID numbers and bank cards are always sensitive; phone
numbers and e-mail addresses when the tenant's policy says so (`contacts=True`). A memory with a
sensitive value is stored and announced encrypted; what may be indexed is its text with each
sensitive value replaced by a marker `[sensitive:<kind>]`. No I/O here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.memory_writer.domain.entities import luhn_ok, resident_id_check_digit

__all__ = ["Finding", "find_sensitive", "marker"]

_KEY_KINDS = {
    "password": "password", "passwd": "password", "pwd": "password", "pin": "password", "passcode": "password",
    "secret": "secret", "api_key": "api_key", "apikey": "api_key", "token": "api_key", "access_token": "api_key",
    "private_key": "secret", "id_card": "id_number", "resident_id": "id_number", "id_number": "id_number",
    "passport": "id_number", "bank_card": "bank_card", "card_number": "bank_card", "cvv": "bank_card",
    "bank_account": "bank_card",
}
_CONTACT_KEYS = {"phone": "phone", "mobile": "phone", "phone_number": "phone", "email": "email", "e_mail": "email"}

_ID = re.compile(r"(?<![0-9A-Za-z])\d{17}[\dXx](?![0-9A-Za-z])")
_CARD = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])")
_API_KEYS = re.compile(
    r"\b(?:sk-(?:proj-|live-|test-)?[A-Za-z0-9_-]{16,}|AKIA[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{30,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}|AIza[0-9A-Za-z_-]{35}|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]+)")
_PEM = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)")
# An English keyword is a word of its own ("db_password=", "pwd:"), or the end of a longer name when a
# separator follows it ("userPassword=", "mysqlpwd:", "wifipassword is"); never letters inside another
# word ("passwordless", a random "tiupepwdxyz"). Chinese keywords need no boundary.
_PASSWORD = re.compile(
    r"(?i)(?:(?<![A-Za-z0-9])(?:password|passwd|passcode|pwd|pin code)(?![A-Za-z])"
    r"|(?:password|passwd|passcode|pwd)(?=\s*(?:[=:：]|is\b|was\b))|密码|口令|支付密码)"
    r"\s*(?:is|was|[=:：]|是[:：]?|为[:：]?)?\s*(?P<value>[^\s，。,;；\"'“”]{3,})")
_PHONE = re.compile(r"(?<!\d)(?:\+?86[ -]?)?1[3-9]\d(?:[ -]?\d){8}(?!\d)")
_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")


@dataclass(frozen=True)
class Finding:
    kind: str  # the first kind found: password, secret, api_key, id_number, bank_card, phone, email
    values: tuple[str, ...]  # the sensitive values, as written
    redacted: str  # the content with each value replaced by its marker


def marker(kind: str) -> str:
    return f"[sensitive:{kind}]"


def _kind_of_key(key: str, contacts: bool) -> str:
    last = key.rsplit(".", 1)[-1].lower()
    if last in _KEY_KINDS:
        return _KEY_KINDS[last]
    if "password" in last or "secret" in last or last.endswith(("_token", "_api_key")):
        return "password" if "password" in last else "secret"
    return _CONTACT_KEYS.get(last, "") if contacts else ""


def _valid_id(text: str) -> bool:
    return resident_id_check_digit(text[:17]) == text[17].upper()


def find_sensitive(key: str, content: str, *, contacts: bool = False) -> Finding | None:
    """What is sensitive in a memory; None when nothing is."""
    kind = _kind_of_key(key, contacts) if key else ""
    if kind:  # the whole value of a sensitive key
        return Finding(kind, (content,), marker(kind))
    spans: list[tuple[int, int, str]] = []
    for pattern, what, ok in ((_PEM, "secret", None), (_API_KEYS, "api_key", None), (_ID, "id_number", _valid_id),
                              (_CARD, "bank_card", lambda s: luhn_ok(re.sub(r"[ -]", "", s)))):
        for m in pattern.finditer(content):
            if ok is None or ok(m.group(0)):
                spans.append((m.start(), m.end(), what))
    for m in _PASSWORD.finditer(content):
        spans.append((m.start("value"), m.end("value"), "password"))
    if contacts:
        spans += [(m.start(), m.end(), "phone") for m in _PHONE.finditer(content)]
        spans += [(m.start(), m.end(), "email") for m in _EMAIL.finditer(content)]
    if not spans:
        return None
    spans.sort()
    kept: list[tuple[int, int, str]] = []
    for span in spans:  # overlapping finds: the first (then the longest) wins
        if kept and span[0] < kept[-1][1]:
            if span[1] > kept[-1][1]:
                kept[-1] = (kept[-1][0], span[1], kept[-1][2])
            continue
        kept.append(span)
    parts, last = [], 0
    for start, end, what in kept:
        parts += [content[last:start], marker(what)]
        last = end
    parts.append(content[last:])
    return Finding(kept[0][2], tuple(content[s:e] for s, e, _ in kept), "".join(parts))

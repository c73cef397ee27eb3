"""Sensitive values: found by entity key and by content, and the text the read side may see instead.

Passwords, secrets and API keys, resident ID numbers and bank cards are always sensitive; phone numbers
and e-mail addresses when the tenant's policy says so (`contacts=True`). A memory with a sensitive value is
stored and announced encrypted; what may be indexed is its text with each sensitive value replaced, whole,
by a marker `[sensitive:<kind>]`. Content is read folded (full-width digits and "＠" as ASCII, invisible
characters dropped: `textfold`), and each finding is cut out of the original text. Every search is linear
in the text's length: the dead-letter scrubber runs this on text of any size. No I/O here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.memory_writer.domain._identifiers import contacts as _contacts
from services.memory_writer.domain._identifiers import identity_numbers
from services.memory_writer.domain._secrets import credentials
from services.memory_writer.domain.textfold import fold

__all__ = ["Finding", "find_sensitive", "marker", "redact", "redacted_tree"]

_KEY_KINDS = {
    "password": "password", "passwd": "password", "pwd": "password", "pin": "password", "passcode": "password",
    "passphrase": "password", "secret": "secret", "api_key": "api_key", "apikey": "api_key", "token": "api_key",
    "access_token": "api_key", "private_key": "secret", "id_card": "id_number", "resident_id": "id_number",
    "id_number": "id_number", "passport": "id_number", "bank_card": "bank_card", "card_number": "bank_card",
    "cvv": "bank_card", "cvc": "bank_card", "bank_account": "bank_card",
}
_CONTACT_KEYS = {"phone": "phone", "mobile": "phone", "phone_number": "phone", "email": "email", "e_mail": "email"}
# Words of a key's last part that name a secret wherever they stand ("wifi_password", "doorCode" is not one).
_SECRET_WORDS = {"password": "password", "passwd": "password", "passphrase": "password", "passcode": "password",
                 "pin": "password", "secret": "secret", "credential": "secret", "credentials": "secret",
                 "token": "api_key", "apikey": "api_key"}


@dataclass(frozen=True)
class Finding:
    kind: str  # the first kind found: password, secret, api_key, id_number, bank_card, phone, email
    values: tuple[str, ...]  # the sensitive values, as written
    redacted: str  # the content with each value replaced by its marker


def marker(kind: str) -> str:
    return f"[sensitive:{kind}]"


def _kind_of_key(key: str, contacts: bool) -> str:
    last = key.rsplit(".", 1)[-1]
    if last.lower() in _KEY_KINDS:
        return _KEY_KINDS[last.lower()]
    words = [w.lower() for w in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", last)]
    for word in words:
        if word in _SECRET_WORDS:
            return _SECRET_WORDS[word]
    if "password" in last.lower() or last.lower().endswith(("_api_key", "_access_key", "_private_key")):
        return "password" if "password" in last.lower() else "secret"
    return _CONTACT_KEYS.get(last.lower(), "") if contacts else ""


def redact(text: str, key: str = "", *, contacts: bool = False) -> str:
    """`text` with each sensitive value replaced by its marker (all of it under a key such as `password`)."""
    finding = find_sensitive(key, text, contacts=contacts)
    return text if finding is None else finding.redacted


def redacted_tree(value: object, key: str = "", *, contacts: bool = False) -> object:
    """JSON-like `value` (under `key`) with every text redacted: a text under a key that names a secret whole, and
    everything below such a key; an object's names too. Lists and tuples come back as lists."""
    if isinstance(value, str):
        return redact(value, key, contacts=contacts)
    if isinstance(value, list | tuple):
        return [redacted_tree(item, key, contacts=contacts) for item in value]
    if isinstance(value, dict):
        secret_above = bool(key) and bool(_kind_of_key(key, contacts))
        return {redact(name, contacts=contacts): redacted_tree(item, key if secret_above else name, contacts=contacts)
                for name, item in value.items()}
    return value


def find_sensitive(key: str, content: str, *, contacts: bool = False) -> Finding | None:
    """What is sensitive in a memory; None when nothing is."""
    kind = _kind_of_key(key, contacts) if key else ""
    if kind:  # the whole value of a sensitive key
        return Finding(kind, (content,), marker(kind))
    folded = fold(content)
    spans = credentials(folded.text) + list(identity_numbers(folded.text))
    if contacts:
        spans += _contacts(folded.text)
    if not spans:
        return None
    spans.sort(key=lambda span: (span[0], -span[1]))
    kept: list[list] = []
    for start, end, what in spans:  # overlapping finds: the first (then the longest) wins, and covers both
        if kept and start < kept[-1][1]:
            kept[-1][1] = max(kept[-1][1], end)
            continue
        kept.append([start, end, what])
    parts, last, values = [], 0, []
    for start, end, what in kept:
        begin, finish = folded.span(start, end)
        parts += [content[last:begin], marker(what)]
        values.append(content[begin:finish])
        last = finish
    parts.append(content[last:])
    return Finding(kept[0][2], tuple(values), "".join(parts))

"""Tool names and versions for imported operations. No I/O here."""

from __future__ import annotations

import hashlib
import re

from libs.errors import ValidationFailed

__all__ = ["MAX_NAME", "check_backend_id", "snake", "tool_name", "tool_version"]

MAX_NAME = 64
_BACKEND_ID = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


def snake(text: str) -> str:
    """`GetCustomerByID` -> `get_customer_by_id`; anything not a letter or digit becomes `_`."""
    text = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", text)
    text = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", text)
    text = re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").lower()
    if not text:
        return "op"
    return text if text[0].isalpha() else f"op_{text}"


def check_backend_id(backend_id: str, field: str = "backend_id") -> str:
    if not _BACKEND_ID.match(backend_id or ""):
        raise ValidationFailed(f"{backend_id!r} must be 1-32 lower-case letters, digits or '_', starting with a letter",
                               field=field, hint="it namespaces the tools, e.g. billing -> billing.get_invoice")
    return backend_id


def tool_name(backend_id: str, operation: str, taken: set[str]) -> str:
    """`<backend>.<operation in snake case>`, at most 64 characters, unique among `taken`.

    Too long or colliding names keep a readable prefix and end with a short hash of the
    operation's real name, so the same WSDL always yields the same names.
    """
    base = f"{backend_id}.{snake(operation)}"
    digest = hashlib.sha256(operation.encode()).hexdigest()[:8]
    name = base if len(base) <= MAX_NAME else f"{base[:MAX_NAME - 9].rstrip('_')}_{digest}"
    if name in taken:
        name = f"{base[:MAX_NAME - 9].rstrip('_')}_{digest}"
    return name


def tool_version(revision: int, wsdl_hash: str) -> str:
    """MAJOR.MINOR.PATCH: the import revision (newer imports sort higher), then 24 bits of the
    WSDL hash, so two different WSDLs never share a version of a tool."""
    return f"{revision}.{int(wsdl_hash[:6], 16)}.0"

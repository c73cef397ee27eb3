"""Names of federated tools: `<prefix>.<tool>`, valid registry names, at most 64 characters, unique."""

from __future__ import annotations

import hashlib
import re

__all__ = ["MAX_NAME", "exposed_name"]

MAX_NAME = 64
_NOT_ALLOWED = re.compile(r"[^a-z0-9_]+")


def _word(text: str) -> str:
    word = _NOT_ALLOWED.sub("_", text.lower()).strip("_") or "tool"
    return word if word[0].isalpha() else f"t_{word}"


def exposed_name(prefix: str, tool: str, taken: set[str]) -> str:
    """The name agents see for upstream `tool`; `taken` holds the names already given out.

    A name that would be too long or clash keeps its readable start and ends with a hash of the
    upstream's own name, so it is stable across restarts.
    """
    parts = [_word(p) for p in prefix.split(".") if p] + [_word(tool)]
    name = ".".join(parts)
    if len(name) <= MAX_NAME and name not in taken:
        return name
    digest = hashlib.sha256(f"{prefix}\0{tool}".encode()).hexdigest()
    for size in (8, 12, 16, 64):
        candidate = f"{name[: MAX_NAME - size - 1].rstrip('._')}_{digest[:size]}"
        if candidate not in taken:
            return candidate
    raise ValueError(f"cannot name {tool!r} of {prefix!r} uniquely")  # pragma: no cover - needs a hash collision

"""Reply templates and the values put into them: shared by the agent's steps."""

from __future__ import annotations

import json
import string

__all__ = ["fill", "plain"]


def plain(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def fill(template: str, values: dict) -> str:
    """Fill `{name}` fields; an unknown field stays visible as `{name}` rather than failing the turn."""
    names = {name for _, name, _, _ in string.Formatter().parse(template) if name}
    return template.format_map({n: values.get(n, "{" + n + "}") for n in names})

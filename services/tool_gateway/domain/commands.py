"""Commands the tool-gateway accepts from its entry points."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CallTool"]


@dataclass(frozen=True)
class CallTool:
    name: str
    arguments: dict = field(default_factory=dict)

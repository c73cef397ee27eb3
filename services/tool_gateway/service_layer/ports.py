"""The registry port: tools and their registration events commit together."""

from __future__ import annotations

from typing import Protocol

from services.tool_gateway.domain import ToolSpec

__all__ = ["Registry"]


class Registry(Protocol):
    async def register(self, spec: ToolSpec) -> bool:
        """Store `spec` and announce it, atomically; False when that name and version already exist."""
        ...

    async def list(self) -> list[ToolSpec]:
        """Every registered tool, newest version first within a name."""
        ...

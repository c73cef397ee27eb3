"""Dispatch a call to the backend its spec names."""

from __future__ import annotations

from typing import Any, Protocol

from libs.errors import ValidationFailed
from services.tool_gateway.domain import ToolSpec

__all__ = ["Backend", "BackendRouter"]


class Backend(Protocol):
    async def call(self, target: str, arguments: dict[str, Any], timeout: float) -> dict[str, Any]:
        """`target` is the spec's backend after `<kind>:`."""
        ...


class BackendRouter:
    def __init__(self, backends: dict[str, Backend]) -> None:
        self.backends = backends

    async def call(self, spec: ToolSpec, arguments: dict[str, Any], timeout: float) -> dict[str, Any]:
        kind, _, target = spec.backend.partition(":")
        backend = self.backends.get(kind)
        if backend is None:
            raise ValidationFailed(f"{spec.name} names no backend this gateway knows ({spec.backend[:64]!r})",
                                   field="backend", hint=f"register it with a backend of kind "
                                                         f"{', '.join(sorted(self.backends))}")
        return await backend.call(target, arguments, timeout)

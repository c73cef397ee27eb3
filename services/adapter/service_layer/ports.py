"""The adapter's ports: where imports are stored, where tools are registered, how backends load."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from services.adapter.domain.catalog import Catalog, OperationTool
from services.adapter.domain.commands import ImportWsdl

__all__ = ["BackendLoader", "BackendStore", "LiveBackend", "StoredBackend", "ToolRegistry"]


@dataclass(frozen=True)
class StoredBackend:
    backend_id: str
    location: str
    options: dict
    documents: dict[str, bytes]
    wsdl_hash: str
    revision: int
    tools: list[str] = field(default_factory=list)


class LiveBackend(Protocol):
    """An imported backend, loaded in this process and ready to call."""

    catalog: Catalog
    documents: dict[str, bytes]

    async def invoke(self, tool: OperationTool, arguments: dict) -> dict: ...

    async def aclose(self) -> None:
        """Release what the backend holds (a COM backend stops its apartment worker)."""


class BackendLoader(Protocol):
    async def load(self, command: ImportWsdl, *, revision: int, trusted: bool = False) -> LiveBackend:
        """Load (blocking parse off the event loop) and build the catalog; raise DomainError naming the problem."""


class BackendStore(Protocol):
    async def get(self, backend_id: str) -> StoredBackend | None: ...

    async def save(self, backend: StoredBackend) -> None: ...

    async def delete(self, backend_id: str) -> bool: ...

    async def list(self) -> list[StoredBackend]: ...


class ToolRegistry(Protocol):
    async def register(self, catalog: Catalog, timeout_seconds: float, retries: int) -> str:
        """Register every tool of `catalog`; return "" or what went wrong (the import still stands)."""

    async def unregister(self, names: list[str]) -> str:
        """Remove tools; return "" or what could not be done."""

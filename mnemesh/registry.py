"""The five services and where their wiring lives."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

__all__ = ["SERVICE_MODULES", "load_bootstrap"]

SERVICE_MODULES: dict[str, str] = {
    "memory-writer": "services.memory_writer.bootstrap",
    "retriever": "services.retriever.bootstrap",
    "tool-gateway": "services.tool_gateway.bootstrap",
    "adapter": "services.adapter.bootstrap",
    "orchestrator": "services.orchestrator.bootstrap",
}


@dataclass(frozen=True)
class ServiceWiring:
    name: str
    module: ModuleType

    @property
    def bootstrap(self):
        return self.module.bootstrap

    @property
    def migrations(self) -> str | None:
        return self.module.MIGRATIONS


def load_bootstrap(name: str) -> ServiceWiring:
    if name not in SERVICE_MODULES:
        raise KeyError(f"unknown service {name!r}; choose one of {', '.join(SERVICE_MODULES)}")
    return ServiceWiring(name, importlib.import_module(SERVICE_MODULES[name]))

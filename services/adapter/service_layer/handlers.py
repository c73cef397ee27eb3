"""Adapter handlers: one command in, the ports it needs, a result out."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from libs.errors import DomainError, NotFound, ValidationFailed
from libs.logs import get_logger
from services.adapter.domain.catalog import Catalog
from services.adapter.domain.commands import (
    DescribeBackend,
    DropBackend,
    ImportOptions,
    ImportWsdl,
    InvokeOperation,
)
from services.adapter.service_layer.ports import BackendLoader, BackendStore, LiveBackend, StoredBackend, ToolRegistry

__all__ = ["Bridge", "ImportResult", "describe", "drop", "import_wsdl", "invoke", "register_all", "restore"]

log = get_logger(__name__)


@dataclass
class Bridge:
    """The ports of the adapter and the backends loaded in this process."""

    store: BackendStore
    loader: BackendLoader
    registry: ToolRegistry
    live: dict[str, LiveBackend] = field(default_factory=dict)


@dataclass(frozen=True)
class ImportResult:
    catalog: Catalog
    registration_error: str


async def import_wsdl(command: ImportWsdl, bridge: Bridge, *, trusted: bool = False) -> ImportResult:
    command.check()
    previous = await bridge.store.get(command.backend_id)
    backend = await bridge.loader.load(command, revision=1, trusted=trusted)
    catalog = backend.catalog
    if not catalog.tools:
        failures = "; ".join(f"{f.operation}: {f.reason}" for f in catalog.failed[:5]) or "it has no operations"
        raise ValidationFailed(f"no operation of port {catalog.port.service}/{catalog.port.port} could be mapped "
                               f"({failures})", field="source", hint="fix the WSDL or choose another port")
    options = command.options.to_json()
    same = previous is not None and previous.wsdl_hash == catalog.wsdl_hash and previous.options == options
    revision = previous.revision if same else (previous.revision + 1 if previous else 1)
    catalog = dataclasses.replace(catalog, revision=revision)
    backend.catalog = catalog
    await bridge.store.save(StoredBackend(command.backend_id, catalog.location, options, dict(backend.documents),
                                          catalog.wsdl_hash, revision, [t.name for t in catalog.tools]))
    bridge.live[command.backend_id] = backend
    error = await bridge.registry.register(catalog, command.options.timeout_seconds, command.options.retries)
    if previous is not None:
        gone = sorted(set(previous.tools) - {t.name for t in catalog.tools})
        if gone:
            error = "; ".join(filter(None, [error, await bridge.registry.unregister(gone)]))
    log.info("wsdl imported", backend=command.backend_id, tools=len(catalog.tools), failed=len(catalog.failed),
             revision=revision)
    return ImportResult(catalog, error)


def _reimport(stored: StoredBackend) -> ImportWsdl:
    return ImportWsdl(stored.backend_id, document=stored.documents[stored.location], base_url=stored.location,
                      documents=stored.documents, options=ImportOptions.from_json(stored.options))


async def _live(backend_id: str, bridge: Bridge) -> LiveBackend:
    backend = bridge.live.get(backend_id)
    if backend is not None:
        return backend
    stored = await bridge.store.get(backend_id)  # imported through another replica
    if stored is None:
        known = ", ".join(sorted(bridge.live)) or "none"
        raise NotFound(f"no backend {backend_id!r} is imported (known: {known})", field="backend_id",
                       hint="ImportWsdl it first, or list them with ListBackends")
    backend = await bridge.loader.load(_reimport(stored), revision=stored.revision, trusted=True)
    backend.catalog = dataclasses.replace(backend.catalog, revision=stored.revision)
    bridge.live[backend_id] = backend
    return backend


async def invoke(command: InvokeOperation, bridge: Bridge) -> dict:
    command.check()
    backend = await _live(command.backend_id, bridge)
    tool = backend.catalog.tool(command.operation)
    if tool is None:
        names = ", ".join(t.operation for t in backend.catalog.tools[:20])
        raise NotFound(f"backend {command.backend_id!r} has no operation {command.operation!r}", field="operation",
                       hint=f"use one of {names}")
    return await backend.invoke(tool, command.arguments)


async def describe(command: DescribeBackend, bridge: Bridge) -> Catalog:
    return (await _live(command.backend_id, bridge)).catalog


async def drop(command: DropBackend, bridge: Bridge) -> tuple[list[str], str]:
    stored = await bridge.store.get(command.backend_id)
    live = bridge.live.pop(command.backend_id, None)
    if stored is None and live is None:
        raise NotFound(f"no backend {command.backend_id!r} is imported", field="backend_id")
    await bridge.store.delete(command.backend_id)
    if live is not None:
        await live.aclose()  # a COM backend's worker thread stops here, not at process exit
    names = stored.tools if stored else [t.name for t in live.catalog.tools]
    return names, await bridge.registry.unregister(names)


async def restore(bridge: Bridge) -> list[str]:
    """Load every stored import (offline: from the stored documents); return what did not load."""
    problems = []
    for stored in await bridge.store.list():
        try:
            await _live(stored.backend_id, bridge)
        except DomainError as exc:
            log.error("stored import does not load", backend=stored.backend_id, error=exc.to_dict())
            problems.append(f"{stored.backend_id}: {exc}")
    return problems


async def register_all(bridge: Bridge) -> list[str]:
    """Register the tools of every loaded backend with the gateway; return what failed."""
    problems = []
    for backend_id, backend in sorted(bridge.live.items()):
        stored = await bridge.store.get(backend_id)
        options = ImportOptions.from_json(stored.options) if stored else ImportOptions()
        if error := await bridge.registry.register(backend.catalog, options.timeout_seconds, options.retries):
            problems.append(f"{backend_id}: {error}")
    return problems

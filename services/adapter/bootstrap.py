"""Wire the adapter: PostgreSQL store, zeep loader on a shared HTTP client, gateway registration."""

from __future__ import annotations

import asyncio
from pathlib import Path

from libs.auth import service_token
from libs.config import ConfigError, Settings
from libs.errors import DomainError, Unimplemented, ValidationFailed
from libs.logs import get_logger
from libs.runtime import ServiceContext
from services.adapter.adapters.gateway import GatewayRegistry
from services.adapter.adapters.postgres import PostgresBackendStore
from services.adapter.adapters.soap_backend import SoapLoader, parse_credentials
from services.adapter.adapters.soap_http import SoapHttp
from services.adapter.domain.backends import Backend, parse_backends
from services.adapter.domain.com_config import ComObject, parse_com_objects
from services.adapter.domain.commands import ImportWsdl
from services.adapter.entrypoints import grpc_api
from services.adapter.service_layer import handlers
from services.adapter.service_layer.handlers import Bridge

NAME = "adapter"
MIGRATIONS = "services.adapter"

log = get_logger(__name__)


def gateway_token(settings: Settings):
    """The service token for RegisterTool/RemoveTool: configured, or minted (HS256 development) at each call."""
    configured = settings.adapter_gateway_token.get_secret_value() if settings.adapter_gateway_token else ""
    try:
        return service_token(settings, configured, subject="service:adapter", scopes=["tools:admin"],
                             setting="MNEMESH_ADAPTER_GATEWAY_TOKEN")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def load_com(ctx: ServiceContext, objects: list[ComObject], configured: list[Backend], bridge: Bridge) -> None:
    """COM objects become live backends on a Windows host; elsewhere they stay listed, with the reason logged."""
    listed = {b.backend_id for b in configured if b.kind == "com"}
    for backend_id in sorted(listed - {o.backend_id for o in objects}):
        log.error("COM backend has no method allow-list in MNEMESH_ADAPTER_COM_FILE: none of its methods is exposed",
                  backend=backend_id)
    if not objects:
        return
    from services.adapter.adapters.com_backend import com_backends
    from services.adapter.adapters.com_win32 import load_runtime

    try:
        runtime = load_runtime()
    except Unimplemented as exc:
        log.warning("COM backends not loaded", backends=[o.backend_id for o in objects], reason=exc.reason)
        return
    for backend_id, backend in com_backends(objects, runtime).items():
        bridge.live[backend_id] = backend
        ctx.closers.append(backend.aclose)


async def bootstrap(ctx: ServiceContext) -> None:
    settings = ctx.settings
    try:
        configured = parse_backends(settings.adapter_backends)
        credentials = parse_credentials(settings.adapter_credentials)
        com_objects = parse_com_objects(settings.adapter_com_file.read_text() if settings.adapter_com_file else "")
    except ValidationFailed as exc:
        raise ConfigError(f"{exc.field}: {exc.reason} ({exc.hint})") from None
    except OSError as exc:
        raise ConfigError(f"MNEMESH_ADAPTER_COM_FILE cannot be read: {exc}") from None
    http = SoapHttp(max_connections=256)
    ctx.closers.append(http.aclose)
    loader = SoapLoader(http, credentials=credentials, wsdl_dir=Path(settings.adapter_wsdl_dir or
                                                                      settings.data_dir / "wsdl"),
                        concurrency=settings.adapter_concurrency_per_endpoint)
    address = settings.adapter_gateway_address or f"{settings.host}:{settings.tool_gateway_grpc_port}"
    bridge = Bridge(PostgresBackendStore(ctx.db), loader, GatewayRegistry(address, gateway_token(settings)))
    load_com(ctx, com_objects, configured, bridge)
    ctx.add_grpc(grpc_api.registration(bridge, configured))

    async def startup() -> None:
        """Re-load stored imports (offline) and configured SOAP backends, then (re-)register their tools."""
        for problem in await handlers.restore(bridge):
            log.warning("stored import not restored", problem=problem)
        for backend in configured:
            if backend.kind != "soap" or backend.backend_id in bridge.live:
                continue
            location = backend.location
            command = ImportWsdl(backend.backend_id, url=location if "://" in location else "",
                                 path=location if "://" not in location else "")
            try:
                await handlers.import_wsdl(command, bridge, trusted=True)
            except DomainError as exc:
                log.error("configured backend not imported", backend=backend.backend_id, error=exc.to_dict())
        # The gateway may start after us: register again until every tool is there (RegisterTool is
        # idempotent per version), then stay (a finished task would stop the service).
        delay = 2.0
        while await handlers.register_all(bridge):
            await asyncio.sleep(delay)
            delay = min(delay * 2, 60.0)
        await asyncio.Event().wait()

    ctx.tasks.append(startup)

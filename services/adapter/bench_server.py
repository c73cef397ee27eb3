"""The adapter as `mnemesh bench adapter` runs it: in the bench's process, or in a process of its own.

    python -m services.adapter.bench_server WSDL_URL   ->  prints "PORT <n>" once serving, stops at stdin EOF

Either way it is the product's call path: gRPC server with the call pipeline, the Adapter servicer,
the handlers, a SoapLoader on the shared HTTP session (`SoapHttp`); only the store and the gateway registry are
in memory (nothing to persist or register in a benchmark). Backends billing0..billing4 import the
WSDL (five imports time `import_ms_per_operation`).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

__all__ = ["CONCURRENCY", "serve_adapter"]

CONCURRENCY = 8


class _Store:
    def __init__(self) -> None:
        self.rows = {}

    async def get(self, backend_id):
        return self.rows.get(backend_id)

    async def save(self, backend):
        self.rows[backend.backend_id] = backend

    async def delete(self, backend_id):
        return self.rows.pop(backend_id, None) is not None

    async def list(self):
        return list(self.rows.values())


class _NoGateway:
    async def register(self, catalog, timeout_seconds, retries):
        return ""

    async def unregister(self, names):
        return ""


@contextlib.asynccontextmanager
async def serve_adapter(wsdl_url: str) -> AsyncIterator[tuple[object, int, list[float]]]:
    """(bridge, gRPC port, import ms per operation of each of the five imports)."""
    from libs.rpc import GrpcServer
    from mnemesh.infra import free_port
    from services.adapter.adapters.soap_backend import SoapLoader
    from services.adapter.adapters.soap_http import SoapHttp
    from services.adapter.domain.commands import ImportWsdl
    from services.adapter.entrypoints import grpc_api
    from services.adapter.service_layer import handlers
    from services.adapter.service_layer.handlers import Bridge

    http = SoapHttp(max_connections=64)
    try:
        bridge = Bridge(_Store(), SoapLoader(http, credentials={}, wsdl_dir=Path("."), concurrency=CONCURRENCY),
                        _NoGateway())
        port = free_port()
        server = GrpcServer("127.0.0.1", port, [grpc_api.registration(bridge, [])], None)
        await server.start()
        try:
            imports = []
            for i in range(5):
                start = time.perf_counter()
                result = await handlers.import_wsdl(ImportWsdl(f"billing{i}", url=wsdl_url), bridge)
                imports.append((time.perf_counter() - start) * 1000 / len(result.catalog.tools))
            yield bridge, port, imports
        finally:
            await server.stop(0)
    finally:
        await http.aclose()


async def _main(wsdl_url: str) -> None:
    from libs.logs import configure_logging

    configure_logging("bench", "warning")
    async with serve_adapter(wsdl_url) as (_, port, _imports):
        print(f"PORT {port}", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the bench closes stdin


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1]))

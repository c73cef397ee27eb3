"""`mnemesh bench adapter`: calls to the test SOAP service, directly with zeep vs through the adapter's Invoke.

Same run, same concurrency (8 callers), the same operation (get_customer: a nested, recursive
response). Direct: zeep's AsyncClient on httpx. Adapter: gRPC Invoke of an in-process adapter
(argument validation, envelope, HTTP, parsing, JSON conversion, protobuf Struct both ways).
Prints calls/s and p50/p95 of each, their ratio, and one JSON line whose `summary` has exactly
direct_calls_per_s, adapter_calls_per_s, adapter_ratio, added_p50_ms, import_ms_per_operation.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

from libs.config import Settings

__all__ = ["bench_adapter"]

SERVER = Path(__file__).resolve().parents[2] / "tests" / "integration" / "soap_server.py"
CONCURRENCY = 8


async def _start_server() -> tuple[asyncio.subprocess.Process, str]:
    process = await asyncio.create_subprocess_exec(sys.executable, str(SERVER), stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.DEVNULL)
    line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
    if not line.startswith("PORT "):
        raise RuntimeError("the SOAP test server did not start (is spyne installed? `make setup`)")
    return process, f"http://127.0.0.1:{int(line.split()[1])}"


async def _run(call, total: int) -> tuple[float, list[float]]:
    latencies: list[float] = []
    queue = iter(range(total))

    async def worker() -> None:
        for _ in queue:
            start = time.perf_counter()
            await call()
            latencies.append((time.perf_counter() - start) * 1000)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return total / (time.perf_counter() - start), latencies


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def bench_adapter(settings: Settings, repetitions: int, warmup: int) -> list[dict]:
    from zeep import AsyncClient
    from zeep.transports import AsyncTransport

    from libs.protogen.mnemesh.v1 import tools_pb2, tools_pb2_grpc
    from libs.rpc import GrpcServer, channel
    from mnemesh.infra import free_port
    from services.adapter.adapters.soap_backend import SoapLoader
    from services.adapter.domain.commands import ImportWsdl
    from services.adapter.entrypoints import grpc_api
    from services.adapter.service_layer import handlers
    from services.adapter.service_layer.handlers import Bridge

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

    process, base = await _start_server()
    total = max(repetitions, 50)
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=64)) as http:
        bridge = Bridge(_Store(), SoapLoader(http, credentials={}, wsdl_dir=Path("."), concurrency=CONCURRENCY),
                        _NoGateway())
        port = free_port()
        server = GrpcServer("127.0.0.1", port, [grpc_api.registration(bridge, [])], None)
        await server.start()
        try:
            imports = []
            for i in range(5):
                start = time.perf_counter()
                result = await handlers.import_wsdl(ImportWsdl(f"billing{i}", url=f"{base}/soap11?wsdl"), bridge)
                imports.append((time.perf_counter() - start) * 1000 / len(result.catalog.tools))
            transport = AsyncTransport(client=httpx.AsyncClient(limits=httpx.Limits(max_connections=64)))
            direct = AsyncClient(f"{base}/soap11?wsdl", transport=transport)
            async with channel(f"127.0.0.1:{port}") as ch:
                stub = tools_pb2_grpc.AdapterStub(ch)
                request = tools_pb2.InvokeRequest(backend_id="billing0", operation="get_customer")
                request.arguments.update({"customer_id": 2})

                async def via_zeep() -> None:
                    await direct.service.get_customer(customer_id=2)

                async def via_adapter() -> None:
                    reply = await stub.Invoke(request, timeout=30)
                    if reply.HasField("error"):
                        raise RuntimeError(reply.error.reason)

                await _run(via_zeep, max(warmup, 20))
                await _run(via_adapter, max(warmup, 20))
                rounds = {"direct": [], "adapter": []}
                for i in range(3):  # alternate, so machine noise hits both alike
                    for name, call in (("direct", via_zeep), ("adapter", via_adapter))[::1 if i % 2 == 0 else -1]:
                        rounds[name].append(await _run(call, total))
            await transport.aclose()
        finally:
            await server.stop(0)
            process.terminate()
            await process.wait()
    rate = {k: statistics.median(r for r, _ in v) for k, v in rounds.items()}
    lat = {k: [x for _, ls in v for x in ls] for k, v in rounds.items()}
    summary = {"direct_calls_per_s": round(rate["direct"], 1), "adapter_calls_per_s": round(rate["adapter"], 1),
               "adapter_ratio": round(rate["adapter"] / rate["direct"], 3),
               "added_p50_ms": round(_p(lat["adapter"], 0.5) - _p(lat["direct"], 0.5), 3),
               "import_ms_per_operation": round(statistics.median(imports), 3)}
    print(f"\nadapter: {CONCURRENCY} concurrent callers, get_customer, {total} calls x 3 rounds each")
    for name in ("direct", "adapter"):
        print(f"  {name:<8} {rate[name]:8.1f} calls/s   p50 {_p(lat[name], 0.5):7.2f} ms   "
              f"p95 {_p(lat[name], 0.95):7.2f} ms")
    print(f"  ratio adapter/direct (calls/s): {summary['adapter_ratio']:.3f}   added p50: "
          f"{summary['added_p50_ms']:.2f} ms   import: {summary['import_ms_per_operation']:.2f} ms/operation")
    print(json.dumps({"benchmark": "adapter", "summary": summary}))
    return []

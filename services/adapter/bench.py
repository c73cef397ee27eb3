"""`mnemesh bench adapter`: calls to the test SOAP service, directly with zeep vs through the adapter's Invoke.

Same run, same concurrency (8 callers), the same operation (get_customer: a nested, recursive
response), the spyne server in a process of its own, both paths on a pooled HTTP client (64
connections). Direct: zeep's AsyncClient on its httpx transport. Adapter (the summary's figure): gRPC Invoke of
an adapter served in the bench's own process (argument validation, envelope, HTTP, parsing, JSON
conversion, protobuf Struct both ways, on the adapter's aiohttp session), so the callers' side of
gRPC shares its one core.
Adapter process: the same adapter in a process of its own, as deployed (`bench_server.py`),
printed beside the summary under `adapter_process`. Handlers: the adapter's call path without gRPC
(validation, envelope, HTTP, parsing, JSON), in this process, for the breakdown. The CPU each path
costs per call in each process (this one, the SOAP server, the adapter process) is printed under
`cpu_ms_per_call`.
Gateway (when Redis and PostgreSQL are configured): gRPC CallTool of an in-process tool-gateway,
whose whole pipeline (JWT, schema validation, shared rate limits and breaker in Redis, audit row
and event in PostgreSQL) calls that adapter's Invoke.
Prints calls/s and p50/p95 of each, their ratio, and one JSON line whose `summary` has exactly
direct_calls_per_s, adapter_calls_per_s, adapter_ratio, added_p50_ms, import_ms_per_operation
(the gateway path's figures sit beside it, under `gateway`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
from pydantic import SecretStr

from libs.bench import percentile, run_concurrently
from libs.config import Settings
from services.adapter.bench_server import CONCURRENCY, serve_adapter

__all__ = ["bench_adapter"]

SERVER = Path(__file__).resolve().parents[2] / "tests" / "integration" / "soap_server.py"


async def _start_server() -> tuple[asyncio.subprocess.Process, str]:
    process = await asyncio.create_subprocess_exec(sys.executable, str(SERVER), stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.DEVNULL)
    line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
    if not line.startswith("PORT "):
        raise RuntimeError("the SOAP test server did not start (is spyne installed? `make setup`)")
    return process, f"http://127.0.0.1:{int(line.split()[1])}"




@contextlib.asynccontextmanager
async def _gateway(settings: Settings, adapter_port: int) -> AsyncIterator[tuple[str, str] | None]:
    """A tool-gateway in this process calling the adapter on `adapter_port`: (address, token), or None
    without Redis and PostgreSQL. Its schema and keys are dropped afterwards."""
    if not settings.database_url or not settings.redis_url:
        yield None
        return
    import asyncpg
    import redis.asyncio

    from libs.auth import issue_token
    from libs.runtime import run_service
    from mnemesh.infra import free_port
    from mnemesh.registry import load_bootstrap
    from mnemesh.supervisor import check_health

    gw = settings.model_copy(update={
        "namespace": f"bench{uuid.uuid4().hex[:8]}", "tool_gateway_grpc_port": free_port(),
        "mcp_http_port": free_port(), "adapter_grpc_port": adapter_port, "host": "127.0.0.1",
        "metrics_enabled": False, "tool_adapter_token": SecretStr(""), "jwt_secret": SecretStr(secrets.token_hex(32)),
        # the bench measures the pipeline, not the limits: one caller makes every call
        "tool_rate_per_caller": 1e6, "tool_rate_per_tool": 1e6})
    wiring = load_bootstrap("tool-gateway")
    stop = asyncio.Event()
    task = asyncio.create_task(run_service("tool-gateway", gw, wiring.bootstrap,
                                           migrations_package=wiring.migrations, stop=stop))
    address = f"127.0.0.1:{gw.tool_gateway_grpc_port}"
    try:
        async with asyncio.timeout(60):
            while not await check_health(address):
                if task.done():
                    await task
                await asyncio.sleep(0.1)
        yield address, issue_token(gw, subject="bench", tenant_id="bench", scopes=["tools:call", "tools:admin"])
    finally:
        stop.set()
        await task
        client = redis.asyncio.from_url(gw.redis_url)
        keys = [k async for k in client.scan_iter(match=f"{gw.namespace}.*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()
        conn = await asyncpg.connect(gw.database_url)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{gw.namespace}_tool_gateway" CASCADE')
        finally:
            await conn.close()


class _Cpu:
    """CPU seconds used so far by this process and by the child processes the bench started (Linux /proc)."""

    def __init__(self, children: dict[str, int]) -> None:
        self.children = children
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def now(self) -> dict[str, float]:
        used = {"bench": time.process_time()}
        for name, pid in self.children.items():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                used[name] = (int(fields[11]) + int(fields[12])) / self.tick
            except (OSError, IndexError, ValueError):
                pass  # not Linux: no per-process figures
        return used


async def _rounds(paths: list, total: int, warmup: int, cpu: _Cpu) -> tuple[dict[str, list], dict[str, dict]]:
    """Calls/s and latencies of each path, rounds alternating; and each path's CPU ms per call by process."""
    for _, call in paths:
        await run_concurrently(call, max(warmup, 20), CONCURRENCY)
    rounds: dict[str, list] = {name: [] for name, _ in paths}
    used: dict[str, dict[str, float]] = {name: {} for name, _ in paths}
    for i in range(3):  # alternate, so machine noise hits every path alike
        for name, call in paths[::1 if i % 2 == 0 else -1]:
            before = cpu.now()
            rounds[name].append(await run_concurrently(call, total, CONCURRENCY))
            for process, seconds in cpu.now().items():
                used[name][process] = used[name].get(process, 0.0) + seconds - before.get(process, seconds)
    per_call = {name: {process: round(seconds * 1000 / (3 * total), 3) for process, seconds in by.items()}
                for name, by in used.items()}
    return rounds, per_call


@contextlib.asynccontextmanager
async def _adapter_process(wsdl_url: str) -> AsyncIterator[tuple[int, int]]:
    """The same adapter in a process of its own, as deployed: (gRPC port, pid)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.adapter.bench_server", wsdl_url, cwd=str(Path(__file__).resolve().parents[2]),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    try:
        line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
        if not line.startswith("PORT "):
            raise RuntimeError("the bench's adapter process did not start")
        yield int(line.split()[1]), process.pid
    finally:
        process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.terminate()
            await process.wait()


async def bench_adapter(settings: Settings, repetitions: int, warmup: int) -> list[dict]:
    from zeep import AsyncClient
    from zeep.transports import AsyncTransport

    from libs.protogen.mnemesh.v1 import tools_pb2, tools_pb2_grpc
    from libs.rpc import channel
    from services.adapter.adapters.gateway import GatewayRegistry
    from services.adapter.domain.commands import InvokeOperation
    from services.adapter.service_layer import handlers

    process, base = await _start_server()
    total = max(repetitions, 50)
    wsdl_url = f"{base}/soap11?wsdl"
    try:
        async with serve_adapter(wsdl_url) as (bridge, port, imports), _adapter_process(wsdl_url) as (own_port, pid):
            cpu = _Cpu({"soap_server": process.pid, "adapter_process": pid})
            # zeep's own async client, on its httpx transport with a pool as large as the adapter's.
            transport = AsyncTransport(client=httpx.AsyncClient(limits=httpx.Limits(max_connections=64)))
            direct = AsyncClient(wsdl_url, transport=transport)
            request = tools_pb2.InvokeRequest(backend_id="billing0", operation="get_customer")
            request.arguments.update({"customer_id": 2})
            async with channel(f"127.0.0.1:{port}") as ch, channel(f"127.0.0.1:{own_port}") as own_ch:
                stub, own_stub = tools_pb2_grpc.AdapterStub(ch), tools_pb2_grpc.AdapterStub(own_ch)

                async def via_zeep() -> None:
                    await direct.service.get_customer(customer_id=2)

                async def via_adapter() -> None:
                    reply = await stub.Invoke(request, timeout=30)
                    if reply.HasField("error"):
                        raise RuntimeError(reply.error.reason)

                async def via_handlers() -> None:  # the adapter's call path without gRPC, for the breakdown
                    await handlers.invoke(InvokeOperation("billing0", "get_customer", {"customer_id": 2}), bridge)

                async def via_adapter_process() -> None:
                    reply = await own_stub.Invoke(request, timeout=30)
                    if reply.HasField("error"):
                        raise RuntimeError(reply.error.reason)

                rounds, cpu_ms = await _rounds([("direct", via_zeep), ("adapter", via_adapter),
                                                ("adapter_process", via_adapter_process), ("handlers", via_handlers)],
                                               total, warmup, cpu)
            # The gateway runs in this process too: started only now, so its background work (relay,
            # consumers) does not weigh on the adapter figures above; compared with direct calls anew.
            async with _gateway(settings, port) as gateway:
                if gateway is not None:
                    address, token = gateway
                    problem = await GatewayRegistry(address, lambda: token).register(
                        bridge.live["billing0"].catalog, 30.0, 0)
                    if problem:
                        raise RuntimeError(f"the bench gateway refused the tools: {problem}")
                    async with channel(address, token) as gw_channel:
                        gw_stub = tools_pb2_grpc.ToolGatewayStub(gw_channel)
                        gw_request = tools_pb2.CallToolRequest(name="billing0.get_customer")
                        gw_request.arguments.update({"customer_id": 2})

                        async def via_gateway() -> None:
                            reply = await gw_stub.CallTool(gw_request, timeout=30)
                            if reply.HasField("error"):
                                raise RuntimeError(reply.error.reason)

                        second, _ = await _rounds([("direct", via_zeep), ("gateway", via_gateway)], total, warmup,
                                                  cpu)
                    rounds["gateway"], rounds["direct_with_gateway"] = second["gateway"], second["direct"]
            await transport.aclose()
    finally:
        process.terminate()
        await process.wait()
    rate = {k: statistics.median(r for r, _ in v) for k, v in rounds.items()}
    lat = {k: [x for _, ls in v for x in ls] for k, v in rounds.items()}
    summary = {"direct_calls_per_s": round(rate["direct"], 1), "adapter_calls_per_s": round(rate["adapter"], 1),
               "adapter_ratio": round(rate["adapter"] / rate["direct"], 3),
               "added_p50_ms": round(percentile(lat["adapter"], 0.5) - percentile(lat["direct"], 0.5), 3),
               "import_ms_per_operation": round(statistics.median(imports), 3)}
    print(f"\nadapter: {CONCURRENCY} concurrent callers, get_customer, {total} calls x 3 rounds each")
    for name in ("direct", "adapter", "adapter_process", "handlers", "gateway"):
        if name not in rounds:
            continue
        print(f"  {name:<15} {rate[name]:8.1f} calls/s   p50 {percentile(lat[name], 0.5):7.2f} ms   "
              f"p95 {percentile(lat[name], 0.95):7.2f} ms")
    print(f"  ratio adapter/direct (calls/s): {summary['adapter_ratio']:.3f}   added p50: "
          f"{summary['added_p50_ms']:.2f} ms   import: {summary['import_ms_per_operation']:.2f} ms/operation")
    own = {"calls_per_s": round(rate["adapter_process"], 1),
           "ratio_to_direct": round(rate["adapter_process"] / rate["direct"], 3),
           "added_p50_ms": round(percentile(lat["adapter_process"], 0.5) - percentile(lat["direct"], 0.5), 3)}
    print(f"  adapter in a process of its own (as deployed) / direct: {own['ratio_to_direct']:.3f}   added p50: "
          f"{own['added_p50_ms']:.2f} ms")
    print("  CPU ms per call, by process: " + "; ".join(
        f"{name}: " + ", ".join(f"{process} {ms:.2f}" for process, ms in by.items() if ms > 0.005)
        for name, by in cpu_ms.items()))
    line = {"benchmark": "adapter", "summary": summary, "adapter_process": own, "cpu_ms_per_call": cpu_ms}
    if "gateway" in rounds:
        line["gateway"] = {"calls_per_s": round(rate["gateway"], 1), "ratio_to_direct":
                           round(rate["gateway"] / rate["direct_with_gateway"], 3),
                           "p50_ms": round(percentile(lat["gateway"], 0.5), 3), "p95_ms": round(percentile(lat["gateway"], 0.95), 3)}
        print(f"  gateway (gRPC CallTool -> pipeline -> Invoke) / direct in the same rounds "
              f"({rate['direct_with_gateway']:.1f} calls/s): {line['gateway']['ratio_to_direct']:.3f}")
    else:
        print("  gateway path skipped: it needs Redis and PostgreSQL (REDIS_URL, DATABASE_URL)")
    print(json.dumps(line))
    return []

"""`mnemesh bench tools`: one upstream tool called directly with the MCP SDK vs through the gateway.

Same run, same concurrency, same tool: `echo` of a local fixture MCP server (Streamable HTTP, its
own process). Direct: the official SDK client to the fixture. Gateway: the same client to the
gateway's /mcp (one gateway process, `mnemesh serve tool-gateway`, with the fixture federated as
an upstream): bearer auth, scopes, schema validation, Redis rate limits and breaker, the upstream
call, cleaning, the audit row and its event. Also gRPC CallTool of the same tool, and both MCP paths
again with a lean load generator (bare JSON-RPC POSTs on kept-alive connections), which spends far
less CPU per call than the SDK client, so that what the gateway can do is not hidden behind the
client sharing its two cores; and the lean client once more, one call at a time, for the latency the gateway
adds when no call queues for a core (at 8 concurrent callers p50 is about 8 / throughput). Prints calls/s and p50/p95/p99 of each, the CPU per call of the
client, the upstream and the gateway in each phase, the added latency and the throughput ratio, then
one JSON line whose `summary` has exactly direct_calls_per_s, gateway_calls_per_s, added_p50_ms,
added_p95_ms, throughput_ratio, grpc_calls_per_s (all from the SDK client, as the issue defines them;
the lean client's figures are beside it, under `lean_client`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import asyncpg
import httpx2
import psutil
from google.protobuf import struct_pb2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from pydantic import SecretStr

from libs.bench import percentile, run_concurrently
from libs.auth import issue_token
from libs.config import Settings
from libs.protogen.mnemesh.v1 import tools_pb2, tools_pb2_grpc
from services.tool_gateway.adapters.http1 import Http1Pool
from libs.rpc import channel
from mnemesh.infra import free_port
from mnemesh.supervisor import check_health

__all__ = ["bench_tools"]

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "integration" / "upstream_server.py"
CONCURRENCY = 8
LEAN_REVISION = "2026-07-28"
ARGS = {"text": "hello", "times": 2}


async def _answers(url: str) -> bool:
    async with httpx2.AsyncClient(timeout=2) as http:
        try:
            await http.get(url)
        except httpx2.TransportError:
            return False
    return True


async def _wait(ready: Callable[[], Awaitable[bool]], process: asyncio.subprocess.Process, what: str) -> None:
    deadline = time.monotonic() + 60
    while not await ready():
        if process.returncode is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start (exit code {process.returncode})")
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def _process(*argv: str, env: dict[str, str] | None = None) -> AsyncIterator[asyncio.subprocess.Process]:
    process = await asyncio.create_subprocess_exec(*argv, env=env, stdout=asyncio.subprocess.DEVNULL,
                                                   stderr=asyncio.subprocess.DEVNULL)
    try:
        yield process
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 15)
            except TimeoutError:
                process.kill()
                await process.wait()


def _cpu_seconds(process: asyncio.subprocess.Process | None) -> float:
    """User + system CPU time of a child process (None: this one, the load generator) so far (the
    machine's load does not inflate it)."""
    times = psutil.Process(process.pid if process is not None else None).cpu_times()
    return times.user + times.system


@contextlib.asynccontextmanager
async def _cpu_per_call(calls: int, processes: dict[str, asyncio.subprocess.Process | None],
                        into: dict[str, float]) -> AsyncIterator[None]:
    """CPU milliseconds per call that each process spent while the block ran."""
    before = {name: _cpu_seconds(p) for name, p in processes.items()}
    yield
    for name, p in processes.items():
        into[name] = round((_cpu_seconds(p) - before[name]) * 1000 / calls, 3)


def _figures(rate: float, latencies: list[float]) -> dict[str, float]:
    return {"calls_per_s": round(rate, 1), "p50_ms": round(percentile(latencies, 0.5), 3),
            "p95_ms": round(percentile(latencies, 0.95), 3), "p99_ms": round(percentile(latencies, 0.99), 3)}


async def _mcp_calls(url: str, tool: str, token: str, total: int, warmup: int) -> tuple[float, list[float]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http, \
            Client(streamable_http_client(url, http_client=http)) as client:
        async def one() -> None:
            result = await client.call_tool(tool, ARGS)
            if result.is_error:
                raise RuntimeError(f"{tool} failed: {result.content[0].text[:300]}")

        await run_concurrently(one, warmup, CONCURRENCY)
        return await run_concurrently(one, total, CONCURRENCY)


def _lean_request(tool: str) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": tool, "arguments": ARGS, "_meta": {"io.modelcontextprotocol/protocolVersion": LEAN_REVISION,
                                                   "io.modelcontextprotocol/clientInfo": {"name": "bench",
                                                                                          "version": "0"},
                                                   "io.modelcontextprotocol/clientCapabilities": {}}}}).encode()


async def _lean_calls(url: str, tool: str, token: str, total: int, warmup: int,
                      concurrency: int = CONCURRENCY) -> tuple[float, list[float]]:
    """The same calls as `_mcp_calls` as bare 2026-07-28 JSON-RPC POSTs on kept-alive connections: a load
    generator that spends little CPU of its own, so the paths, not the client, are what is measured."""
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
               "MCP-Protocol-Version": LEAN_REVISION, "Mcp-Method": "tools/call", "Mcp-Name": tool}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    body, pool = _lean_request(tool), Http1Pool(url, max_idle=concurrency)

    async def one() -> None:
        async with pool.post(body, headers) as response:
            answer = json.loads(await response.read())
        if response.status != 200 or answer.get("result", {}).get("isError", True):
            raise RuntimeError(f"{tool} failed: {str(answer)[:300]}")

    try:
        await run_concurrently(one, warmup, concurrency)
        return await run_concurrently(one, total, concurrency)
    finally:
        await pool.aclose()


async def _grpc_calls(address: str, token: str, total: int, warmup: int) -> tuple[float, list[float]]:
    args = struct_pb2.Struct()
    args.update(ARGS)
    async with channel(address, token) as ch:
        stub = tools_pb2_grpc.ToolGatewayStub(ch)

        async def one() -> None:
            response = await stub.CallTool(tools_pb2.CallToolRequest(name="fx.echo", arguments=args), timeout=30)
            if response.HasField("error"):
                raise RuntimeError(f"gRPC CallTool failed: {response.error.reason}")

        await run_concurrently(one, warmup, CONCURRENCY)
        return await run_concurrently(one, total, CONCURRENCY)


async def bench_tools(settings: Settings, repetitions: int, warmup: int, work_dir: str = "") -> dict:
    total = max(repetitions, 200)
    namespace = f"bench{uuid.uuid4().hex[:8]}"
    upstream_port, grpc_port, mcp_port = free_port(), free_port(), free_port()
    upstream_url = f"http://127.0.0.1:{upstream_port}/mcp"
    config = Path(work_dir or os.environ.get("TMPDIR", "/tmp")) / f"{namespace}-upstreams.json"
    config.write_text(json.dumps({"upstreams": [{"name": "fx", "url": upstream_url}]}))
    secret = "bench-secret-0123456789abcdef0123456789"
    env = {**os.environ, "REDIS_URL": settings.redis_url or "", "DATABASE_URL": settings.database_url or "",
           "MNEMESH_NAMESPACE": namespace, "MNEMESH_JWT_SECRET": secret, "MNEMESH_METRICS_ENABLED": "false",
           "MNEMESH_TOOL_GATEWAY_GRPC_PORT": str(grpc_port), "MNEMESH_MCP_HTTP_PORT": str(mcp_port),
           "MNEMESH_TOOL_UPSTREAMS_FILE": str(config), "MNEMESH_LOG_LEVEL": "warning",
           "MNEMESH_TOOL_RATE_PER_CALLER": "1000000", "MNEMESH_TOOL_RATE_PER_TOOL": "1000000"}
    token = issue_token(settings.model_copy(update={"jwt_secret": SecretStr(secret)}), subject="bench", tenant_id="bench",
                        scopes=["tools:read", "tools:call"])
    gateway_url = f"http://127.0.0.1:{mcp_port}/mcp"
    cpu: dict[str, dict[str, float]] = {"direct": {}, "gateway": {}, "grpc": {}, "lean_direct": {},
                                         "lean_gateway": {}}
    try:
        async with _process(sys.executable, str(FIXTURE), "http", str(upstream_port)) as upstream, \
                _process(sys.executable, "-m", "mnemesh", "serve", "tool-gateway", env=env) as gateway:
            await _wait(lambda: _answers(upstream_url), upstream, "the fixture MCP server")
            await _wait(lambda: check_health(f"127.0.0.1:{grpc_port}"), gateway, "the tool-gateway")
            # The gateway connects its upstream in the background: one successful call says it is up.
            deadline = time.monotonic() + 30
            while True:
                try:
                    await _mcp_calls(gateway_url, "fx.echo", token, 1, 0)
                    break
                except (RuntimeError, ExceptionGroup):  # the SDK client's task group wraps the failure
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
            both = {"client": None, "upstream": upstream, "gateway": gateway}
            # Warm-up calls are included in the CPU figures; they are a few percent of the calls.
            async with _cpu_per_call(total + warmup, both, cpu["direct"]):
                direct = await _mcp_calls(upstream_url, "echo", "", total, warmup)
            async with _cpu_per_call(total + warmup, both, cpu["gateway"]):
                through = await _mcp_calls(gateway_url, "fx.echo", token, total, warmup)
            async with _cpu_per_call(total + warmup, both, cpu["grpc"]):
                grpc_rate, grpc_latencies = await _grpc_calls(f"127.0.0.1:{grpc_port}", token, total, warmup)
            # The same two MCP paths with a lean load generator (not in the summary: the SDK client is the
            # issue's yardstick), to show what the gateway does when the client is not the bottleneck.
            async with _cpu_per_call(total + warmup, both, cpu["lean_direct"]):
                lean_direct = await _lean_calls(upstream_url, "echo", "", total, warmup)
            async with _cpu_per_call(total + warmup, both, cpu["lean_gateway"]):
                lean_through = await _lean_calls(gateway_url, "fx.echo", token, total, warmup)
            # One call at a time: what the gateway adds to a call when nothing queues on the two cores.
            unloaded = [await _lean_calls(url, tool, key, max(total // 2, 100), warmup, concurrency=1)
                        for url, tool, key in ((upstream_url, "echo", ""), (gateway_url, "fx.echo", token))]
    finally:
        config.unlink(missing_ok=True)
        await _drop(settings, namespace)
    d, g = _figures(*direct), _figures(*through)
    summary = {"direct_calls_per_s": d["calls_per_s"], "gateway_calls_per_s": g["calls_per_s"],
               "added_p50_ms": round(g["p50_ms"] - d["p50_ms"], 3), "added_p95_ms": round(g["p95_ms"] - d["p95_ms"], 3),
               "throughput_ratio": round(g["calls_per_s"] / d["calls_per_s"], 3),
               "grpc_calls_per_s": round(grpc_rate, 1)}
    ld, lg = _figures(*lean_direct), _figures(*lean_through)
    ud, ug = (_figures(*figures) for figures in unloaded)
    lean = {"direct": ld, "gateway": lg, "added_p50_ms": round(lg["p50_ms"] - ld["p50_ms"], 3),
            "throughput_ratio": round(lg["calls_per_s"] / ld["calls_per_s"], 3),
            "one_at_a_time": {"direct": ud, "gateway": ug, "added_p50_ms": round(ug["p50_ms"] - ud["p50_ms"], 3),
                              "added_p95_ms": round(ug["p95_ms"] - ud["p95_ms"], 3)}}
    for label, f in (("direct MCP", d), ("through the gateway (MCP)", g),
                     ("through the gateway (gRPC)", _figures(grpc_rate, grpc_latencies)),
                     ("lean client, direct", ld), ("lean client, gateway", lg),
                     ("lean, 1 at a time, direct", ud), ("lean, 1 at a time, gateway", ug)):
        print(f"{label:28s} {f['calls_per_s']:8.1f} calls/s  p50 {f['p50_ms']:7.2f} ms  p95 {f['p95_ms']:7.2f} ms  "
              f"p99 {f['p99_ms']:7.2f} ms")
    print("CPU per call (ms): " + "; ".join(f"{phase}: " + ", ".join(f"{k} {v}" for k, v in figures.items())
                                           for phase, figures in cpu.items()))
    print(f"added p50 {summary['added_p50_ms']} ms, p95 {summary['added_p95_ms']} ms; "
          f"throughput ratio {summary['throughput_ratio']} ({total} calls each, {CONCURRENCY} concurrent); "
          f"lean client: added p50 {lean['added_p50_ms']} ms, throughput ratio {lean['throughput_ratio']}; "
          f"one call at a time: added p50 {lean['one_at_a_time']['added_p50_ms']} ms, "
          f"p95 {lean['one_at_a_time']['added_p95_ms']} ms")
    return {"calls": total, "concurrency": CONCURRENCY, "direct": d, "gateway": g,
            "grpc": _figures(grpc_rate, grpc_latencies), "lean_client": lean, "cpu_ms_per_call": cpu,
            "summary": summary}


async def _drop(settings: Settings, namespace: str) -> None:
    import redis.asyncio

    client = redis.asyncio.from_url(settings.redis_url)
    try:
        keys = [k async for k in client.scan_iter(match=f"{namespace}.*")]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()
    conn = await asyncpg.connect(settings.database_url)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{namespace}_tool_gateway" CASCADE')
    finally:
        await conn.close()

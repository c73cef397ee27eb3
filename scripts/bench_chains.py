"""What a chain costs a call: the call pipeline in process, on real Redis, with and without a chain id.

The pipeline runs with the gateway's Redis adapters (gate, breakers, results, chains; a namespace of
its own, deleted after), a backend that answers at once and an in-memory registry and call log, so the
figures are the pipeline's own work plus its Redis round trips. Three kinds of call, interleaved
in rounds: no chain id; a new step of a chain (the chain read, the step and its result written); a
replayed step (the chain read, the kept result read and kept again under the new call id).

    MNEMESH_TEST_INFRA=local .venv/bin/python scripts/test_infra.py -- .venv/bin/python scripts/bench_chains.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid

import redis.asyncio

from libs.auth import Principal
from services.tool_gateway.adapters.redis_chains import RedisChainStore
from services.tool_gateway.adapters.redis_state import (
    RedisBreakers,
    RedisCanaryCounters,
    RedisGate,
    RedisRateLimiter,
    RedisResultStore,
)
from services.tool_gateway.domain import ToolCall, ToolSpec
from services.tool_gateway.service_layer.pipeline import CallPolicy, CallPorts, call_tool

SPEC = ToolSpec(name="bench.echo", description="Answers its arguments at once.", input_schema={"type": "object"})
AGENT = Principal(subject="bench", tenant_id="bench", scopes=frozenset({"tools:call"}))


class Registry:
    async def lookup(self, name: str):
        return ([SPEC] if name == SPEC.name else []), None

    async def versions(self, name: str):
        return [SPEC] if name == SPEC.name else []


class Backend:
    async def call(self, spec, arguments, timeout):
        return {"echo": arguments}


class CallLog:
    def __init__(self) -> None:
        self.rows = 0

    async def record(self, record) -> None:
        self.rows += 1


async def main(calls: int, rounds: int) -> None:
    url = os.environ.get("MNEMESH_REDIS_URL") or os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    client = redis.asyncio.from_url(url)
    namespace = f"bench{uuid.uuid4().hex[:8]}"

    async def factory():
        return client

    limiter, breakers = RedisRateLimiter(factory, namespace), RedisBreakers(factory, namespace)
    ports = CallPorts(registry=Registry(), limiter=limiter, breakers=breakers, gate=RedisGate(limiter, breakers),
                      backends=Backend(), call_log=CallLog(), results=RedisResultStore(factory, namespace),
                      canaries=RedisCanaryCounters(factory, namespace), chains=RedisChainStore(factory, namespace),
                      policy=CallPolicy(rate_per_caller=1e9, rate_per_tool=1e9))

    async def timed(make) -> list[float]:
        out = []
        for i in range(calls):
            call = make(i)
            started = time.perf_counter()
            outcome = await call_tool(call, ports)
            out.append((time.perf_counter() - started) * 1000)
            assert outcome.error is None, outcome.error
        return out

    kinds = {
        "no chain": lambda i: ToolCall(SPEC.name, {"i": i}, AGENT),
        "new chain step": lambda i: ToolCall(SPEC.name, {"i": i}, AGENT, chain_id=f"c-{uuid.uuid4().hex}"),
        "replayed step": lambda i: ToolCall(SPEC.name, {"i": 0}, AGENT, chain_id="replayed"),
    }
    await call_tool(kinds["replayed step"](0), ports)  # the step every replayed call finds done
    medians: dict[str, list[float]] = {k: [] for k in kinds}
    try:
        await timed(kinds["no chain"])  # warm up
        for _ in range(rounds):
            for kind, make in kinds.items():
                medians[kind].append(statistics.median(await timed(make)))
    finally:
        await breakers.close()
        keys = [k async for k in client.scan_iter(match=f"{namespace}.*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()
    base = statistics.median(medians["no chain"])
    summary = {}
    for kind, values in medians.items():
        m = statistics.median(values)
        summary[kind] = {"median_ms": round(m, 3), "round_medians_ms": [round(v, 3) for v in values],
                         "ratio_to_no_chain": round(m / base, 2)}
        print(f"{kind:16} median {m:.3f} ms per call (rounds: {', '.join(f'{v:.3f}' for v in values)}), "
              f"{m / base:.2f}x no chain")
    print(json.dumps({"calls_per_round": calls, "rounds": rounds, "load": os.getloadavg(), "summary": summary}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    ns = parser.parse_args()
    asyncio.run(main(ns.calls, ns.rounds))

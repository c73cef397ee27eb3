"""A small benchmark harness: the same work against a baseline, in the same run.

Each case runs `warmup` untimed rounds, then `repetitions` timed rounds that
alternate candidate and baseline (so machine noise hits both alike). It prints
medians, p95/p99 and the ratio candidate/baseline per case, then one final JSON
line with every figure, for scripts to read.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

__all__ = ["Case", "Stats", "report", "run_case"]

Work = Callable[[int], Awaitable[None]]


@dataclass(frozen=True)
class Case:
    name: str
    candidate: Work  # called with the round number
    baseline: Work
    description: str = ""


@dataclass(frozen=True)
class Stats:
    median_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    samples: int

    @classmethod
    def of(cls, samples: list[float]) -> Stats:
        ordered = sorted(samples)

        def pct(p: float) -> float:
            return ordered[min(len(ordered) - 1, int(round(p * (len(ordered) - 1))))]

        return cls(statistics.median(ordered), pct(0.95), pct(0.99), statistics.fmean(ordered), len(ordered))


def percentile(samples: list[float], q: float) -> float:
    """The sample at quantile `q` (nearest rank); 0.0 for no samples."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


async def run_concurrently(call: Callable[[], Awaitable[None]], total: int,
                           concurrency: int) -> tuple[float, list[float]]:
    """`total` calls by `concurrency` workers; calls per second and each call's latency in ms."""
    latencies: list[float] = []
    queue = iter(range(total))

    async def worker() -> None:
        for _ in queue:
            start = time.perf_counter()
            await call()
            latencies.append((time.perf_counter() - start) * 1000)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return total / (time.perf_counter() - start), latencies


async def run_case(case: Case, *, repetitions: int, warmup: int, progress=sys.stderr) -> dict:
    for i in range(warmup):
        await case.candidate(i)
        await case.baseline(i)
    cand, base = [], []
    for i in range(repetitions):
        for work, out in ((case.candidate, cand), (case.baseline, base)) if i % 2 == 0 else (
                (case.baseline, base), (case.candidate, cand)):
            start = time.perf_counter()
            await work(warmup + i)
            out.append((time.perf_counter() - start) * 1000)
        if progress and (i + 1) % max(1, repetitions // 10) == 0:
            print(f"  {case.name}: {i + 1}/{repetitions}", file=progress, flush=True)
    c, b = Stats.of(cand), Stats.of(base)
    return {"case": case.name, "description": case.description, "candidate": c.__dict__, "baseline": b.__dict__,
            "ratio_median": c.median_ms / b.median_ms if b.median_ms else float("inf"),
            "ratio_p95": c.p95_ms / b.p95_ms if b.p95_ms else float("inf")}


def report(benchmark: str, results: list[dict]) -> None:
    print(f"\n{benchmark}: candidate vs baseline (ms; ratio = candidate / baseline)")
    print(f"  {'case':<28} {'cand p50':>9} {'cand p95':>9} {'base p50':>9} {'base p95':>9} {'ratio p50':>9}")
    for r in results:
        c, b = r["candidate"], r["baseline"]
        print(f"  {r['case']:<28} {c['median_ms']:>9.3f} {c['p95_ms']:>9.3f} {b['median_ms']:>9.3f} "
              f"{b['p95_ms']:>9.3f} {r['ratio_median']:>9.2f}")
    print(json.dumps({"benchmark": benchmark, "results": results}))

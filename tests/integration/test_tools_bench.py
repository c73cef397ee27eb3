"""`mnemesh bench tools` on a short run: every path answers, and the summary has exactly the issue's keys."""

from __future__ import annotations

import pytest

from libs.config import load_settings
from services.tool_gateway.bench import bench_tools

pytestmark = pytest.mark.integration


async def test_the_tools_benchmark_calls_every_path_and_reports_the_issues_summary(
        redis_url: str, database_url: str, tmp_path) -> None:
    settings = load_settings(redis_url=redis_url, database_url=database_url)
    outcome = await bench_tools(settings, repetitions=200, warmup=5, work_dir=str(tmp_path))
    summary = outcome["summary"]
    assert set(summary) == {"direct_calls_per_s", "gateway_calls_per_s", "added_p50_ms", "added_p95_ms",
                            "throughput_ratio", "grpc_calls_per_s"}
    assert all(summary[k] > 0 for k in ("direct_calls_per_s", "gateway_calls_per_s", "grpc_calls_per_s"))
    assert summary["throughput_ratio"] == round(summary["gateway_calls_per_s"] / summary["direct_calls_per_s"], 3)
    unloaded = outcome["lean_client"]["one_at_a_time"]
    assert unloaded["added_p50_ms"] == round(unloaded["gateway"]["p50_ms"] - unloaded["direct"]["p50_ms"], 3)
    assert unloaded["direct"]["calls_per_s"] > 0 and unloaded["gateway"]["calls_per_s"] > 0
    assert set(outcome["cpu_ms_per_call"]) == {"direct", "gateway", "grpc", "lean_direct", "lean_gateway"}

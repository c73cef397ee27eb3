"""`mnemesh bench sessions` on a short run: every device converges and the summary has exactly the issue's keys."""

from __future__ import annotations

import pytest

from libs.config import load_settings
from services.orchestrator.bench import bench_sessions

pytestmark = pytest.mark.integration


async def test_the_sessions_benchmark_converges_every_device_and_reports_the_issues_summary(
        redis_url: str, database_url: str) -> None:
    settings = load_settings(redis_url=redis_url, database_url=database_url,
                             jwt_secret="bench-test-secret-0123456789abcdef")
    outcome = await bench_sessions(settings, repetitions=5, warmup=1, seconds=0.5, rate=40.0, devices=5)
    assert set(outcome["summary"]) == {"events_per_s", "devices", "convergence_p50_ms", "convergence_p99_ms",
                                       "turn_p50_ms", "turn_p95_ms"}
    convergence = outcome["results"][0]["convergence"]
    assert convergence["converged"] and convergence["sends"] == 20
    baseline = outcome["results"][0]["convergence_baseline"]
    assert baseline["converged"] and baseline["sends"] == 20 and set(outcome["results"][0]["ratios"]) == {
        "events_per_s", "lag_p99"}
    assert outcome["summary"]["devices"] == 5 and outcome["results"][0]["turn_rule_path"]["samples"] == 5

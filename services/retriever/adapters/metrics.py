"""The retriever's metrics (OpenTelemetry, exported on the service's metrics endpoint).

hit rate = retriever.searches{hit=true} / retriever.searches; freshness = retriever.returned.age
(mean age of returned memories); per-stage latency histograms (p50/p95/p99 in the backend);
index size; projection lag (event occurred -> indexed).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

from opentelemetry import metrics

__all__ = ["RetrieverMetrics"]


class RetrieverMetrics:
    def __init__(self, index_size: Callable[[], int] | None = None) -> None:
        meter = metrics.get_meter("mnemesh.retriever")
        self._stage = meter.create_histogram("retriever.stage.duration", unit="s",
                                             description="time per search/index stage")
        self._searches = meter.create_counter("retriever.searches", description="searches, by whether they hit")
        self._age = meter.create_histogram("retriever.returned.age", unit="s",
                                           description="age of each returned memory (freshness)")
        self._lag = meter.create_histogram("retriever.projection.lag", unit="s",
                                           description="memory event occurred -> projected")
        self._size_cache = (0.0, 0)
        if index_size is not None:
            def observe(_options):
                at, size = self._size_cache
                if time.monotonic() - at > 30:  # an exact count scans: at most every 30 s
                    size = index_size()
                    self._size_cache = (time.monotonic(), size)
                yield metrics.Observation(size)

            meter.create_observable_gauge("retriever.index.points", callbacks=[observe],
                                          description="points in the vector index")

    def stage(self, name: str, seconds: float) -> None:
        self._stage.record(seconds, {"stage": name})

    def returned(self, hits) -> None:
        self._searches.add(1, {"hit": bool(hits)})
        for h in hits:
            self._age.record(h.age_seconds)

    def lag(self, occurred_at: datetime) -> None:
        self._lag.record(max((datetime.now(UTC) - occurred_at).total_seconds(), 0.0))

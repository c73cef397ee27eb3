"""Logs are JSON lines that carry the trace and span of the work they describe."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
import structlog
from opentelemetry.sdk.trace import TracerProvider

from libs.logs import configure_logging, get_logger


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """configure_logging binds logs to this test's captured stderr, closed afterwards: undo it, so that
    later tests whose code logs do not write to a closed file."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)


def test_a_log_line_inside_a_span_carries_its_trace_and_span_ids(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("unit", "info")
    tracer = TracerProvider().get_tracer("unit")
    with tracer.start_as_current_span("work") as span:
        get_logger("unit").info("did something", item="会员")
    line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    ctx = span.get_span_context()
    assert line["event"] == "did something" and line["item"] == "会员" and line["service"] == "unit"
    assert line["trace_id"] == format(ctx.trace_id, "032x") and line["span_id"] == format(ctx.span_id, "016x")

"""OpenTelemetry traces and metrics, and trace context carried across hops.

Traces go to an OTLP endpoint when one is configured; metrics are always served
in Prometheus format on the service's metrics port (and pushed over OTLP too
when configured). ``inject``/``extract`` carry the W3C ``traceparent`` through
gRPC metadata and stream event headers, so one trace spans gRPC -> stream ->
consumer.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, MutableMapping

from opentelemetry import metrics, propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

__all__ = ["MetricsPortInUse", "current_traceparent", "extract", "inject", "setup_telemetry", "shutdown_telemetry",
           "tracer"]


class MetricsPortInUse(Exception):
    pass

_configured = False


def setup_telemetry(
    service: str,
    *,
    otlp_endpoint: str | None = None,
    metrics_port: int = 0,
    host: str = "127.0.0.1",
    span_exporter: SpanExporter | None = None,
    instance: str = "",
) -> None:
    """Install the global tracer and meter providers once per process; `instance` (the replica's name)
    tells the series of two processes of one service apart."""
    global _configured
    if _configured:
        return
    attributes = {"service.name": f"mnemesh-{service}", "service.namespace": "mnemesh"}
    if instance:
        attributes["service.instance.id"] = instance
    resource = Resource.create(attributes)
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    if span_exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(span_exporter))
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint, insecure=True,
                                                                        timeout=5)))
    trace.set_tracer_provider(provider)

    readers: list[MetricReader] = []
    if metrics_port:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server

        try:
            start_http_server(metrics_port, addr=host)
        except OSError as exc:
            raise MetricsPortInUse(f"cannot serve metrics on {host}:{metrics_port}: {exc.strerror}; stop what holds "
                                   f"the port, or set MNEMESH_{service.upper().replace('-', '_')}_METRICS_PORT "
                                   "(0 turns metrics off)") from None
        readers.append(PrometheusMetricReader())
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=otlp_endpoint, insecure=True,
                                                                        timeout=5)))
    metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers, shutdown_on_exit=False))
    _configured = True


def shutdown_telemetry(timeout_seconds: float = 2.0) -> None:
    """Flush what is buffered and stop the exporters, within a bound: a slow or absent collector
    must not hold up a service's stop (the SDK's own exit hook may wait 30 s and more).

    The SDK does not honour every timeout it is given, so the work runs in a daemon thread
    that is abandoned when the bound is reached.
    """
    tracer_provider, meter_provider = trace.get_tracer_provider(), metrics.get_meter_provider()

    def flush_and_stop() -> None:
        if isinstance(tracer_provider, TracerProvider):
            tracer_provider.force_flush(timeout_millis=timeout_seconds * 1000)
            tracer_provider.shutdown()
        if isinstance(meter_provider, MeterProvider):
            meter_provider.shutdown(timeout_millis=timeout_seconds * 1000)

    worker = threading.Thread(target=flush_and_stop, name="telemetry-shutdown", daemon=True)
    worker.start()
    worker.join(timeout_seconds)


def tracer(name: str = "mnemesh") -> trace.Tracer:
    return trace.get_tracer(name)


def inject(carrier: MutableMapping[str, str], context: Context | None = None) -> MutableMapping[str, str]:
    propagate.inject(carrier, context=context)
    return carrier


def extract(carrier: Mapping[str, str]) -> Context:
    return propagate.extract(carrier)


def current_traceparent() -> str:
    return inject({}).get("traceparent", "")

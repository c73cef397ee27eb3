"""Traces leave a service over OTLP when an endpoint is configured: a real OTLP gRPC receiver gets them."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import anyio
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from libs.auth import issue_token
from libs.config import load_settings
from libs.protogen.mnemesh.v1 import tools_pb2, tools_pb2_grpc
from libs.rpc import channel
from mnemesh.infra import free_port

pytestmark = pytest.mark.integration
SECRET = "otlp-test-secret-0123456789abcdefghij"


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[tuple[str, str]] = []  # (service.name, span name)
        self.arrived = asyncio.Event()

    async def Export(self, request, context):
        for resource_spans in request.resource_spans:
            attrs = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                self.spans += [(attrs.get("service.name", ""), span.name) for span in scope.spans]
        self.arrived.set()
        return trace_service_pb2.ExportTraceServiceResponse()


async def test_a_service_exports_its_rpc_spans_to_the_configured_otlp_endpoint(
    redis_url: str, database_url: str, tmp_path
) -> None:
    receiver, collector = Receiver(), grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, collector)
    otlp_port = collector.add_insecure_port("127.0.0.1:0")
    await collector.start()
    grpc_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MNEMESH_", "OTEL_"))}
    env |= {"REDIS_URL": redis_url, "DATABASE_URL": database_url, "MNEMESH_DATA_DIR": str(tmp_path),
            "MNEMESH_NAMESPACE": "otlp", "MNEMESH_ADAPTER_GRPC_PORT": str(grpc_port),
            "MNEMESH_ADAPTER_METRICS_PORT": "0", "MNEMESH_JWT_SECRET": SECRET,
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{otlp_port}", "OTEL_BSP_SCHEDULE_DELAY": "100"}
    service = subprocess.Popen([sys.executable, "-m", "mnemesh", "serve", "adapter"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
            await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=60,
                                                       wait_for_ready=True)
        token = issue_token(load_settings(jwt_secret=SECRET), subject="u", tenant_id="t1", scopes=["*"])
        async with channel(f"127.0.0.1:{grpc_port}", token) as ch:
            await tools_pb2_grpc.AdapterStub(ch).ListBackends(tools_pb2.ListBackendsRequest(), timeout=10)
        with anyio.fail_after(30):
            while ("mnemesh-adapter", "mnemesh.v1.Adapter/ListBackends") not in receiver.spans:
                receiver.arrived.clear()
                await receiver.arrived.wait()
        stopping = time.monotonic()
        service.terminate()
        assert service.wait(15) == 0
        # A collector attached must not slow the stop (exporters flush within a bound).
        assert time.monotonic() - stopping < 5
    finally:
        if service.poll() is None:
            service.kill()
            service.wait()
        service.stderr.close()
        await collector.stop(0)

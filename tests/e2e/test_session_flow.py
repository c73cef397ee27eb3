"""The orchestrator's loop through the running mesh: `mnemesh run` → a user message → a memory recalled
through the retriever → a tool called through the tool-gateway (a real HTTP backend) → a grounded reply
→ every subscribed device sees the same session.

The orchestrator reaches the other services only over gRPC (the supervisor gives it their addresses),
so this is the test of its gRPC ports against the real retriever, memory-writer and tool-gateway.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import httpx
import pytest
from a2a.client import A2ACardResolver
from google.protobuf import struct_pb2
from test_mesh import Mesh

from libs.auth import issue_token
from libs.config import load_settings
from libs.protogen.mnemesh.v1 import (
    common_pb2,
    memory_pb2,
    memory_pb2_grpc,
    sessions_pb2,
    sessions_pb2_grpc,
    tools_pb2,
    tools_pb2_grpc,
)
from services.orchestrator.adapters.a2a_client import A2AAgents
from services.orchestrator.adapters.grpc_ports import GrpcToolGateway

pytestmark = pytest.mark.e2e
TENANT = "acme"
USER = "u-flow"


class OrderBackend:
    """A real HTTP/JSON order service on a free loopback port; it records the paths it was asked for."""

    def __init__(self) -> None:
        calls = self.calls = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server interface
                calls.append(self.path)
                order_id = self.path.rsplit("/", 1)[-1]
                body = json.dumps({"order_id": order_id, "status": "shipped", "eta": "2026-03-14"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture(scope="module")
def backend() -> Iterator[OrderBackend]:
    served = OrderBackend()
    served.thread.start()
    yield served
    served.server.shutdown()
    served.server.server_close()


@pytest.fixture(scope="module")
def mesh(tmp_path_factory) -> Iterator[Mesh]:
    with Mesh.running(tmp_path_factory.mktemp("flow"), stop_timeout=15) as mesh:
        yield mesh


def struct(values: dict) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(values)
    return out


class Device:
    """One device following the session (gRPC Subscribe from version 0) until the turn's reply is settled."""

    def __init__(self, mesh: Mesh, session_id: str, metadata: list) -> None:
        self.events: list[sessions_pb2.SessionEvent] = []
        self.done = threading.Event()
        self.channel = mesh.channel("orchestrator")
        self.stream = sessions_pb2_grpc.OrchestratorStub(self.channel).Subscribe(sessions_pb2.SubscribeRequest(
            tenant=common_pb2.TenantContext(tenant_id=TENANT), session_id=session_id, from_version=0),
            metadata=metadata, timeout=120)
        self.thread = threading.Thread(target=self._follow, daemon=True)
        self.thread.start()

    def _follow(self) -> None:
        ended = False
        try:
            for event in self.stream:
                self.events.append(event)
                ended = ended or event.HasField("task_ended")
                if ended and event.HasField("state_changed") and event.state_changed.to_state == "IDLE":
                    return
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                raise
        finally:
            self.done.set()

    def close(self) -> None:
        self.stream.cancel()
        self.thread.join(5)
        self.channel.close()


@pytest.fixture(scope="module")
def order_tool(mesh: Mesh, backend: OrderBackend) -> str:
    """The tool the order rule names, registered through the gateway's gRPC API with a real HTTP backend."""
    with mesh.channel("tool-gateway") as ch:
        tools_pb2_grpc.ToolGatewayStub(ch).RegisterTool(tools_pb2.RegisterToolRequest(tool=common_pb2.ToolSpec(
            name="orders.get_status", description="The delivery status of an order, by its order number.",
            input_schema=struct({"type": "object", "properties": {"order_id": {"type": "string"}},
                                 "required": ["order_id"]}),
            version="1.0.0", timeout_seconds=5, backend=f"http:GET {backend.url}/orders/{{order_id}}")),
            metadata=[("authorization", f"Bearer {mesh.token()}")], timeout=10)
    return "orders.get_status"


def test_a_message_is_answered_from_memory_and_a_gateway_tool_and_every_device_sees_it(
        mesh: Mesh, backend: OrderBackend, order_tool: str) -> None:
    metadata = [("authorization", f"Bearer {mesh.token()}")]
    tenant = common_pb2.TenantContext(tenant_id=TENANT, user_id=USER)
    # What the user told us earlier, through the memory-writer: their order number (an L1 entity).
    with mesh.channel("memory-writer") as ch:
        remembered = memory_pb2_grpc.MemoryWriterStub(ch).Write(memory_pb2.WriteMemoryRequest(
            tenant=tenant, layer=common_pb2.MEMORY_LAYER_ENTITY, source=common_pb2.SOURCE_KIND_USER_STATEMENT,
            key="order_id", content="My order number is A12345", confidence=common_pb2.CONFIDENCE_L1_STRONG),
            metadata=metadata, timeout=10)
    deadline = time.monotonic() + 60
    with mesh.channel("retriever") as ch:
        stub = memory_pb2_grpc.RetrieverStub(ch)
        while remembered.memory_id not in {h.memory.memory_id for h in stub.Search(memory_pb2.SearchRequest(
                tenant=tenant, query="order number"), metadata=metadata, timeout=10).hits}:
            assert time.monotonic() < deadline, "the memory never became searchable"
            time.sleep(0.2)

    session_id = f"flow-{uuid.uuid4().hex[:8]}"
    devices = [Device(mesh, session_id, metadata) for _ in range(2)]
    try:
        with mesh.channel("orchestrator") as ch:
            sent = sessions_pb2_grpc.OrchestratorStub(ch).Send(sessions_pb2.SendRequest(
                tenant=tenant, session_id=session_id, device_id="phone", text="Where is my order?",
                expected_version=0), metadata=metadata, timeout=60)
        assert sent.state == "IDLE"
        for device in devices:
            assert device.done.wait(30), "a device did not see the turn end"
    finally:
        for device in devices:
            device.close()

    seen = [[(e.version, e.event_type) for e in d.events] for d in devices]
    assert seen[0] == seen[1] and seen[0][-1][0] == sent.version, seen  # every device, the same session
    events = devices[0].events
    slot = next(e.slot_filled for e in events if e.HasField("slot_filled"))
    assert (slot.name, slot.value, slot.source) == ("order_id", "A12345", f"memory:L1:{remembered.memory_id}")
    assert backend.calls == ["/orders/A12345"]  # called through the gateway, once
    finished = next(e.action_finished for e in events if e.HasField("action_finished"))
    assert finished.outcome == "ok" and json.loads(finished.result_json)["status"] == "shipped"
    reply = [e.message_appended for e in events if e.HasField("message_appended")
             and e.message_appended.role == "assistant"]
    assert [r.text for r in reply] == ["Order A12345 is shipped; expected delivery 2026-03-14."]
    assert set(reply[0].citations) == {finished.action_id, remembered.memory_id}

    # The turn (request and reply) went to the session layer, where compression will find it.
    deadline = time.monotonic() + 60
    with mesh.channel("retriever") as ch:
        stub = memory_pb2_grpc.RetrieverStub(ch)
        while {"role:user", "role:assistant"} - {t for h in stub.Search(memory_pb2.SearchRequest(
                tenant=tenant, query="where is my order A12345", layers=[common_pb2.MEMORY_LAYER_SESSION]),
                metadata=metadata, timeout=10).hits for t in h.memory.tags}:
            assert time.monotonic() < deadline, "the turn never reached memory"
            time.sleep(0.2)

    # The step's result was written to memory under its step id, and the retriever finds it.
    deadline = time.monotonic() + 60
    with mesh.channel("retriever") as ch:
        stub = memory_pb2_grpc.RetrieverStub(ch)
        while not [h for h in stub.Search(memory_pb2.SearchRequest(
                tenant=tenant, query="order A12345 shipped", layers=[common_pb2.MEMORY_LAYER_STEP]),
                metadata=metadata, timeout=10).hits if h.memory.step_id == finished.action_id]:
            assert time.monotonic() < deadline, "the step result never reached memory"
            time.sleep(0.2)


async def test_the_orchestrator_of_the_running_mesh_is_an_a2a_agent(mesh: Mesh) -> None:
    base = f"http://127.0.0.1:{mesh.env['MNEMESH_ORCHESTRATOR_HTTP_PORT']}"
    async with httpx.AsyncClient(timeout=10) as http:
        card = await A2ACardResolver(http, base).get_agent_card()
    assert card.supported_interfaces[0].url == f"{base}/a2a"

    def issue(tenant_id: str, scopes: list[str]) -> str:
        return issue_token(load_settings(jwt_secret=mesh.env["MNEMESH_JWT_SECRET"]), subject="agent:e2e",
                           tenant_id=tenant_id, scopes=scopes)

    answer = await A2AAgents(issue).send(base, TENANT, f"e2e-{uuid.uuid4().hex[:8]}", "hello", {})
    assert answer.reply == "Hello! I can check orders and invoices for you."
    assert answer.metadata["mnemesh.state"] == "IDLE"


async def test_the_orchestrators_gateway_port_finds_a_calls_outcome_by_its_step_id(mesh: Mesh, order_tool: str) -> None:
    """What a timed-out call is verified with before a retry: the gateway's record of the call, by the step id
    the orchestrator gave it (its chain id), read through the orchestrator's own gRPC port."""
    metadata = [("authorization", f"Bearer {mesh.token()}")]
    session_id = f"status-{uuid.uuid4().hex[:8]}"
    async with grpc.aio.insecure_channel(f"127.0.0.1:{mesh.ports['orchestrator']}") as ch:
        stub = sessions_pb2_grpc.OrchestratorStub(ch)
        await stub.Send(sessions_pb2.SendRequest(tenant=common_pb2.TenantContext(tenant_id=TENANT, user_id=USER),
                                                 session_id=session_id, device_id="web",
                                                 text="Where is order B24680?"), metadata=metadata, timeout=60)
        finished = []
        async for event in stub.Subscribe(sessions_pb2.SubscribeRequest(
                tenant=common_pb2.TenantContext(tenant_id=TENANT), session_id=session_id), metadata=metadata,
                timeout=30):
            if event.HasField("action_finished"):
                finished.append(event.action_finished)
            if event.HasField("task_ended"):
                break
    [call] = finished
    settings = load_settings(jwt_secret=mesh.env["MNEMESH_JWT_SECRET"])
    async with grpc.aio.insecure_channel(f"127.0.0.1:{mesh.ports['tool-gateway']}") as ch:
        port = GrpcToolGateway(ch, lambda tenant, scopes: issue_token(settings, subject="orchestrator",
                                                                      tenant_id=tenant, scopes=scopes))
        status = await port.status(TENANT, call.action_id)
        unknown = await port.status(TENANT, str(uuid.uuid4()))
    assert (status.state, status.result) == ("done", json.loads(call.result_json))
    assert unknown.state == "unknown"

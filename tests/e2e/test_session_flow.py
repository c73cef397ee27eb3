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
from pathlib import Path
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import httpx
import pytest
import yaml
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
from services.orchestrator.adapters.rules_file import DEFAULT_RULES

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]  # a loaded boot may take 240 s
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

            def do_POST(self) -> None:  # noqa: N802 - the http.server interface
                calls.append(f"POST {self.path}")
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                order_id = self.path.split("/")[2]
                body = json.dumps({"order_id": order_id, "status": "cancelled"}).encode()
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


def with_agents(folder: Path) -> Callable[[Mesh], None]:
    """The default rules plus two agents to delegate to: the mesh's own orchestrator over A2A, once expected to
    say "shipped" (it does) and once "delivered" (it does not: the compensation runs through the gateway)."""

    def configure(mesh: Mesh) -> None:
        rules = yaml.safe_load(DEFAULT_RULES.read_text(encoding="utf-8"))
        url = f"http://127.0.0.1:{mesh.env['MNEMESH_ORCHESTRATOR_HTTP_PORT']}"
        rules["agents"] = {
            name: {"url": url, "description": f"The {name}.", "text": "{rest}",
                   "expect": {"state": "IDLE", "reply_contains": [fact]},
                   "compensation": {"tool": "orders.cancel", "arguments": {"order_id": order_id}}}
            for name, fact, order_id in (("order_desk", "shipped", "E13579"), ("strict_desk", "delivered", "F24680"))}
        at = next(i for i, r in enumerate(rules["rules"]) if r["name"] == "order_status")
        rules["rules"][at:at] = [{"name": f"ask_{name}", "action": "delegate", "agent": name,
                                  "regex": f"(?i)^ask the {name.replace('_', ' ')}:?"}
                                 for name in ("order_desk", "strict_desk")]
        path = folder / "rules.yaml"
        path.write_text(yaml.safe_dump(rules, allow_unicode=True, sort_keys=False), encoding="utf-8")
        mesh.env["MNEMESH_ORCHESTRATOR_RULES_FILE"] = str(path)
    return configure


@pytest.fixture(scope="module")
def mesh(tmp_path_factory) -> Iterator[Mesh]:
    folder = tmp_path_factory.mktemp("flow")
    with Mesh.running(folder, stop_timeout=15, configure=with_agents(folder)) as mesh:
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
        tools_pb2_grpc.ToolGatewayStub(ch).RegisterTool(tools_pb2.RegisterToolRequest(tool=common_pb2.ToolSpec(
            name="orders.cancel", description="Cancel an order, by its order number (a compensation).",
            input_schema=struct({"type": "object", "properties": {"order_id": {"type": "string"}},
                                 "required": ["order_id"]}),
            version="1.0.0", timeout_seconds=5, backend=f"http:POST {backend.url}/orders/{{order_id}}/cancel")),
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


def send(mesh: Mesh, session_id: str, text: str, user_id: str = USER) -> sessions_pb2.SendResponse:
    with mesh.channel("orchestrator") as ch:
        return sessions_pb2_grpc.OrchestratorStub(ch).Send(sessions_pb2.SendRequest(
            tenant=common_pb2.TenantContext(tenant_id=TENANT, user_id=user_id), session_id=session_id,
            device_id="web", text=text, expected_version=-1), metadata=[("authorization", f"Bearer {mesh.token()}")],
            timeout=60)


def session_events(mesh: Mesh, session_id: str) -> list[sessions_pb2.SessionEvent]:
    """Every event of the session so far (Subscribe from 0 until it has caught up with GetSession's version)."""
    metadata = [("authorization", f"Bearer {mesh.token()}")]
    with mesh.channel("orchestrator") as ch:
        stub = sessions_pb2_grpc.OrchestratorStub(ch)
        version = stub.GetSession(sessions_pb2.GetSessionRequest(
            tenant=common_pb2.TenantContext(tenant_id=TENANT), session_id=session_id), metadata=metadata,
            timeout=10).version
        events = []
        stream = stub.Subscribe(sessions_pb2.SubscribeRequest(tenant=common_pb2.TenantContext(tenant_id=TENANT),
                                                              session_id=session_id, from_version=0),
                                metadata=metadata, timeout=30)
        for event in stream:
            events.append(event)
            if event.version >= version:
                stream.cancel()
                break
    return events


def replies(events: list[sessions_pb2.SessionEvent]) -> list[str]:
    return [e.message_appended.text for e in events
            if e.HasField("message_appended") and e.message_appended.role == "assistant"]


def remember_l2(mesh: Mesh, user_id: str, content: str) -> str:
    """An L2 entity memory ("confirm before use") of the user's order number, through the memory-writer, once
    the retriever finds it."""
    metadata = [("authorization", f"Bearer {mesh.token()}")]
    tenant = common_pb2.TenantContext(tenant_id=TENANT, user_id=user_id)
    with mesh.channel("memory-writer") as ch:
        written = memory_pb2_grpc.MemoryWriterStub(ch).Write(memory_pb2.WriteMemoryRequest(
            tenant=tenant, layer=common_pb2.MEMORY_LAYER_ENTITY, source=common_pb2.SOURCE_KIND_MODEL_INFERENCE,
            key="order_id", content=content, confidence=common_pb2.CONFIDENCE_L2_MEDIUM), metadata=metadata,
            timeout=10)
    deadline = time.monotonic() + 60
    with mesh.channel("retriever") as ch:
        stub = memory_pb2_grpc.RetrieverStub(ch)
        while True:
            hits = {h.memory.memory_id: h for h in stub.Search(memory_pb2.SearchRequest(
                tenant=tenant, query="order number"), metadata=metadata, timeout=10).hits}
            if written.memory_id in hits:
                assert hits[written.memory_id].must_confirm  # the retriever says: confirm before use
                return written.memory_id
            assert time.monotonic() < deadline, "the memory never became searchable"
            time.sleep(0.2)


def test_an_l2_memory_is_offered_for_confirmation_and_the_users_yes_fills_the_slot(
        mesh: Mesh, backend: OrderBackend, order_tool: str) -> None:
    memory_id = remember_l2(mesh, "u-l2-yes", "The order number is probably D24680")
    session_id = f"l2-yes-{uuid.uuid4().hex[:8]}"
    asked = send(mesh, session_id, "Where is my order?", "u-l2-yes")
    assert asked.state == "IDLE" and "/orders/D24680" not in backend.calls  # not used before it is confirmed
    assert replies(session_events(mesh, session_id)) == [
        "I have D24680 on record as your order id. Shall I use it? (yes / no)"]

    done = send(mesh, session_id, "是的", "u-l2-yes")
    events = session_events(mesh, session_id)
    assert done.state == "IDLE"
    [slot] = [e.slot_filled for e in events if e.HasField("slot_filled")]
    assert (slot.value, slot.source) == ("D24680", f"memory:L2-confirmed:{memory_id}")
    assert backend.calls.count("/orders/D24680") == 1
    assert replies(events)[-1] == "Order D24680 is shipped; expected delivery 2026-03-14."
    # Confirmed by the user: the memory-writer made it L1, so it is used without asking from now on.
    with mesh.channel("memory-writer") as ch:
        got = memory_pb2_grpc.MemoryWriterStub(ch).Get(memory_pb2.GetMemoryRequest(
            tenant=common_pb2.TenantContext(tenant_id=TENANT, user_id="u-l2-yes"), memory_id=memory_id),
            metadata=[("authorization", f"Bearer {mesh.token()}")], timeout=10)
    assert got.memory.confidence == common_pb2.CONFIDENCE_L1_STRONG


def test_an_l2_memory_the_user_refuses_is_not_used_and_the_value_is_asked_for(
        mesh: Mesh, backend: OrderBackend, order_tool: str) -> None:
    memory_id = remember_l2(mesh, "u-l2-no", "The order number is probably G11223")
    session_id = f"l2-no-{uuid.uuid4().hex[:8]}"
    send(mesh, session_id, "Where is my order?", "u-l2-no")
    refused = send(mesh, session_id, "No, not that one", "u-l2-no")
    events = session_events(mesh, session_id)
    assert refused.state == "IDLE" and "/orders/G11223" not in backend.calls
    [declined] = [e.slot_declined for e in events if e.HasField("slot_declined")]
    assert declined.memory_id == memory_id
    assert replies(events)[-1] == "Which order do you mean? Please give the order number (e.g. A12345)."
    send(mesh, session_id, "H33445", "u-l2-no")
    assert replies(session_events(mesh, session_id))[-1] == "Order H33445 is shipped; expected delivery 2026-03-14."


def test_a_rule_delegates_to_another_agent_whose_expected_outcome_is_checked(
        mesh: Mesh, backend: OrderBackend, order_tool: str) -> None:
    session_id = f"delegate-{uuid.uuid4().hex[:8]}"
    done = send(mesh, session_id, "Ask the order desk: where is order E13579?")
    events = session_events(mesh, session_id)
    assert done.state == "IDLE"
    [started] = [e.delegation_started for e in events if e.HasField("delegation_started")]
    [answered] = [e.delegation_answered for e in events if e.HasField("delegation_answered")]
    [checked] = [e.delegation_checked for e in events if e.HasField("delegation_checked")]
    assert started.text == "where is order E13579?" and started.expected_memory_id and answered.actual_memory_id
    assert checked.matched and not [e for e in events if e.HasField("compensation_finished")]
    assert replies(events) == ["Order E13579 is shipped; expected delivery 2026-03-14."]  # the callee's answer
    assert backend.calls.count("/orders/E13579") == 1 and "POST /orders/E13579/cancel" not in backend.calls
    [ended] = [e.task_ended for e in events if e.HasField("task_ended")]
    assert ended.outcome == "done"


def test_a_delegation_that_misses_its_expected_outcome_runs_the_declared_compensation(
        mesh: Mesh, backend: OrderBackend, order_tool: str) -> None:
    session_id = f"compensate-{uuid.uuid4().hex[:8]}"
    done = send(mesh, session_id, "ask the strict desk where is order F24680")
    events = session_events(mesh, session_id)
    assert done.state == "IDLE"
    [checked] = [e.delegation_checked for e in events if e.HasField("delegation_checked")]
    [compensated] = [e.compensation_finished for e in events if e.HasField("compensation_finished")]
    assert not checked.matched and "'delivered'" in checked.reason
    assert (compensated.tool, compensated.outcome) == ("orders.cancel", "ok")
    assert json.loads(compensated.result_json) == {"order_id": "F24680", "status": "cancelled"}
    assert backend.calls.count("POST /orders/F24680/cancel") == 1  # through the gateway, to the backend
    assert replies(events)[-1] == ("The strict_desk agent did not do what was expected (the reply does not carry "
                                   "'delivered'), so I undid it with orders.cancel.")
    [ended] = [e.task_ended for e in events if e.HasField("task_ended")]
    assert ended.outcome == "compensated"


def test_the_running_orchestrator_reloads_its_rules_file_and_keeps_its_rules_when_a_bad_one_is_saved(
        mesh: Mesh) -> None:
    """Hot reload in the running service (its watch task), not a reload called by hand."""
    path = Path(mesh.env["MNEMESH_ORCHESTRATOR_RULES_FILE"])
    original = path.read_text(encoding="utf-8")
    rules = yaml.safe_load(original)
    rules["rules"].insert(0, {"name": "ping", "action": "reply", "keywords": ["ping"],
                              "reply": "Pong, from rules saved while the mesh runs."})

    def answer(text: str) -> str:
        return replies(session_events(mesh, session_id))[-1] if send(mesh, session_id, text) else ""

    try:
        session_id = f"reload-{uuid.uuid4().hex[:8]}"
        assert answer("ping") != "Pong, from rules saved while the mesh runs."
        path.write_text(yaml.safe_dump(rules, allow_unicode=True, sort_keys=False), encoding="utf-8")
        deadline = time.monotonic() + 15
        while answer("ping") != "Pong, from rules saved while the mesh runs.":  # checked every second
            assert time.monotonic() < deadline, "the new rules were never used"
            time.sleep(0.5)

        path.write_text(original.replace("action: block", "action: explode", 1), encoding="utf-8")
        log = Path(mesh.env["MNEMESH_DATA_DIR"]) / "logs" / "orchestrator.log"
        deadline = time.monotonic() + 15
        while "action 'explode' must be one of" not in log.read_text(encoding="utf-8"):
            assert time.monotonic() < deadline, "the bad rules file was never refused"
            time.sleep(0.2)
        assert answer("ping") == "Pong, from rules saved while the mesh runs."  # the rules in use stayed
    finally:
        path.write_text(original, encoding="utf-8")

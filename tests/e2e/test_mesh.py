"""`mnemesh run` end to end: embedded infrastructure, five services, a real flow, a clean stop."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import httpx2
import psutil
import pytest
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from libs.auth import issue_token
from libs.config import SERVICES, load_settings
from libs.protogen.mnemesh.v1 import common_pb2, memory_pb2, memory_pb2_grpc, tools_pb2, tools_pb2_grpc
from mnemesh.infra import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]  # a loaded boot may take 240 s
BOOT_TIMEOUT = 240


def serving(address: str) -> bool:
    with grpc.insecure_channel(address) as ch:
        try:
            reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


class Mesh:
    def __init__(self, data_dir: Path) -> None:
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("REDIS_URL", "DATABASE_URL", "QDRANT_URL") and not k.startswith("MNEMESH_")}
        self.env |= {"MNEMESH_DATA_DIR": str(data_dir), "MNEMESH_JWT_SECRET": "e2e-secret-0123456789abcdefghijklmnop",
                     "MNEMESH_EMBEDDED_REDIS_PORT": str(free_port()),
                     "MNEMESH_EMBEDDED_POSTGRES_PORT": str(free_port()),
                     "MNEMESH_MCP_HTTP_PORT": str(free_port()),
                     "MNEMESH_ORCHESTRATOR_HTTP_PORT": str(free_port()),
                     "MNEMESH_MEMORY_WRITER_WORKERS": "2"}
        self.ports = {}
        for name in SERVICES:
            key = name.upper().replace("-", "_")
            self.ports[name] = free_port()
            self.env[f"MNEMESH_{key}_GRPC_PORT"] = str(self.ports[name])
            self.env[f"MNEMESH_{key}_METRICS_PORT"] = str(free_port())
        self.log = data_dir / "run.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "mnemesh", "run"], env=self.env, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def healthy(self, name: str) -> bool:
        return serving(f"127.0.0.1:{self.ports[name]}")

    def wait_serving(self, name: str, timeout: float) -> None:
        """Follow the service's health stream (waiting for it to listen) until it says SERVING."""
        with grpc.insecure_channel(f"127.0.0.1:{self.ports[name]}") as ch:
            try:
                for reply in health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(), timeout=timeout,
                                                                  wait_for_ready=True):
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
            except grpc.RpcError as exc:
                raise AssertionError(f"{name} not serving ({exc.code().name}):\n{self.log.read_text()}") from None

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + BOOT_TIMEOUT
        for name in SERVICES:
            assert self.process.poll() is None, f"mnemesh run exited:\n{self.log.read_text()}"
            self.wait_serving(name, max(1.0, deadline - time.monotonic()))

    def token(self) -> str:
        settings = load_settings(jwt_secret=self.env["MNEMESH_JWT_SECRET"])
        return issue_token(settings, subject="e2e", tenant_id="acme", scopes=["*"])

    def stop(self, timeout: float) -> None:
        """SIGTERM the supervisor; its whole process group is killed if it is not gone within `timeout`."""
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    @classmethod
    @contextmanager
    def running(cls, data_dir: Path, stop_timeout: float = 15,
                configure: Callable[[Mesh], None] | None = None) -> Iterator[Mesh]:
        """A healthy mesh for the body, stopped after it whatever happens; `configure` may change its
        environment (its ports are chosen) before it starts."""
        mesh = cls(data_dir)
        if configure is not None:
            configure(mesh)
        mesh.start()
        try:
            mesh.wait_healthy()
            yield mesh
        finally:
            mesh.stop(stop_timeout)

    def channel(self, name: str) -> grpc.Channel:
        return grpc.intercept_channel(grpc.insecure_channel(f"127.0.0.1:{self.ports[name]}"))


@pytest.fixture(scope="module")
def mesh(tmp_path_factory) -> Iterator[Mesh]:
    with Mesh.running(tmp_path_factory.mktemp("mesh")) as mesh:
        yield mesh


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.NoSuchProcess:
        return []


def descendants_of(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def test_every_service_answers_the_grpc_health_check(mesh: Mesh) -> None:
    assert [n for n in SERVICES if not mesh.healthy(n)] == []


def test_a_memory_written_through_the_mesh_is_found_by_search(mesh: Mesh) -> None:
    metadata = [("authorization", f"Bearer {mesh.token()}")]
    with mesh.channel("memory-writer") as ch:
        written = memory_pb2_grpc.MemoryWriterStub(ch).Write(memory_pb2.WriteMemoryRequest(
            tenant=common_pb2.TenantContext(user_id="u1"), layer=common_pb2.MEMORY_LAYER_LONG_TERM,
            source=common_pb2.SOURCE_KIND_USER_STATEMENT, content="The customer's favourite colour is teal"),
            metadata=metadata, timeout=10)
    deadline = time.monotonic() + 30
    with mesh.channel("retriever") as ch:
        stub = memory_pb2_grpc.RetrieverStub(ch)
        while not (hits := stub.Search(memory_pb2.SearchRequest(query="favourite colour"), metadata=metadata,
                                       timeout=5).hits):
            assert time.monotonic() < deadline, "the written memory never became searchable"
            time.sleep(0.2)
    assert hits[0].memory.memory_id == written.memory_id and not hits[0].must_confirm


def test_the_cli_writes_searches_and_talks_to_a_session(mesh: Mesh) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "mnemesh", *args, "--tenant", "cli-tenant"], env=mesh.env,
                              capture_output=True, text=True, timeout=30)

    written = cli("memory", "write", "我喜欢喝绿茶 and oolong")
    assert written.returncode == 0, written.stderr
    deadline = time.monotonic() + 30
    while (found := cli("memory", "search", "绿茶")).stdout.startswith("no memories"):
        assert time.monotonic() < deadline, "never found"
    assert written.stdout.split()[0] in found.stdout and "绿茶" in found.stdout
    empty = cli("memory", "write", "   ")
    assert empty.returncode == 1 and "error (validation): content: must not be empty" in empty.stderr
    # The greeting rule answers: message, task, PARSING, decision, ROUTING, GENERATING, reply, task ended, IDLE.
    assert cli("session", "send", "cli-session", "hello", "--expected-version", "0").stdout.startswith(
        "version 9, state IDLE")
    stale = cli("session", "send", "cli-session", "again", "--expected-version", "0")
    assert stale.returncode == 1 and "error (conflict)" in stale.stderr and "Subscribe" in stale.stderr


def test_status_lists_every_service_as_serving(mesh: Mesh) -> None:
    result = subprocess.run([sys.executable, "-m", "mnemesh", "status"], env=mesh.env, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    for name in SERVICES:
        assert any(name in line and "SERVING" in line and "NOT" not in line for line in result.stdout.splitlines())
    assert f"MCP for agents (tool-gateway): http://127.0.0.1:{mesh.env['MNEMESH_MCP_HTTP_PORT']}/mcp" in result.stdout


def test_run_starts_a_second_memory_writer_as_a_replica_of_its_own(mesh: Mesh) -> None:
    writers = [p for p in descendants_of(mesh.process.pid) if cmdline(p)[-2:] == ["serve", "memory-writer"]]
    assert len(writers) == 2  # MNEMESH_MEMORY_WRITER_WORKERS
    environments = [p.environ() for p in writers]
    assert len({e.get("MNEMESH_REPLICA", "") for e in environments}) == 2  # two consumers in the group
    assert len({e.get("MNEMESH_MEMORY_WRITER_GRPC_PORT") for e in environments}) == 2
    status = json.loads((Path(mesh.env["MNEMESH_DATA_DIR"]) / "run" / "status.json").read_text())
    worker = status["services"]["memory-writer.2"]
    assert worker["pid"] in {p.pid for p in writers} and serving(worker["grpc"])


def test_each_service_serves_prometheus_metrics_including_rpc_counts(mesh: Mesh) -> None:
    port = mesh.env["MNEMESH_MEMORY_WRITER_METRICS_PORT"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    calls = re.search(r'^rpc_server_calls_total\{[^}]*rpc_method="/mnemesh.v1.MemoryWriter/Write"[^}]*\} (\S+)$',
                      text, re.MULTILINE)
    assert calls and float(calls[1]) >= 1, text[-2000:]
    # The outbox relay publishes from whichever memory-writer process holds the relay's lease.
    worker = json.loads((Path(mesh.env["MNEMESH_DATA_DIR"]) / "run" / "status.json").read_text())["services"][
        "memory-writer.2"]["metrics"]
    with urllib.request.urlopen(worker, timeout=5) as reply:
        text += reply.read().decode()
    assert "stream_events_published_total" in text


def test_the_tool_gateway_refuses_a_tool_whose_example_breaks_its_schema(mesh: Mesh) -> None:
    schema, example = struct_pb2.Struct(), struct_pb2.Struct()
    schema.update({"type": "object", "properties": {"phone": {"type": "string", "pattern": "^[0-9]{11}$"}},
                   "required": ["phone"]})
    example.update({"phone": "12345"})
    tool = common_pb2.ToolSpec(name="crm.lookup", description="Look up a customer by phone number",
                               input_schema=schema, version="1.0.0", examples=[example])
    with mesh.channel("tool-gateway") as ch, pytest.raises(grpc.RpcError) as caught:
        tools_pb2_grpc.ToolGatewayStub(ch).RegisterTool(tools_pb2.RegisterToolRequest(tool=tool), timeout=5,
                                                        metadata=[("authorization", f"Bearer {mesh.token()}")])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "examples[0]" in caught.value.details() and "phone" in caught.value.details()


async def test_an_agent_lists_a_registered_tool_over_mcp_and_a_call_without_backend_says_so(mesh: Mesh) -> None:
    schema = struct_pb2.Struct()
    schema.update({"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]})
    tool = common_pb2.ToolSpec(name="shop.order_status", description="The status of an order, by its id.",
                               input_schema=schema, version="1.0.0")
    with mesh.channel("tool-gateway") as ch:
        tools_pb2_grpc.ToolGatewayStub(ch).RegisterTool(tools_pb2.RegisterToolRequest(tool=tool), timeout=5,
                                                        metadata=[("authorization", f"Bearer {mesh.token()}")])
    url = f"http://127.0.0.1:{mesh.env['MNEMESH_MCP_HTTP_PORT']}/mcp"
    async with (httpx2.AsyncClient(headers={"Authorization": f"Bearer {mesh.token()}"}, timeout=10) as http,
                Client(streamable_http_client(url, http_client=http)) as client):
        listed = {t.name: t for t in (await client.list_tools()).tools}
        result = await client.call_tool("shop.order_status", {"order_id": "o-1"})
    assert listed["shop.order_status"].input_schema["required"] == ["order_id"]
    assert result.is_error and result.structured_content["error_type"] == "validation"
    assert result.structured_content["field"] == "backend"


def test_a_second_run_on_the_same_data_folder_is_refused_with_a_clear_message(mesh: Mesh) -> None:
    result = subprocess.run([sys.executable, "-m", "mnemesh", "run"], env=mesh.env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 1
    assert f"another `mnemesh run` (pid {mesh.process.pid})" in result.stderr and "MNEMESH_DATA_DIR" in result.stderr
    assert all(mesh.healthy(n) for n in SERVICES)  # the first mesh is untouched


def test_a_crashed_service_is_restarted_and_serves_again(mesh: Mesh) -> None:
    victim = next(p for p in descendants_of(mesh.process.pid) if cmdline(p)[-2:] == ["serve", "adapter"])
    victim.kill()
    victim.wait(10)
    mesh.wait_serving("adapter", timeout=60)  # waits for the restarted process to listen
    assert "adapter exited with code -9; restart 1" in mesh.log.read_text()


def test_sigterm_stops_everything_within_ten_seconds_and_leaves_no_process(mesh: Mesh) -> None:
    tree = [mesh.process.pid, *(p.pid for p in descendants_of(mesh.process.pid))]
    assert len(tree) >= 1 + len(SERVICES) + 2  # supervisor, services, Redis, PostgreSQL
    started = time.monotonic()
    mesh.process.send_signal(signal.SIGTERM)
    mesh.process.wait(timeout=15)
    elapsed = time.monotonic() - started
    survivors = [pid for pid in tree if alive(pid)]
    assert survivors == [], f"left behind: {survivors}"
    assert elapsed < 10, f"stopping took {elapsed:.1f} s"
    assert mesh.process.returncode == 0


def test_a_second_run_reuses_the_data_folder(mesh: Mesh) -> None:
    assert mesh.process.poll() is not None, "runs after the SIGTERM test"
    mesh.start()
    try:
        mesh.wait_healthy()
        metadata = [("authorization", f"Bearer {mesh.token()}")]
        with mesh.channel("retriever") as ch:
            hits = memory_pb2_grpc.RetrieverStub(ch).Search(memory_pb2.SearchRequest(query="favourite colour"),
                                                            metadata=metadata, timeout=5).hits
        assert [h.memory.content for h in hits] == ["The customer's favourite colour is teal"]
        assert "initialising the embedded PostgreSQL" not in mesh.log.read_text()
    finally:
        mesh.stop(15)


def test_a_killed_supervisor_takes_every_child_with_it(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path)
    mesh.start()
    try:
        mesh.wait_healthy()
        tree = descendants_of(mesh.process.pid)
        mesh.process.kill()  # no chance to clean up: the children must go by themselves
        mesh.process.wait(10)
        _, survivors = psutil.wait_procs(tree, timeout=15)
        assert [p.pid for p in survivors] == [], "orphans left behind"
    finally:
        if mesh.process.poll() is None:
            mesh.process.kill()

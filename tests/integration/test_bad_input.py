"""Hostile input on every RPC of every service, against the five real services (`mnemesh serve`).

Each bad request must get its precise status and an ErrorDetail naming the field, quote no
more than a short prefix of what was sent, and leave the service serving. No input, however
malformed, may yield INTERNAL or UNKNOWN.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import grpc
import pytest
import redis
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libs.auth import issue_token
from libs.config import SERVICES, Settings, load_settings
from libs.protogen.mnemesh.v1 import common_pb2, memory_pb2, sessions_pb2, tools_pb2
from libs.rpc import error_detail
from mnemesh.infra import free_port

pytestmark = pytest.mark.integration
SECRET = "bad-input-test-secret-0123456789abcdef"
NEVER = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.RESOURCE_EXHAUSTED}
INVALID = grpc.StatusCode.INVALID_ARGUMENT
# Every RPC: (service, full method, request type, streaming response).
RPCS = [
    ("memory-writer", "/mnemesh.v1.MemoryWriter/Write", memory_pb2.WriteMemoryRequest, False),
    ("memory-writer", "/mnemesh.v1.MemoryWriter/Get", memory_pb2.GetMemoryRequest, False),
    ("memory-writer", "/mnemesh.v1.MemoryWriter/Forget", memory_pb2.ForgetRequest, False),
    ("retriever", "/mnemesh.v1.Retriever/Search", memory_pb2.SearchRequest, False),
    ("orchestrator", "/mnemesh.v1.Orchestrator/Send", sessions_pb2.SendRequest, False),
    ("orchestrator", "/mnemesh.v1.Orchestrator/Subscribe", sessions_pb2.SubscribeRequest, True),
    ("orchestrator", "/mnemesh.v1.Orchestrator/GetSession", sessions_pb2.GetSessionRequest, False),
    ("tool-gateway", "/mnemesh.v1.ToolGateway/RegisterTool", tools_pb2.RegisterToolRequest, False),
    ("tool-gateway", "/mnemesh.v1.ToolGateway/ListTools", tools_pb2.ListToolsRequest, False),
    ("tool-gateway", "/mnemesh.v1.ToolGateway/CallTool", tools_pb2.CallToolRequest, False),
    ("adapter", "/mnemesh.v1.Adapter/ListBackends", tools_pb2.ListBackendsRequest, False),
    ("adapter", "/mnemesh.v1.Adapter/Invoke", tools_pb2.InvokeRequest, False),
    ("retriever", "/mnemesh.v1.Retriever/Query", memory_pb2.QueryRequest, False),
]


@dataclass
class Mesh:
    settings: Settings
    processes: dict[str, subprocess.Popen]

    def address(self, service: str) -> str:
        return f"127.0.0.1:{self.settings.grpc_port(service)}"

    def token(self, *scopes: str) -> str:
        return issue_token(self.settings, subject="u1", tenant_id="acme", scopes=list(scopes or ["*"]))

    def call(self, service: str, method: str, payload: bytes, *, streaming: bool = False,
             token: str | None = "default") -> grpc.RpcError | bytes:
        """The raw reply bytes of `method`, or its error."""
        token = self.token() if token == "default" else token
        metadata = [("authorization", f"Bearer {token}")] if token else []
        with grpc.insecure_channel(self.address(service)) as ch:
            kind = ch.unary_stream if streaming else ch.unary_unary
            rpc = kind(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
            try:
                reply = rpc(payload, metadata=metadata, timeout=10)
                return b"".join(list(reply)[:1]) if streaming else reply
            except grpc.RpcError as exc:
                return exc

    def serving(self, service: str) -> bool:
        if self.processes[service].poll() is not None:
            return False
        with grpc.insecure_channel(self.address(service)) as ch:
            reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        return reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.fixture(scope="module")
def mesh(tmp_path_factory) -> Iterator[Mesh]:
    redis_url, database_url = os.environ.get("REDIS_URL"), os.environ.get("DATABASE_URL")
    if not redis_url or not database_url:
        pytest.fail("REDIS_URL and DATABASE_URL are not set: run with `make test`", pytrace=False)
    namespace = f"t{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MNEMESH_", "OTEL_"))}
    env |= {"REDIS_URL": redis_url, "DATABASE_URL": database_url, "MNEMESH_NAMESPACE": namespace,
            "MNEMESH_DATA_DIR": str(tmp_path_factory.mktemp("bad-input")), "MNEMESH_JWT_SECRET": SECRET,
            "MNEMESH_METRICS_ENABLED": "false", "MNEMESH_MCP_HTTP_PORT": str(free_port())}
    for name in SERVICES:
        env[f"MNEMESH_{name.upper().replace('-', '_')}_GRPC_PORT"] = str(free_port())
    settings_ = load_settings(**{k.removeprefix("MNEMESH_").lower(): v for k, v in env.items()
                                 if k.startswith("MNEMESH_") and k.endswith("_GRPC_PORT")}, jwt_secret=SECRET)
    logs = Path(env["MNEMESH_DATA_DIR"])
    outputs = {name: (logs / f"{name}.log").open("wb") for name in SERVICES}
    processes = {name: subprocess.Popen([sys.executable, "-m", "mnemesh", "serve", name], env=env,
                                        stdout=subprocess.DEVNULL, stderr=outputs[name])
                 for name in SERVICES}
    mesh_ = Mesh(settings_, processes)
    try:
        for name in SERVICES:
            with grpc.insecure_channel(mesh_.address(name)) as ch:
                try:
                    for reply in health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(), timeout=90,
                                                                      wait_for_ready=True):
                        if reply.status == health_pb2.HealthCheckResponse.SERVING:
                            break
                except grpc.RpcError as exc:  # say which service did not come up, and what it logged
                    tail = (logs / f"{name}.log").read_text(errors="replace")[-3000:]
                    pytest.fail(f"{name} is not serving ({exc.code()}; exit code {processes[name].poll()});"
                                f" its log ends with:\n{tail}", pytrace=False)
        yield mesh_
    finally:
        for process in processes.values():
            process.terminate()
        for process in processes.values():
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for output in outputs.values():
            output.close()
        client = redis.from_url(redis_url)
        keys = list(client.scan_iter(match=f"{namespace}.*"))
        if keys:
            client.delete(*keys)
        client.close()
        asyncio.run(_drop_schemas(database_url, namespace))


async def _drop_schemas(database_url: str, namespace: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        for name in SERVICES:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{namespace}_{name}" CASCADE'.replace("-", "_"))
    finally:
        await conn.close()


# --- bad values, one row each: (name, service, method, request, code, field) ------------------------------

def _tenant(**fields) -> common_pb2.TenantContext:
    return common_pb2.TenantContext(**{"user_id": "u1", **fields})


def _write(**fields) -> memory_pb2.WriteMemoryRequest:
    base = {"tenant": _tenant(session_id="s1"), "layer": common_pb2.MEMORY_LAYER_LONG_TERM,
            "source": common_pb2.SOURCE_KIND_USER_STATEMENT, "content": "prefers tea"}
    return memory_pb2.WriteMemoryRequest(**{**base, **fields})


def _struct(value: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(value)
    return s


def _with(message, setter: Callable):
    setter(message)
    return message


def _tool(**fields) -> tools_pb2.RegisterToolRequest:
    base = {"name": "crm.lookup", "description": "Looks a customer up by id.", "version": "1.0.0",
            "input_schema": _struct({"type": "object"})}
    return tools_pb2.RegisterToolRequest(tool=common_pb2.ToolSpec(**{**base, **fields}))


MW, R, ORC, TG, AD = "memory-writer", "retriever", "orchestrator", "tool-gateway", "adapter"
NUL = "a\x00b"
HUGE_ID = "9" * 9_000
CASES = [
    ("write NUL content", MW, "Write", _write(content=NUL), INVALID, "content"),
    ("write NUL key", MW, "Write", _write(key=NUL), INVALID, "key"),
    ("write NUL tag", MW, "Write", _write(tags=["ok", NUL]), INVALID, "tags[1]"),
    ("write NUL user id", MW, "Write", _write(tenant=_tenant(user_id=NUL)), INVALID, "tenant.user_id"),
    ("write NUL session id", MW, "Write", _write(tenant=_tenant(session_id=NUL)), INVALID, "tenant.session_id"),
    ("write NUL idempotency key", MW, "Write", _write(idempotency_key=NUL), INVALID, "idempotency_key"),
    ("write NUL step id", MW, "Write", _write(step_id=NUL), INVALID, "step_id"),
    ("write NUL derived from", MW, "Write", _write(derived_from=[NUL]), INVALID, "derived_from[0]"),
    ("write NUL attribute value", MW, "Write", _write(attributes=_struct({"k": NUL})), INVALID, "attributes['k']"),
    ("write NUL attribute key", MW, "Write", _write(attributes=_struct({NUL: 1})), INVALID, "attributes key 'a\\x00b'"),
    ("write expires_at 2^62", MW, "Write", _with(_write(), lambda m: setattr(m.expires_at, "seconds", 2**62)),
     INVALID, "expires_at"),
    ("write expires_at negative nanos", MW, "Write",
     _with(_write(), lambda m: (setattr(m.expires_at, "seconds", 4_000_000_000), setattr(m.expires_at, "nanos", -1))),
     INVALID, "expires_at"),
    ("write 1 MB key", MW, "Write", _write(key="k" * 1_000_000), INVALID, "key"),
    ("write 10 KB idempotency key", MW, "Write", _write(idempotency_key="k" * 10_000), INVALID, "idempotency_key"),
    ("write 10 KB user id", MW, "Write", _write(tenant=_tenant(user_id="u" * 10_000)), INVALID, "tenant.user_id"),
    ("write invisible content", MW, "Write", _write(content="\u200b\ufeff\u200b"), INVALID, "content"),
    ("write a 15,000-character word", MW, "Write", _write(content="w" * 15_000), INVALID, "content"),
    ("write unknown layer", MW, "Write", _write(layer=99), INVALID, "layer"),
    ("write 100 tags", MW, "Write", _write(tags=[f"t{i}" for i in range(100)]), INVALID, "tags"),
    ("write a tenant no token can hold", MW, "Write", _write(tenant=_tenant(tenant_id="evil tenant/..")),
     grpc.StatusCode.PERMISSION_DENIED, "tenant.tenant_id"),
    ("get 9,000-character id", MW, "Get", memory_pb2.GetMemoryRequest(memory_id=HUGE_ID), INVALID, "memory_id"),
    ("get NUL id", MW, "Get", memory_pb2.GetMemoryRequest(memory_id=NUL), INVALID, "memory_id"),
    ("forget non-UUID id", MW, "Forget", memory_pb2.ForgetRequest(memory_id="m-1"), INVALID, "memory_id"),
    ("forget NUL user", MW, "Forget", memory_pb2.ForgetRequest(tenant=_tenant(user_id=NUL)), INVALID,
     "tenant.user_id"),
    ("search unknown layer", R, "Search", memory_pb2.SearchRequest(query="tea", layers=[99]), INVALID, "layers[0]"),
    ("search unknown confidence", R, "Search", memory_pb2.SearchRequest(query="tea", min_confidence=99), INVALID,
     "min_confidence"),
    ("search since 2^62", R, "Search",
     _with(memory_pb2.SearchRequest(query="tea"), lambda m: setattr(m.since, "seconds", 2**62)), INVALID, "since"),
    ("search until negative nanos", R, "Search",
     _with(memory_pb2.SearchRequest(query="tea"), lambda m: setattr(m.until, "nanos", -1)), INVALID, "until"),
    ("search NUL query", R, "Search", memory_pb2.SearchRequest(query=NUL), INVALID, "query"),
    ("search NUL tag", R, "Search", memory_pb2.SearchRequest(query="tea", tags=[NUL]), INVALID, "tags[0]"),
    ("search long query", R, "Search", memory_pb2.SearchRequest(query="tea " * 2_000), INVALID, "query"),
    ("search invisible query", R, "Search", memory_pb2.SearchRequest(query="\u200b"), INVALID, "query"),
    ("search unknown route", R, "Search", memory_pb2.SearchRequest(query="tea", route="sideways"), INVALID, "route"),
    ("query no condition", R, "Query", memory_pb2.QueryRequest(), INVALID, "where"),
    ("query unknown operator", R, "Query",
     memory_pb2.QueryRequest(where=[memory_pb2.QueryCondition(field="layer", op="between")]), INVALID, "where[0].op"),
    ("query text for a layer", R, "Query", memory_pb2.QueryRequest(where=[memory_pb2.QueryCondition(
        field="layer", op="eq", value=struct_pb2.Value(string_value="five"))]), INVALID, "where[0].value"),
    ("query NUL attribute path", R, "Query", memory_pb2.QueryRequest(where=[memory_pb2.QueryCondition(
        field="attributes.\x00", op="exists")]), INVALID, "where[0].field"),
    ("send NUL text", ORC, "Send", sessions_pb2.SendRequest(session_id="s1", device_id="web", text=NUL), INVALID,
     "text"),
    ("send invisible text", ORC, "Send", sessions_pb2.SendRequest(session_id="s1", device_id="web", text="\ufeff"),
     INVALID, "text"),
    ("send NUL device", ORC, "Send", sessions_pb2.SendRequest(session_id="s1", device_id=NUL, text="hi"), INVALID,
     "device_id"),
    ("send NUL session", ORC, "Send", sessions_pb2.SendRequest(session_id=NUL, device_id="web", text="hi"), INVALID,
     "session_id"),
    ("send 10 KB idempotency key", ORC, "Send", sessions_pb2.SendRequest(session_id="s1", device_id="web", text="hi",
                                                                       idempotency_key="k" * 10_000), INVALID,
     "idempotency_key"),
    ("subscribe huge session", ORC, "Subscribe", sessions_pb2.SubscribeRequest(session_id=HUGE_ID), INVALID,
     "session_id"),
    ("get session NUL", ORC, "GetSession", sessions_pb2.GetSessionRequest(session_id=NUL), INVALID, "session_id"),
    ("register NUL description", TG, "RegisterTool", _tool(description="Looks up " + NUL), INVALID,
     "tool.description"),
    ("register NUL name", TG, "RegisterTool", _tool(name=NUL), INVALID, "tool.name"),
    ("register NUL scope", TG, "RegisterTool", _tool(scopes=[NUL]), INVALID, "tool.scopes[0]"),
    ("register NUL in schema", TG, "RegisterTool", _tool(input_schema=_struct({"type": "object", "title": NUL})),
     INVALID, "tool.input_schema['title']"),
    ("list tools NUL user", TG, "ListTools", tools_pb2.ListToolsRequest(tenant=_tenant(user_id=NUL)), INVALID,
     "tenant.user_id"),
    ("call NUL name", TG, "CallTool", tools_pb2.CallToolRequest(name=NUL), INVALID, "name"),
    ("call NUL argument", TG, "CallTool", tools_pb2.CallToolRequest(name="x", arguments=_struct({"a": NUL})),
     INVALID, "arguments['a']"),
    ("call NaN deadline", TG, "CallTool", tools_pb2.CallToolRequest(name="x", deadline_seconds=float("nan")),
     INVALID, "deadline_seconds"),
    ("invoke NUL backend", AD, "Invoke", tools_pb2.InvokeRequest(backend_id=NUL, operation="op"), INVALID,
     "backend_id"),
    ("invoke NUL operation", AD, "Invoke", tools_pb2.InvokeRequest(backend_id="b", operation=NUL), INVALID,
     "operation"),
]
_SERVICE_NAMES = {MW: "MemoryWriter", R: "Retriever", ORC: "Orchestrator", TG: "ToolGateway", AD: "Adapter"}


def _method(service: str, rpc: str) -> str:
    return f"/mnemesh.v1.{_SERVICE_NAMES[service]}/{rpc}"


@pytest.mark.parametrize(("name", "service", "rpc", "request_", "code", "field"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_its_status_and_the_field_and_the_service_still_serves(
    mesh: Mesh, name: str, service: str, rpc: str, request_, code: grpc.StatusCode, field: str
) -> None:
    err = mesh.call(service, _method(service, rpc), request_.SerializeToString(), streaming=rpc == "Subscribe")
    assert isinstance(err, grpc.RpcError), f"{name} was accepted"
    assert err.code() == code, err.details()
    detail = error_detail(err)
    assert detail is not None and detail.field == field, detail
    assert len(err.details()) < 600 and "9" * 100 not in err.details()  # a short prefix at most
    assert mesh.serving(service)


# --- undecodable bytes on every RPC ------------------------------------------------------------------------

def _ld(field: int, payload: bytes) -> bytes:
    """A length-delimited field: tag, varint length, payload."""
    length, varint = len(payload), b""
    while True:
        byte, length = length & 0x7F, length >> 7
        varint += bytes([byte | (0x80 if length else 0)])
        if not length:
            return bytes([field << 3 | 2]) + varint + payload


def _nested_struct(depth: int) -> bytes:
    """A Struct nested `depth` levels (fields entry -> Value.struct_value -> Struct), past the parser's 100."""
    struct = b""
    for _ in range(depth):
        struct = _ld(1, _ld(1, b"k") + _ld(2, _ld(5, struct)))
    return struct


def _invalid_utf8(request_type) -> bytes:
    """The first string field carrying bytes that are not UTF-8 (\\xed\\xa0\\x80 encodes a lone surrogate)."""
    for fd in request_type.DESCRIPTOR.fields:
        if fd.type == fd.TYPE_STRING:
            return _ld(fd.number, b"\xff\xfe\xed\xa0\x80")
    return _ld(1, _ld(1, b"\xed\xa0\x80"))  # RegisterToolRequest: tool.name


UNDECODABLE = [(f"{rpc[1].rsplit('/', 1)[1]} {kind}", *rpc, payload)
               for rpc in RPCS
               for kind, payload in (("truncated", b"\x0a\xff"), ("not utf-8", _invalid_utf8(rpc[2])))
               if rpc[2].DESCRIPTOR.fields or kind == "truncated"]  # an empty message has no string to spoil
UNDECODABLE += [("Write nested 150 deep", *RPCS[0], _ld(12, _nested_struct(150))),
                ("CallTool nested 150 deep", *RPCS[9], _ld(3, _nested_struct(150)))]


@pytest.mark.parametrize(("name", "service", "method", "request_type", "streaming", "payload"), UNDECODABLE,
                         ids=[u[0] for u in UNDECODABLE])
def test_an_undecodable_request_is_invalid_argument_naming_the_message_and_nothing_more(
    mesh: Mesh, name: str, service: str, method: str, request_type, streaming: bool, payload: bytes
) -> None:
    err = mesh.call(service, method, payload, streaming=streaming)
    assert isinstance(err, grpc.RpcError) and err.code() == INVALID, err
    expected = f"the request is not a valid {request_type.DESCRIPTOR.full_name} message"
    assert error_detail(err).reason == expected and err.details().startswith(expected)
    anonymous = mesh.call(service, method, payload, streaming=streaming, token=None)
    assert anonymous.code() == grpc.StatusCode.UNAUTHENTICATED and "valid" not in anonymous.details()
    assert mesh.serving(service)


# --- safer defaults ------------------------------------------------------------------------------------------

def test_forgetting_another_users_memories_needs_the_admin_scope(mesh: Mesh) -> None:
    forget = memory_pb2.ForgetRequest(tenant=_tenant(user_id="someone-else"))
    err = mesh.call(MW, _method(MW, "Forget"), forget.SerializeToString(), token=mesh.token("memory:forget"))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "memory:admin" in err.details()
    reply = mesh.call(MW, _method(MW, "Forget"), forget.SerializeToString(), token=mesh.token("memory:admin",
                                                                                             "memory:forget"))
    assert memory_pb2.ForgetResponse.FromString(reply).forgotten == 0


# --- anything at all ------------------------------------------------------------------------------------------

@given(index=st.integers(0, len(RPCS) - 1), payload=st.binary(max_size=200))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_no_bytes_at_all_yield_internal_or_unknown(mesh: Mesh, index: int, payload: bytes) -> None:
    service, method, _, streaming = RPCS[index]
    reply = mesh.call(service, method, payload, streaming=streaming)
    if isinstance(reply, grpc.RpcError):
        assert reply.code() not in NEVER, (method, payload, reply.details())


@given(content=st.text(max_size=300), key=st.text(max_size=40), tag=st.text(max_size=20),
       user=st.text(max_size=20))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_no_text_in_a_write_yields_internal_or_unknown(mesh: Mesh, content: str, key: str, tag: str,
                                                        user: str) -> None:
    request = _write(content=content, key=key, tags=[tag], tenant=_tenant(user_id=user))
    reply = mesh.call(MW, _method(MW, "Write"), request.SerializeToString())
    if isinstance(reply, grpc.RpcError):
        assert reply.code() not in NEVER, (request, reply.details())

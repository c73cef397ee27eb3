"""The gRPC call pipeline on a real server: authentication, scopes, tenant isolation, rich errors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import anyio
import asyncpg
import grpc
import jwt
import pytest

from libs.auth import TokenVerifier, issue_token
from libs.config import Settings, load_settings
from libs.protogen.mnemesh.v1 import common_pb2, sessions_pb2, sessions_pb2_grpc
from libs.rpc import GrpcServer, channel, error_detail
from mnemesh.infra import free_port
from services.orchestrator.domain import Session, Versioned
from services.orchestrator.entrypoints import grpc_api

pytestmark = pytest.mark.integration


class MemorySessions:
    """An in-memory session repository: this test is about the pipeline, not storage."""

    def __init__(self) -> None:
        self.events: dict[tuple[str, str], list[Versioned]] = {}

    async def history(self, tenant_id, session_id):
        return list(self.events.get((tenant_id, session_id), []))

    async def load(self, tenant_id, session_id):
        return Session.replay(tenant_id, session_id, await self.history(tenant_id, session_id))

    async def update(self, tenant_id, session_id, decide):
        session = await self.load(tenant_id, session_id)
        items = self.events.setdefault((tenant_id, session_id), [])
        items += [Versioned(session.version + i + 1, e) for i, e in enumerate(decide(session))]
        return await self.load(tenant_id, session_id)

    async def follow(self, tenant_id, session_id, after_version):
        for item in self.events.get((tenant_id, session_id), []):
            if item.version > after_version:
                yield item


@pytest.fixture
def settings() -> Settings:
    return load_settings(jwt_secret="pipeline-test-secret-0123456789abcdef")


@pytest.fixture
def sessions() -> MemorySessions:
    return MemorySessions()


@pytest.fixture
async def address(settings: Settings, sessions: MemorySessions) -> AsyncIterator[str]:
    port = free_port()
    server = GrpcServer("127.0.0.1", port, [grpc_api.registration(sessions)], TokenVerifier(settings))
    await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop(0)


def send(tenant: str = "") -> sessions_pb2.SendRequest:
    return sessions_pb2.SendRequest(tenant=common_pb2.TenantContext(tenant_id=tenant, user_id="u1"),
                                    session_id="s1", device_id="web", text="hello", expected_version=-1)


async def call(address: str, token: str | None, request=None) -> sessions_pb2.SendResponse:
    async with channel(address, token) as ch:
        return await sessions_pb2_grpc.OrchestratorStub(ch).Send(request or send(), timeout=5)


async def rejected(address: str, token: str | None, request=None) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call(address, token, request)
    return caught.value


async def test_a_call_without_a_token_is_unauthenticated_with_a_hint(address: str) -> None:
    err = await rejected(address, None)
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "no bearer token" in err.details() and "authorization: Bearer" in err.details()
    detail = error_detail(err)
    assert detail.error_type == "unauthenticated" and detail.field == "authorization"


async def test_an_expired_token_is_unauthenticated(address: str, settings: Settings) -> None:
    token = issue_token(settings, subject="u1", tenant_id="t1", scopes=["*"], ttl_seconds=-60)  # beyond the 30 s leeway
    err = await rejected(address, token)
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED and "expired" in err.details()


async def test_a_forged_token_is_unauthenticated(address: str) -> None:
    forged = jwt.encode({"sub": "u1", "tenant": "t1", "scope": "*", "exp": int(time.time()) + 60,
                         "iss": "mnemesh", "aud": "mnemesh"}, "someone-elses-secret-0123456789abcdef",
                        algorithm="HS256")
    err = await rejected(address, forged)
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED and "signature" in err.details()


async def test_a_token_without_the_scope_is_permission_denied(address: str, settings: Settings) -> None:
    token = issue_token(settings, subject="u1", tenant_id="t1", scopes=["sessions:read"])
    err = await rejected(address, token)
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "sessions:write" in err.details()


async def test_a_request_naming_another_tenant_is_permission_denied(address: str, settings: Settings) -> None:
    token = issue_token(settings, subject="u1", tenant_id="t1", scopes=["sessions:*"])
    err = await rejected(address, token, send(tenant="t2"))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert error_detail(err).field == "tenant.tenant_id"


async def test_a_valid_token_with_the_scope_is_served_under_its_tenant(
    address: str, settings: Settings, sessions: MemorySessions
) -> None:
    token = issue_token(settings, subject="u1", tenant_id="t1", scopes=["sessions:write"])
    reply = await call(address, token)  # the request names no tenant: the token's is stamped on it
    # No agent is wired here (the test is about the pipeline): the message starts a task and waits in PARSING.
    assert reply.version == 3 and reply.state == "PARSING"
    assert list(sessions.events) == [("t1", "s1")]  # what the handler received, not just what it answered
    other = issue_token(settings, subject="u9", tenant_id="t2", scopes=["sessions:write"])
    await call(address, other)
    assert sorted(sessions.events) == [("t1", "s1"), ("t2", "s1")]


async def test_invalid_input_gets_invalid_argument_with_the_field_and_a_hint(address: str, settings: Settings) -> None:
    token = issue_token(settings, subject="u1", tenant_id="t1", scopes=["*"])
    request = send()
    request.text = "   "
    err = await rejected(address, token, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    detail = error_detail(err)
    assert (detail.error_type, detail.field) == ("validation", "text") and detail.hint


async def test_health_and_reflection_need_no_token(address: str) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    async with grpc.aio.insecure_channel(address) as ch:
        reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        listing = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
        services = [s.name async for r in listing for s in r.list_services_response.service]
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    assert "mnemesh.v1.Orchestrator" in services and "grpc.health.v1.Health" in services


async def test_a_stopping_server_reports_not_serving_before_it_stops_serving_calls(settings: Settings) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    port = free_port()
    server = GrpcServer("127.0.0.1", port, [grpc_api.registration(MemorySessions())], TokenVerifier(settings))
    await server.start()
    token = issue_token(settings, subject="u1", tenant_id="t1", scopes=["*"])
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        health = health_pb2_grpc.HealthStub(ch)
        stopping = asyncio.create_task(server.stop(2.0))
        with anyio.fail_after(5):
            while (await health.Check(health_pb2.HealthCheckRequest(), timeout=2)).status == \
                    health_pb2.HealthCheckResponse.SERVING:
                await anyio.sleep(0.01)
        # Draining: load balancers see NOT_SERVING, and calls in the window are still answered.
        reply = await call(f"127.0.0.1:{port}", token)
        assert reply.version == 3
        await stopping


class DatabaseDown(MemorySessions):
    async def history(self, tenant_id, session_id):
        raise asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation")


async def test_an_unreachable_database_is_unavailable_and_retryable_not_internal(settings: Settings) -> None:
    port = free_port()
    server = GrpcServer("127.0.0.1", port, [grpc_api.registration(DatabaseDown())], TokenVerifier(settings))
    await server.start()
    try:
        err = await rejected(f"127.0.0.1:{port}", issue_token(settings, subject="u", tenant_id="t1", scopes=["*"]))
    finally:
        await server.stop(0)
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    detail = error_detail(err)
    assert detail.error_type == "unavailable" and detail.retryable and "PostgreSQL" in detail.hint


async def test_a_declared_but_unbuilt_method_is_unimplemented_with_a_structured_error(settings: Settings) -> None:
    from libs.protogen.mnemesh.v1 import tools_pb2, tools_pb2_grpc
    from libs.rpc import Registration
    from services.tool_gateway.entrypoints import grpc_api as tools_api

    port = free_port()
    unbuilt = Registration(tools_pb2_grpc.add_ToolGatewayServicer_to_server, tools_pb2_grpc.ToolGatewayServicer(),
                           "mnemesh.v1.ToolGateway", tools_api.SCOPES)  # the generated base: nothing built
    server = GrpcServer("127.0.0.1", port, [unbuilt], TokenVerifier(settings))
    await server.start()
    try:
        async with channel(f"127.0.0.1:{port}", issue_token(settings, subject="u", tenant_id="t1",
                                                             scopes=["*"])) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await tools_pb2_grpc.ToolGatewayStub(ch).CallTool(tools_pb2.CallToolRequest(name="x"), timeout=5)
    finally:
        await server.stop(0)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert error_detail(caught.value).error_type == "unimplemented"


class Slow(MemorySessions):
    async def history(self, tenant_id, session_id):
        await asyncio.Event().wait()  # never answers


async def test_a_call_without_a_deadline_is_cut_at_the_servers_limit(settings: Settings) -> None:
    port = free_port()
    server = GrpcServer("127.0.0.1", port, [grpc_api.registration(Slow())], TokenVerifier(settings),
                        default_deadline_seconds=0.3)
    await server.start()
    token = issue_token(settings, subject="u", tenant_id="t1", scopes=["*"])
    try:
        async with channel(f"127.0.0.1:{port}", token) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await sessions_pb2_grpc.OrchestratorStub(ch).Send(send())  # no client deadline
    finally:
        await server.stop(0)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert error_detail(caught.value).error_type == "deadline_exceeded"

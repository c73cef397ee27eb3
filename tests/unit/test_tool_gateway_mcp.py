"""The tool-gateway's MCP entry point and its HTTP authentication, through a fake registry."""

from __future__ import annotations

import json
from dataclasses import replace

import httpx2
import pytest
from gateway_fakes import fake_ports
from mcp import Client
from mcp.shared.exceptions import MCPError
from starlette.types import Receive, Scope, Send

from libs.auth import Principal, TokenVerifier, issue_token
from libs.config import Settings
from libs.errors import NotFound
from services.tool_gateway.domain import ToolSpec
from services.tool_gateway.entrypoints.mcp_auth import BearerAuth, Caller
from services.tool_gateway.entrypoints.mcp_server import build_server, error_result, tool_to_mcp

SETTINGS = Settings(jwt_secret="unit-test-secret-0123456789abcdef0123")
SPEC = ToolSpec(name="crm.get_customer", description="Look up a customer record by its id.",
                input_schema={"type": "object", "properties": {"id": {"type": "string"}}},
                output_schema={"type": "object"}, version="1.0.0")


def test_a_spec_becomes_an_mcp_tool_without_an_empty_output_schema() -> None:
    tool = tool_to_mcp(SPEC)
    assert (tool.name, tool.description, tool.input_schema, tool.output_schema) == \
        (SPEC.name, SPEC.description, SPEC.input_schema, {"type": "object"})
    assert tool_to_mcp(replace(SPEC, output_schema={})).output_schema is None


def test_a_domain_error_becomes_a_tool_result_with_is_error_and_the_same_words_as_text() -> None:
    result = error_result(NotFound("no tool named 'x' is registered", field="name", hint="list the tools"))
    assert result.is_error
    assert result.structured_content == {"error_type": "not_found", "field": "name",
                                         "reason": "no tool named 'x' is registered", "retryable": False,
                                         "hint": "list the tools"}
    assert json.loads(result.content[0].text) == result.structured_content


async def test_the_server_lists_the_registry_and_refuses_a_call_without_an_authenticated_caller() -> None:
    ports = fake_ports()
    await ports.registry.register(SPEC)
    async with Client(build_server(ports)) as client:
        listed = await client.list_tools()
        result = await client.call_tool(SPEC.name, {"id": "7"})
    assert [t.name for t in listed.tools] == [SPEC.name]
    assert result.is_error and result.structured_content["error_type"] == "permission_denied"


async def test_a_call_returns_structured_content_and_the_same_compact_json_as_text() -> None:
    ports = fake_ports()
    await ports.registry.register(SPEC)

    async def answer(arguments: dict) -> dict:
        return {"name": "Li", "id": arguments["id"], "noise": None}
    ports.backends.behaviours[SPEC.name] = answer
    local = Principal(subject="cli", tenant_id="acme", scopes=frozenset({"tools:*"}))
    async with Client(build_server(ports, local)) as client:
        result = await client.call_tool(SPEC.name, {"id": "7"})
    assert not result.is_error
    assert result.structured_content == {"name": "Li", "id": "7"}
    assert result.content[0].text == '{"name":"Li","id":"7"}'


async def test_a_truncated_result_links_to_the_whole_result_as_a_step_resource() -> None:
    ports = fake_ports(result_max_bytes=256)
    await ports.registry.register(replace(SPEC, output_schema={}))

    async def answer(arguments: dict) -> dict:
        return {"rows": ["x" * 50] * 20}
    ports.backends.behaviours[SPEC.name] = answer
    local = Principal(subject="cli", tenant_id="acme", scopes=frozenset({"tools:*"}))
    async with Client(build_server(ports, local)) as client:
        result = await client.call_tool(SPEC.name, {"id": "7"})
        link = result.content[1]
        whole = await client.read_resource(link.uri)
    assert not result.is_error and result.structured_content["truncated"] is True
    assert link.type == "resource_link" and link.uri.startswith("mem://step/")
    assert json.loads(whole.contents[0].text) == {"rows": ["x" * 50] * 20}
    other = Principal(subject="cli", tenant_id="globex", scopes=frozenset({"tools:*"}))
    async with Client(build_server(ports, other)) as client:
        with pytest.raises(MCPError):  # another tenant cannot read it
            await client.read_resource(link.uri)


async def test_a_step_resource_whose_id_is_not_a_call_id_is_not_found_without_reaching_the_store() -> None:
    ports = fake_ports()
    ports.results.stored["acme", "running:x"] = "{}"  # what a key built from a hostile id might reach
    local = Principal(subject="cli", tenant_id="acme", scopes=frozenset({"tools:*"}))
    async with Client(build_server(ports, local)) as client:
        with pytest.raises(MCPError):
            await client.read_resource("mem://step/running:x")


# --- HTTP authentication ------------------------------------------------------------------------------------


async def echo_caller(scope: Scope, receive: Receive, send: Send) -> None:
    """An app that answers with what it was told about the caller."""
    caller = scope["user"]
    assert isinstance(caller, Caller)
    body = json.dumps({"subject": caller.principal.subject, "tenant": caller.principal.tenant_id}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


async def post(app, token: str | None = None) -> httpx2.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://gw") as http:
        return await http.post("/mcp", json={}, headers=headers)


def auth(verifier: TokenVerifier | None = None) -> BearerAuth:
    return BearerAuth(echo_caller, verifier or TokenVerifier(SETTINGS), required_scope="tools:read")


def token(*scopes: str, **kwargs) -> str:
    return issue_token(SETTINGS, subject="agent-1", tenant_id="acme", scopes=list(scopes), **kwargs)


async def test_a_request_without_a_token_is_401_with_a_json_rpc_error_carrying_the_structured_error() -> None:
    reply = await post(auth())
    assert reply.status_code == 401
    assert reply.headers["www-authenticate"] == "Bearer"
    body = reply.json()
    assert body["jsonrpc"] == "2.0" and body["id"] is None
    assert body["error"]["message"] == "unauthenticated: no bearer token"
    assert body["error"]["data"]["field"] == "authorization"


async def test_an_expired_token_is_401_invalid_token_saying_it_expired() -> None:
    reply = await post(auth(), token("tools:read", ttl_seconds=-60))  # beyond the 30 s leeway
    assert reply.status_code == 401
    assert reply.headers["www-authenticate"] == \
        'Bearer error="invalid_token", error_description="the token has expired"'
    assert reply.json()["error"]["data"]["reason"] == "the token has expired"


@pytest.mark.parametrize("scopes", [(), ("tools:call",), ("memory:*",)])
async def test_a_token_without_the_endpoint_scope_is_403_insufficient_scope(scopes: tuple[str, ...]) -> None:
    reply = await post(auth(), token(*scopes))
    assert reply.status_code == 403
    challenge = reply.headers["www-authenticate"]
    assert challenge.startswith('Bearer error="insufficient_scope", scope="tools:read"')
    assert reply.json()["error"]["data"]["error_type"] == "permission_denied"


@pytest.mark.parametrize("scopes", [("tools:read",), ("tools:*",), ("*",)])
async def test_a_token_with_the_endpoint_scope_reaches_the_app_with_its_caller(
    scopes: tuple[str, ...]
) -> None:
    reply = await post(auth(), token(*scopes))
    assert reply.status_code == 200
    assert reply.json() == {"subject": "agent-1", "tenant": "acme"}


async def test_a_callers_user_is_built_once_per_verified_token_and_again_once_the_verifier_forgets_it() -> None:
    seen = []

    async def keep(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append((scope["user"], scope["auth"]))
        await echo_caller(scope, receive, send)

    verifier = TokenVerifier(SETTINGS)
    app, good = BearerAuth(keep, verifier, required_scope="tools:read"), token("tools:read")
    for _ in range(2):
        assert (await post(app, good)).status_code == 200
    assert seen[0][0] is seen[1][0] and seen[0][1] is seen[1][1]
    verifier._verified.clear()  # the token's time in the verifier's memory is over: verified, and built, anew
    assert (await post(app, good)).status_code == 200
    assert seen[2][0] is not seen[1][0] and seen[2][0].principal == seen[1][0].principal
    assert (await post(app, token("tools:call"))).status_code == 403  # another token: its own checks


async def test_with_auth_disabled_every_request_is_an_anonymous_caller() -> None:
    reply = await post(BearerAuth(echo_caller, None, required_scope="tools:read"))
    assert reply.json() == {"subject": "anonymous", "tenant": ""}

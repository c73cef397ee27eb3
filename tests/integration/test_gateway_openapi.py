"""Plain HTTP/JSON backends as tools: an OpenAPI 3 document and a URL template are registered with
`mnemesh tools register` (the real CLI, in its own process) and called through the gateway's pipeline
by the official MCP client and over gRPC, against a real HTTP server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator

import anyio
import pytest
import test_mcp
from google.protobuf import json_format, struct_pb2
from http_backend import HttpBackend, http_backend, openapi_document
from test_mcp import Gateway, mcp_client

from libs.protogen.mnemesh.v1 import tools_pb2, tools_pb2_grpc
from libs.rpc import channel

pytestmark = pytest.mark.integration
gateway = test_mcp.gateway


@pytest.fixture
async def backend() -> AsyncIterator[HttpBackend]:
    async with http_backend() as state:
        yield state


async def register_cli(gw: Gateway, *args: str) -> tuple[int, dict]:
    """`mnemesh tools register ... --json` against this gateway; (exit code, report)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNEMESH_")}
    env.update(MNEMESH_TOKEN=gw.token("tools:admin"), MNEMESH_HOST="127.0.0.1",
               MNEMESH_TOOL_GATEWAY_GRPC_PORT=str(gw.settings.tool_gateway_grpc_port))
    done = await anyio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "mnemesh", "tools", "register", *args, "--json"], env=env, capture_output=True,
        text=True, timeout=60))
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


async def grpc_call(gw: Gateway, name: str, arguments: dict) -> tools_pb2.CallToolResponse:
    args = struct_pb2.Struct()
    args.update(arguments)
    async with channel(gw.grpc, gw.token("tools:call")) as ch:
        return await tools_pb2_grpc.ToolGatewayStub(ch).CallTool(
            tools_pb2.CallToolRequest(name=name, arguments=args), timeout=15)


async def test_an_openapi_document_becomes_tools_called_through_the_pipeline(
    gateway: Gateway, backend: HttpBackend, tmp_path
) -> None:
    document = tmp_path / "shop.json"
    document.write_text(json.dumps(openapi_document(backend.url(""))))
    code, report = await register_cli(gateway, "--openapi", str(document), "--prefix", "shop")
    assert code == 0 and sorted(report["registered"]) == ["shop.create_order 2.1.0", "shop.get_customer 2.1.0"]
    assert {s["operation"] for s in report["skipped"]} == {"PUT /orders", "GET /audit"}
    assert any("header parameter 'X-Auditor'" in s["reason"] for s in report["skipped"])

    async with mcp_client(gateway, gateway.token("tools:read", "tools:call")) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        order = await client.call_tool("shop.create_order", {"item": "茶", "quantity": 2, "dry-run": True})
        zero = await client.call_tool("shop.create_order", {"item": "tea", "quantity": 0})
    assert tools["shop.create_order"].input_schema["required"] == ["item", "quantity"]
    assert tools["shop.get_customer"].description.startswith("GET /customers/{customer-id}: Read one customer")
    assert not order.is_error, order.content
    assert order.structured_content == {"query": {"dry-run": "true"}, "body": {"item": "茶", "quantity": 2}}
    # The 3.0 `exclusiveMinimum: true` became JSON Schema's own: 0 is refused before the backend is called.
    assert zero.is_error and zero.structured_content["field"] == "arguments/quantity"
    assert backend.calls["orders"] == 1

    customer = await grpc_call(gateway, "shop.get_customer", {"customer_id": "c 7", "vip": True})
    assert customer.outcome == "ok"
    assert json_format.MessageToDict(customer.result) == {"id": "c 7", "name": "Li Wei", "vip": "true"}
    again_code, again = await register_cli(gateway, "--openapi", str(document), "--prefix", "shop")
    assert again_code == 0 and again["registered"] == [] and len(again["existing"]) == 2


async def test_a_url_template_is_a_tool_whose_schema_comes_from_its_placeholders(
    gateway: Gateway, backend: HttpBackend
) -> None:
    template = "GET " + backend.url("/customers/{cid}{?vip}")
    code, report = await register_cli(gateway, "crm.customer", "--url", template,
                                      "--description", "Read a customer of the CRM by id")
    assert code == 0 and report["registered"] == ["crm.customer 1.0.0"]
    async with mcp_client(gateway, gateway.token("tools:read", "tools:call")) as client:
        [tool] = (await client.list_tools()).tools
        found = await client.call_tool("crm.customer", {"cid": "李", "vip": "yes"})
        missing = await client.call_tool("crm.customer", {"vip": "yes"})
    assert tool.input_schema == {"type": "object", "required": ["cid"],
                                 "properties": {"cid": {"type": "string"}, "vip": {"type": "string"}}}
    assert found.structured_content == {"id": "李", "name": "Li Wei", "vip": "yes"}
    assert missing.is_error and missing.structured_content["error_type"] == "validation"
    assert backend.calls["customer"] == 1


async def test_a_document_without_a_server_address_is_refused_saying_what_to_pass(
    gateway: Gateway, tmp_path
) -> None:
    document = tmp_path / "relative.yaml"
    document.write_text("openapi: 3.1.0\ninfo: {title: x, version: '1'}\nservers: [{url: /api}]\npaths: {}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNEMESH_")}
    env.update(MNEMESH_TOKEN=gateway.token("tools:admin"),
               MNEMESH_TOOL_GATEWAY_GRPC_PORT=str(gateway.settings.tool_gateway_grpc_port))
    done = await anyio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "mnemesh", "tools", "register", "--openapi", str(document)], env=env,
        capture_output=True, text=True, timeout=60))
    assert done.returncode == 1 and "servers" in done.stderr and "--base-url" in done.stderr

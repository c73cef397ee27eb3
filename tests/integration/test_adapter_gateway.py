"""SOAP operations as ordinary tools, end to end: a real spyne server, the adapter and the tool-gateway
served in this process (real PostgreSQL and Redis), the official MCP client and gRPC CallTool.

The adapter imports the WSDL and registers its tools with the gateway over RegisterTool; agents list
and call them through the gateway's pipeline, which calls the adapter's Invoke."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest
import test_mcp
from google.protobuf import json_format, struct_pb2
from pydantic import SecretStr
from soap_fixture import soap_server
from test_mcp import Gateway, drop_namespace, gateway_settings, mcp_client

from libs.auth import issue_token
from libs.protogen.mnemesh.v1 import tools_pb2, tools_pb2_grpc
from libs.rpc import channel
from libs.runtime import run_service
from mnemesh.infra import free_port
from mnemesh.registry import load_bootstrap
from mnemesh.supervisor import check_health

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def soap_url() -> Iterator[str]:
    with soap_server() as url:
        yield url


@contextlib.asynccontextmanager
async def adapter_running(settings) -> AsyncIterator[str]:
    wiring = load_bootstrap("adapter")
    stop = asyncio.Event()
    task = asyncio.create_task(run_service("adapter", settings, wiring.bootstrap,
                                           migrations_package=wiring.migrations, stop=stop))
    address = f"127.0.0.1:{settings.adapter_grpc_port}"
    with anyio.fail_after(60):
        while not await check_health(address):
            if task.done():
                await task
            await anyio.sleep(0.1)
    try:
        yield address
    finally:
        stop.set()
        await task


@pytest.fixture
async def mesh(redis_url: str, database_url: str, tmp_path) -> AsyncIterator[tuple[Gateway, str]]:
    settings = gateway_settings(redis_url, database_url, tmp_path, adapter_grpc_port=free_port())
    # The gateway calls Adapter.Invoke with its own credential (scope adapter:invoke).
    invoke_token = issue_token(settings, subject="service:tool-gateway", tenant_id="mesh", scopes=["adapter:invoke"])
    settings = settings.model_copy(update={"tool_adapter_token": SecretStr(invoke_token)})
    async with test_mcp.running(settings) as gw, adapter_running(settings) as adapter:
        yield gw, adapter
    await drop_namespace(settings)


async def import_billing(gw: Gateway, adapter: str, soap_url: str) -> tools_pb2.ImportWsdlResponse:
    async with channel(adapter, gw.token("adapter:admin")) as ch:
        return await tools_pb2_grpc.AdapterStub(ch).ImportWsdl(
            tools_pb2.ImportWsdlRequest(backend_id="billing", url=f"{soap_url}/soap11?wsdl"), timeout=30)


async def call_tool(gw: Gateway, name: str, arguments: dict) -> tools_pb2.CallToolResponse:
    args = struct_pb2.Struct()
    args.update(arguments)
    async with channel(gw.grpc, gw.token("tools:call")) as ch:
        return await tools_pb2_grpc.ToolGatewayStub(ch).CallTool(
            tools_pb2.CallToolRequest(name=name, arguments=args), timeout=30)


@pytest.mark.parametrize("mode", test_mcp.MODES)
async def test_an_imported_wsdl_is_listed_and_called_through_the_gateway_by_an_mcp_client(
        mesh: tuple[Gateway, str], soap_url: str, mode: str) -> None:
    gw, adapter = mesh
    imported = await import_billing(gw, adapter, soap_url)
    assert imported.registered, imported.registration_error
    async with mcp_client(gw, gw.token("tools:read", "tools:call"), mode) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert {"billing.get_customer", "billing.find_customers", "billing.create_invoice"} <= set(tools)
        assert tools["billing.get_customer"].input_schema["required"] == ["customer_id"]
        # The SDK client checks structured content against the listed output schema.
        result = await client.call_tool("billing.get_customer", {"customer_id": 2})
        assert not result.is_error, result.content
        customer = result.structured_content["get_customerResult"]
        assert customer["balance"] == "-0.01" and customer["address"]["city"] == "London"
        assert customer["referrer"]["name"] == "Ada Lovelace"
        fault = await client.call_tool("billing.get_customer", {"customer_id": 9})
        invalid = await client.call_tool("billing.find_customers", {"status": "gone"})
    # A tool with an output schema answers its errors as JSON text only (clients check structured content
    # against the schema even on errors).
    error = json.loads(fault.content[0].text)
    assert fault.is_error and fault.structured_content is None
    assert error["error_type"] == "backend_fault" and error["retryable"] is False
    assert "CustomerNotFound" in error["reason"] and "no customer 9" in error["reason"] and error["hint"]
    # The SOAP fault itself is kept beside the structured error: its code and detail.
    assert error["fault"]["code"].endswith("Client.CustomerNotFound")
    assert error["fault"]["declared"] == "CustomerNotFound" and error["fault"]["detail"] == {"customer_id": "9"}
    # The gateway validates against the schema the adapter generated, before any SOAP call.
    refusal = json.loads(invalid.content[0].text)
    assert invalid.is_error and (refusal["error_type"], refusal["field"]) == ("validation", "arguments/status")


async def test_grpc_call_tool_reaches_the_soap_service_and_a_fault_keeps_its_structure(
        mesh: tuple[Gateway, str], soap_url: str) -> None:
    gw, adapter = mesh
    assert (await import_billing(gw, adapter, soap_url)).registered
    ok = await call_tool(gw, "billing.create_invoice", {"customer_id": 1, "due": "2025-01-31", "lines": {
        "InvoiceLine": [{"sku": "a", "quantity": 2, "unit_price": "1.10"}]}})
    assert ok.outcome == "ok" and ok.version.startswith("1.")
    assert json_format.MessageToDict(ok.result)["create_invoiceResult"]["total"] == "2.20"
    # A SOAP fault is a failure behind the backend (the call happened): it is answered in band, with the
    # adapter's structured error, like any backend failure.
    fault = await call_tool(gw, "billing.get_customer", {"customer_id": 9})
    detail = fault.error
    assert fault.outcome != "ok"
    assert (detail.error_type, detail.retryable) == ("backend_fault", False) and "CustomerNotFound" in detail.reason
    kept = json_format.MessageToDict(fault.fault)
    assert kept["code"].endswith("Client.CustomerNotFound") and kept["detail"] == {"customer_id": "9"}

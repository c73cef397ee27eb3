"""How a call's error and an over-cap result are shaped for the MCP client, through fakes and the official Python
SDK client: a tool that declares an output schema gets its errors as JSON text only (clients check
structuredContent against that schema even on an error: the TypeScript SDK 1.x throws), a tool without one keeps
structuredContent; the pipeline's failed outcomes say whether their tool declares one, and so do the task path's
answers; a caller on a revision before 2025-06-18 gets the link to a whole result as a text block."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
from gateway_fakes import FakeTasks, fake_ports
from mcp import Client

from libs.auth import Principal
from libs.errors import Unavailable
from services.tool_gateway.domain import BackendFailed, ToolCall, ToolSpec
from services.tool_gateway.entrypoints.mcp_server import build_server, error_result, outcome_result
from services.tool_gateway.entrypoints.mcp_tasks import TaskMiddleware, task_handlers
from services.tool_gateway.service_layer.pipeline import CallPorts, admit_call, call_tool
from services.tool_gateway.service_layer.tasks import TaskRunner

LOCAL = Principal(subject="cli", tenant_id="acme", scopes=frozenset({"tools:*", "crm:read"}))
INPUT = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}
OUTPUT = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
TYPED = ToolSpec(name="crm.get_customer", description="Look up a customer.", input_schema=INPUT,
                 output_schema=OUTPUT, version="1.0.0", timeout_seconds=1.0)
UNTYPED = replace(TYPED, name="crm.find_customer", output_schema={})


def failing(error: Exception):
    async def behaviour(arguments: dict) -> dict:
        raise error
    return behaviour


def answering(result: dict):
    async def behaviour(arguments: dict) -> dict:
        return result
    return behaviour


async def ports_with(*specs: ToolSpec, **policy) -> CallPorts:
    ports = fake_ports(**policy)
    for spec in specs:
        await ports.registry.register(spec)
    return ports


def text_error(result) -> dict:
    """The structured error a tool error carries as its JSON text."""
    assert result.is_error
    return json.loads(result.content[0].text)


async def test_an_error_of_a_tool_with_an_output_schema_is_json_text_only_and_one_without_keeps_structured_content(
) -> None:
    ports = await ports_with(TYPED, UNTYPED)
    for spec in (TYPED, UNTYPED):
        ports.backends.behaviours[spec.name] = failing(BackendFailed("the CRM is down", hint="retry later"))
    async with Client(build_server(ports, LOCAL)) as client:
        await client.list_tools()  # the client learns the output schemas it checks results against
        typed = await client.call_tool(TYPED.name, {"id": "7"})
        refused = await client.call_tool(TYPED.name, {"id": 7})  # refused after routing: arguments
        untyped = await client.call_tool(UNTYPED.name, {"id": "7"})
        unknown = await client.call_tool("crm.nothing", {})
    assert typed.structured_content is None and refused.structured_content is None
    assert text_error(typed)["error_type"] == "backend_error" and text_error(typed)["reason"] == "the CRM is down"
    assert (text_error(refused)["error_type"], text_error(refused)["field"]) == ("validation", "arguments/id")
    assert set(text_error(typed)) == {"error_type", "field", "reason", "retryable", "hint"}
    assert untyped.structured_content == text_error(untyped) and untyped.structured_content["error_type"] == \
        "backend_error"
    assert unknown.structured_content == text_error(unknown) and unknown.structured_content["error_type"] == \
        "not_found"


async def test_an_over_cap_result_of_a_tool_with_an_output_schema_is_an_error_without_structured_content() -> None:
    ports = await ports_with(TYPED, result_max_bytes=64)
    ports.backends.behaviours[TYPED.name] = answering({"name": "x" * 200})
    async with Client(build_server(ports, LOCAL)) as client:
        result = await client.call_tool(TYPED.name, {"id": "7"})
    assert result.structured_content is None
    assert text_error(result)["error_type"] == "result_too_large"
    assert result.content[1].type == "resource_link" and result.content[1].uri.startswith("mem://step/")


@pytest.mark.parametrize(("behaviour", "error_type"), [
    (failing(BackendFailed("down")), "backend_error"),
    (failing(Unavailable("gone", retryable=True)), "unavailable"),
])
async def test_failed_outcomes_say_whether_their_tool_declares_an_output_schema(behaviour, error_type: str) -> None:
    fallback = replace(UNTYPED, name="crm.backup")
    ports = await ports_with(replace(TYPED, fallback=("crm.backup",)), UNTYPED, fallback)
    ports.backends.behaviours.update({TYPED.name: behaviour, UNTYPED.name: behaviour, fallback.name: behaviour})
    typed = await call_tool(ToolCall(TYPED.name, {"id": "7"}, LOCAL), ports)  # its fallback fails too
    untyped = await call_tool(ToolCall(UNTYPED.name, {"id": "7"}, LOCAL), ports)
    assert (typed.error.error_type, typed.has_output_schema) == (error_type, True)
    assert (untyped.error.error_type, untyped.has_output_schema) == (error_type, False)


async def test_refusals_after_routing_carry_the_output_schema_flag_and_one_before_it_does_not() -> None:
    ports = await ports_with(replace(TYPED, scopes=("crm:read",)))
    reader = Principal(subject="agent", tenant_id="acme", scopes=frozenset({"tools:call"}))
    scopes = await call_tool(ToolCall(TYPED.name, {"id": "7"}, reader), ports)
    arguments = await admit_call(ToolCall(TYPED.name, {"id": 7}, LOCAL), ports)
    unknown = await call_tool(ToolCall("crm.nothing", {}, LOCAL), ports)
    assert (scopes.error.error_type, scopes.has_output_schema) == ("permission_denied", True)
    assert (arguments.error.error_type, arguments.has_output_schema) == ("validation", True)
    assert (unknown.error.error_type, unknown.has_output_schema) == ("not_found", False)


async def test_a_refused_or_cancelled_task_of_a_tool_with_an_output_schema_answers_without_structured_content(
) -> None:
    ports = await ports_with(TYPED)
    ports.backends.behaviours[TYPED.name] = failing(BackendFailed("never reached"))
    runner = TaskRunner(ports, FakeTasks())
    middleware = TaskMiddleware(runner, lambda ctx: LOCAL, lambda params: "", outcome_result)
    ctx = SimpleNamespace(method="tools/call", protocol_version="2025-11-25",
                          params={"name": TYPED.name, "arguments": {"id": 7}, "task": {"ttl": 1000}})
    refused = await middleware(ctx, None)
    assert "structuredContent" not in refused and json.loads(refused["content"][0]["text"])["field"] == "arguments/id"

    hang = asyncio.Event()

    async def hanging(arguments: dict) -> dict:
        await hang.wait()
        return {"name": "never"}
    ports.backends.behaviours[TYPED.name] = hanging
    task_id = (await runner.start(ToolCall(TYPED.name, {"id": "7"}, LOCAL)))["task_id"]
    await runner.cancel_task(LOCAL, task_id)
    handlers = task_handlers(runner, lambda ctx: LOCAL, outcome_result, error_result)
    _, task_result = handlers["tasks/result"]
    answered = await task_result(SimpleNamespace(), SimpleNamespace(task_id=task_id))
    assert answered["isError"] is True and "structuredContent" not in answered
    assert json.loads(answered["content"][0]["text"])["error_type"] == "cancelled"


@pytest.mark.parametrize(("version", "kind"), [("2024-11-05", "text"), ("2025-03-26", "text"),
                                               ("2025-06-18", "resource_link"), ("2025-11-25", "resource_link"),
                                               ("2026-07-28", "resource_link")])
async def test_the_link_to_a_whole_result_is_a_text_block_for_revisions_before_resource_links(
    version: str, kind: str
) -> None:
    ports = await ports_with(UNTYPED, TYPED, result_max_bytes=64)
    for spec in (UNTYPED, TYPED):
        ports.backends.behaviours[spec.name] = answering({"name": "x" * 200})
    outcomes = [await call_tool(ToolCall(spec.name, {"id": "7"}, LOCAL), ports) for spec in (UNTYPED, TYPED)]
    for outcome in outcomes:
        link = outcome_result(outcome, version).content[1]
        assert link.type == kind
        if kind == "text":
            assert link.text == f"the whole result is the resource {outcome.resource_uri}; read it with resources/read"
        else:
            assert link.uri == outcome.resource_uri


async def test_an_error_the_pipeline_did_not_shape_is_text_only_when_the_registry_cannot_say_soon(
        monkeypatch) -> None:
    """PostgreSQL away (the registry cache off too): the lookup of the tool's output schema is bounded, and in
    doubt the error is text alone, which no client's check of structured content can break."""
    from services.tool_gateway.entrypoints import mcp_server
    from services.tool_gateway.entrypoints.mcp_sessions import InFlightCalls

    ports = await ports_with(UNTYPED)
    monkeypatch.setattr(mcp_server, "LOOKUP_SECONDS", 0.05)

    async def unreachable(call, ports):
        raise ConnectionRefusedError("PostgreSQL is away")

    async def slow_lookup(name):
        await asyncio.sleep(10)

    monkeypatch.setattr(mcp_server.pipeline, "call_tool", unreachable)
    monkeypatch.setattr(ports.registry, "lookup", slow_lookup)
    params = SimpleNamespace(name=UNTYPED.name, arguments={"id": "7"}, meta=None)
    started = asyncio.get_running_loop().time()
    result = await mcp_server.answer_call(ports, LOCAL, params, in_flight=InFlightCalls())
    assert asyncio.get_running_loop().time() - started < 2
    assert result.structured_content is None and text_error(result)["error_type"] == "unavailable"

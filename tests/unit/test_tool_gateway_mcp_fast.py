"""The lean tools/call path of the MCP endpoint (mcp_fast.FastCalls) through its ASGI surface, with fake ports:
what it serves itself, what it leaves to the SDK, and a client that goes away cancelling the call."""

from __future__ import annotations

import asyncio
import functools
import json
from dataclasses import replace

import anyio
import pytest
from gateway_fakes import fake_ports
from mcp.server.transport_security import TransportSecuritySettings

from libs.auth import Principal
from services.tool_gateway.domain import ToolSpec
from services.tool_gateway.entrypoints.mcp_auth import Caller
from services.tool_gateway.entrypoints.mcp_fast import FastCalls, param_schema
from services.tool_gateway.entrypoints.mcp_server import answer_call, build_server
from services.tool_gateway.entrypoints.mcp_sessions import InFlightCalls, session_for
from services.tool_gateway.service_layer import handlers

ALICE = Principal(subject="alice", tenant_id="acme", scopes=frozenset({"tools:*"}))
SPEC = ToolSpec(name="crm.get_customer", description="Look up a customer.",
                input_schema={"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
                output_schema={}, version="1.0.0")
MODERN_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
               "io.modelcontextprotocol/clientCapabilities": {}}
SECURITY = TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=["127.0.0.1:*"],
                                     allowed_origins=["http://127.0.0.1:*"])


def headers(version: str, **extra: str) -> dict[str, str]:
    base = {"host": "127.0.0.1:8765", "content-type": "application/json",
            "accept": "application/json, text/event-stream", "mcp-protocol-version": version}
    if version == "2026-07-28":
        base.update({"mcp-method": "tools/call", "mcp-name": SPEC.name})
    return {**base, **extra}


def call(version: str, arguments: dict, **params) -> dict:
    extra = {"_meta": dict(MODERN_META)} if version == "2026-07-28" else {}
    merged = {"name": SPEC.name, "arguments": arguments, **extra, **params}
    return {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": merged}


class Sdk:
    """Stands for the SDK app behind the lean path: records what reached it."""

    def __init__(self) -> None:
        self.reached = 0

    async def __call__(self, scope, receive, send) -> None:
        self.reached += 1
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def lean(ports=None):
    ports = ports or fake_ports()
    await ports.registry.register(SPEC)

    async def answer(arguments: dict) -> dict:
        return {"name": "Li", "id": arguments["id"]}
    ports.backends.behaviours[SPEC.name] = answer
    sdk, in_flight = Sdk(), InFlightCalls()
    app = FastCalls(sdk, build_server(ports), functools.partial(answer_call, ports, in_flight=in_flight),
                    path="/mcp", security=SECURITY, in_flight=in_flight)
    return app, sdk, ports


async def post(app, hdrs: dict[str, str], message: dict, receive=None) -> list[dict]:
    body = json.dumps(message).encode()
    scope = {"type": "http", "method": "POST", "path": "/mcp", "scheme": "http", "server": ("127.0.0.1", 8765),
             "headers": [(k.encode(), v.encode()) for k, v in hdrs.items()], "mcp.message": message,
             "mcp.body_bytes": len(body), "user": Caller(ALICE, "token")}
    sent: list[dict] = []

    async def wait_forever():
        await anyio.sleep_forever()

    async def send(msg):
        sent.append(msg)

    await app(scope, receive or wait_forever, send)
    return sent


async def test_a_2026_call_is_answered_as_json_with_the_revision_s_result_shape_without_the_sdk() -> None:
    app, sdk, ports = await lean()
    sent = await post(app, headers("2026-07-28"), call("2026-07-28", {"id": "7"}))
    assert sdk.reached == 0
    assert sent[0]["status"] == 200 and (b"content-type", b"application/json") in sent[0]["headers"]
    answer = json.loads(sent[1]["body"])
    assert answer["id"] == 5 and answer["result"]["structuredContent"] == {"name": "Li", "id": "7"}
    assert answer["result"]["resultType"] == "complete"
    assert answer["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "mnemesh-tool-gateway"
    assert [r.outcome for r in ports.call_log.records] == ["ok"]  # audited like any call


async def test_a_2025_call_is_answered_as_one_sse_message_event() -> None:
    app, sdk, _ = await lean()
    sent = await post(app, headers("2025-11-25"), call("2025-11-25", {"id": "7"}))
    assert sdk.reached == 0 and (b"content-type", b"text/event-stream") in sent[0]["headers"]
    frame = sent[1]["body"].decode()
    assert frame.startswith("event: message\r\ndata: ") and frame.endswith("\r\n\r\n")
    result = json.loads(frame.split("data: ", 1)[1])["result"]
    assert result["structuredContent"] == {"name": "Li", "id": "7"} and "resultType" not in result


async def test_a_refused_call_is_a_tool_error_with_the_structured_error() -> None:
    app, sdk, _ = await lean()
    sent = await post(app, headers("2026-07-28"), call("2026-07-28", {"id": 7}))
    result = json.loads(sent[1]["body"])["result"]
    assert sdk.reached == 0 and result["isError"] is True
    assert (result["structuredContent"]["error_type"], result["structuredContent"]["field"]) == \
        ("validation", "arguments/id")


@pytest.mark.parametrize("case", ["progress", "task", "param_header", "no_version", "unknown_version",
                                  "no_envelope", "wrong_method_header", "bad_content_type", "foreign_host",
                                  "json_only_accept", "bad_params"])
async def test_what_needs_the_sdk_or_that_the_sdk_refuses_goes_to_the_sdk(case: str) -> None:
    app, sdk, ports = await lean()
    version = "2025-11-25" if case in {"no_version"} else "2026-07-28"
    hdrs, message = headers(version), call(version, {"id": "7"})
    if case == "progress":
        message["params"]["_meta"]["progressToken"] = "p1"
    elif case == "task":
        message["params"]["task"] = {"ttl": 60_000}
    elif case == "param_header":
        hdrs["mcp-param-id"] = "7"
    elif case == "no_version":
        del hdrs["mcp-protocol-version"]
    elif case == "unknown_version":
        hdrs["mcp-protocol-version"] = "2099-01-01"
    elif case == "no_envelope":
        del message["params"]["_meta"]
    elif case == "wrong_method_header":
        hdrs["mcp-method"] = "tools/list"
    elif case == "bad_content_type":
        hdrs["content-type"] = "text/plain"
    elif case == "foreign_host":
        hdrs["host"] = "evil.example:80"
    elif case == "json_only_accept":
        hdrs["accept"] = "application/json"
    elif case == "bad_params":
        message["params"]["name"] = 7
    sent = await post(app, hdrs, message)
    assert sdk.reached == 1 and sent[0]["status"] == 299
    assert ports.call_log.records == []


@pytest.mark.parametrize(("session", "lean_path"), [(session_for({}), True), (session_for({"sampling": {}}), True),
                                                   ("someone-else's-session", False), ("", False)])
async def test_a_call_without_a_version_header_is_a_2025_03_26_one_in_a_session_this_gateway_issued(
    session: str, lean_path: bool
) -> None:
    """A 2025-03-26 client sends no MCP-Protocol-Version header (that revision has none): in a session this gateway
    issued, the lean path (and the relay in front of it) serves it as 2025-03-26; anything else goes to the SDK."""
    app, sdk, _ = await lean()
    hdrs = headers("2025-03-26", **({"mcp-session-id": session} if session else {}))
    del hdrs["mcp-protocol-version"]
    sent = await post(app, hdrs, call("2025-03-26", {"id": "7"}))
    assert (sdk.reached == 0) is lean_path
    if lean_path:
        result = json.loads(sent[1]["body"].decode().split("data: ", 1)[1])["result"]
        assert result["structuredContent"] == {"name": "Li", "id": "7"}


async def test_a_client_that_closes_its_stream_cancels_the_call_and_gets_no_answer() -> None:
    ports = fake_ports()
    app, sdk, ports = await lean(ports)
    started, stopped = asyncio.Event(), asyncio.Event()

    async def slow(arguments: dict) -> dict:
        started.set()
        try:
            await asyncio.sleep(60)
        finally:
            stopped.set()
        return {}
    ports.backends.behaviours[SPEC.name] = slow
    messages = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive():
        if messages:
            return messages.pop()
        await started.wait()
        return {"type": "http.disconnect"}

    with anyio.fail_after(10):
        sent = await post(app, headers("2026-07-28"), call("2026-07-28", {"id": "7"}), receive)
    assert stopped.is_set() and sent == []
    await asyncio.sleep(0.05)  # the cancelled call's audit row is written off the call's path
    assert [r.outcome for r in ports.call_log.records] == ["cancelled"]


async def test_a_server_with_middleware_the_lean_path_does_not_replay_has_every_call_served_by_the_sdk() -> None:
    ports = fake_ports()
    await ports.registry.register(SPEC)
    server = build_server(ports)

    async def audit_everything(ctx, call_next):
        return await call_next(ctx)
    server.middleware.append(audit_everything)
    sdk, in_flight = Sdk(), InFlightCalls()
    app = FastCalls(sdk, server, functools.partial(answer_call, ports, in_flight=in_flight), path="/mcp",
                    security=SECURITY, in_flight=in_flight)
    await post(app, headers("2026-07-28"), call("2026-07-28", {"id": "7"}))
    assert sdk.reached == 1


ROUTE = ToolSpec(name="geo.route", description="Where a parcel goes.", version="1.0.0", output_schema={},
                 input_schema={"type": "object", "properties": {"region": {"type": "string", "x-mcp-header": "Region"},
                                                                "parcel": {"type": "string"}}})


class SchemaSeeingSdk(Sdk):
    """The SDK app: records the schema its `get_tool_input_schema` hook (param_schema) answers for geo.route."""

    def __init__(self) -> None:
        super().__init__()
        self.schemas: list = []

    async def __call__(self, scope, receive, send) -> None:
        self.schemas.append(param_schema("geo.route"))
        await super().__call__(scope, receive, send)


async def checking(*specs: ToolSpec):
    ports = fake_ports()
    for spec in specs:
        await ports.registry.register(spec)

    async def route(arguments: dict) -> dict:
        return {"to": arguments.get("region")}
    ports.backends.behaviours["geo.route"] = route
    sdk, in_flight = SchemaSeeingSdk(), InFlightCalls()
    app = FastCalls(sdk, build_server(ports), functools.partial(answer_call, ports, in_flight=in_flight),
                    path="/mcp", security=SECURITY, in_flight=in_flight,
                    schema_of=functools.partial(handlers.listed_schema, registry=ports.registry))
    return app, sdk, ports


def route_call(**arguments: str) -> tuple[dict, dict]:
    message = call("2026-07-28", arguments)
    message["params"]["name"] = "geo.route"
    return message, headers("2026-07-28", **{"mcp-name": "geo.route"})


async def test_a_call_whose_mcp_param_headers_mirror_its_marked_arguments_is_served_by_the_lean_path() -> None:
    app, sdk, _ = await checking(ROUTE)
    message, hdrs = route_call(region="eu", parcel="p-1")
    sent = await post(app, {**hdrs, "mcp-param-region": "eu"}, message)
    assert sdk.reached == 0 and json.loads(sent[1]["body"])["result"]["structuredContent"] == {"to": "eu"}


@pytest.mark.parametrize("case", ["missing", "wrong", "stray"])
async def test_a_call_whose_mcp_param_headers_do_not_match_goes_to_the_sdk_with_the_schema_to_judge(case) -> None:
    """Missing or wrong: the SDK refuses it (HEADER_MISMATCH); a header nothing marks (stray): it ignores it."""
    app, sdk, ports = await checking(ROUTE)
    message, hdrs = route_call(region="eu", parcel="p-1")
    extra = {"missing": {}, "wrong": {"mcp-param-region": "us"},
             "stray": {"mcp-param-region": "eu", "mcp-param-parcel": "p-1"}}[case]
    await post(app, {**hdrs, **extra}, message)
    assert sdk.reached == 1 and sdk.schemas == [ROUTE.input_schema] and ports.call_log.records == []
    assert param_schema("geo.route") is None  # only while that request is served


async def test_headers_are_checked_against_the_listed_stable_version_not_the_callers_canary_arm() -> None:
    marked = replace(ROUTE, version="2.0.0")
    unmarked = replace(ROUTE, input_schema={"type": "object", "properties": {"region": {"type": "string"},
                                                                            "parcel": {"type": "string"}}})
    app, sdk, ports = await checking(unmarked, marked)
    await handlers.set_canary("geo.route", "2.0.0", ports.registry, percent=100.0)
    message, hdrs = route_call(region="eu", parcel="p-1")
    sent = await post(app, hdrs, message)  # the client mirrors what tools/list showed it: 1.0.0, nothing marked
    assert sdk.reached == 0 and json.loads(sent[1]["body"])["result"]["structuredContent"] == {"to": "eu"}
    assert [r.version for r in ports.call_log.records] == ["2.0.0"]  # run by the canary all the same


async def test_a_tool_the_caller_may_not_call_is_not_checked_but_refused_by_the_pipeline() -> None:
    app, sdk, ports = await checking(replace(ROUTE, scopes=("geo:route",)))
    message, hdrs = route_call(region="eu", parcel="p-1")
    sent = await post(app, hdrs, message)  # no header: no HEADER_MISMATCH to tell which arguments it marks
    result = json.loads(sent[1]["body"])["result"]
    assert sdk.reached == 0 and result["structuredContent"]["error_type"] == "permission_denied"
    assert [r.outcome for r in ports.call_log.records] == ["error"]  # audited

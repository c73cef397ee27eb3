"""The MCP protocol around a call, through a real gateway in front of real upstream MCP servers (this
repository's fixture, over stdio and Streamable HTTP), reached with the official MCP client in both
eras: progress relayed from the upstream, cancellation reaching the upstream (MCP and gRPC),
tool-list changes pushed to connected clients, and the OAuth protected-resource metadata."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import anyio
import httpx2
import mcp_types as types
import pytest
from google.protobuf import json_format, struct_pb2
from test_gateway_upstreams import federating, http_upstream, listed  # noqa: F401 - fixtures
from test_mcp import MODES, Gateway, gateway, mcp_client, register  # noqa: F401 - fixtures
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from libs.protogen.mnemesh.v1 import tools_pb2, tools_pb2_grpc
from libs.rpc import channel

pytestmark = pytest.mark.integration


async def wait_for_text(path: Path, text: str, seconds: float = 20) -> None:
    with anyio.fail_after(seconds):
        while not (path.exists() and path.read_text() == text):
            await anyio.sleep(0.05)


@pytest.mark.parametrize("mode", MODES)
async def test_progress_an_upstream_reports_reaches_the_client_that_asked_for_it(
    federating: Gateway, mode: str  # noqa: F811
) -> None:
    await listed(federating, {"local.count", "rm.count"})
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with mcp_client(federating, federating.token("tools:*"), mode) as client:
        local = await client.call_tool("local.count", {"steps": 3}, progress_callback=on_progress)
        remote = await client.call_tool("rm.count", {"steps": 2}, progress_callback=on_progress)
        silent = await client.call_tool("local.count", {"steps": 2})
    assert (local.structured_content, remote.structured_content, silent.structured_content) == \
        ({"steps": 3}, {"steps": 2}, {"steps": 2})
    assert seen == [(1, 3, "step 1 of 3"), (2, 3, "step 2 of 3"), (3, 3, "step 3 of 3"),
                    (1, 2, "step 1 of 2"), (2, 2, "step 2 of 2")]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("upstream", ["local", "rm"])
async def test_a_cancelled_mcp_call_cancels_the_upstream_call(
    federating: Gateway, mode: str, upstream: str, tmp_path: Path  # noqa: F811
) -> None:
    """2025-11-25: the client posts notifications/cancelled; 2026-07-28: it closes the request's stream.
    Either way the upstream's tool sees its call cancelled while both servers keep running."""
    await listed(federating, {f"{upstream}.slow"})
    marker = tmp_path / f"slow-{mode}-{upstream}"
    async with mcp_client(federating, federating.token("tools:*"), mode) as client:
        call = asyncio.create_task(client.call_tool(f"{upstream}.slow", {"marker": str(marker)}))
        await wait_for_text(marker, "started")
        call.cancel()
        await wait_for_text(marker, "cancelled")
        with pytest.raises(asyncio.CancelledError):
            await call
        after = await client.call_tool(f"{upstream}.echo", {"text": "still here"})
    assert after.structured_content == {"echo": "still here"}


async def test_a_cancelled_grpc_call_cancels_the_upstream_call(federating: Gateway, tmp_path: Path) -> None:  # noqa: F811
    await listed(federating, {"local.slow"})
    marker = tmp_path / "slow-grpc"
    arguments = struct_pb2.Struct()
    arguments.update({"marker": str(marker)})
    async with channel(federating.grpc, federating.token("tools:*")) as ch:
        call = tools_pb2_grpc.ToolGatewayStub(ch).CallTool(
            tools_pb2.CallToolRequest(name="local.slow", arguments=arguments), timeout=60)
        await wait_for_text(marker, "started")
        call.cancel()
        await wait_for_text(marker, "cancelled")


async def _notified(event: asyncio.Event, change, rounds: int = 20) -> int:
    """Make a change, wait up to a second for the notice, again until it comes (a GET stream opens in the
    background after the handshake, so the first changes may come before it listens); the rounds used."""
    for attempt in range(1, rounds + 1):
        await change(attempt)
        with anyio.move_on_after(1):
            await event.wait()
            return attempt
    raise AssertionError(f"no notice after {rounds} changes")


async def test_a_2025_client_hears_tool_list_changes_from_registrations_and_upstreams(
    federating: Gateway  # noqa: F811
) -> None:
    await listed(federating, {"local.grow"})
    changed = asyncio.Event()

    async def on_message(message) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    headers = {"Authorization": f"Bearer {federating.token('tools:*')}"}
    async with (httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(10, read=30)) as http,
                Client(streamable_http_client(federating.url, http_client=http), mode="legacy",
                       message_handler=on_message) as client):
        assert client.server_capabilities.tools.list_changed is True
        await _notified(changed, lambda n: register(federating, f"crm.added_{n}"))
        changed.clear()
        # The upstream adds a tool: the gateway hears of it (its notice, or its probe at the latest) and tells us.
        assert not (await client.call_tool("local.grow", {"name": "fresh"})).is_error
        with anyio.fail_after(20):
            await changed.wait()
        assert "local.fresh" in {t.name for t in (await client.list_tools()).tools}


async def test_a_2026_client_hears_tool_list_changes_on_its_listen_stream(gateway: Gateway) -> None:  # noqa: F811
    async with mcp_client(gateway, gateway.token("tools:*"), "auto") as client:
        assert client.server_capabilities.tools.list_changed is True
        async with client.listen(tools_list_changed=True) as subscription:
            await register(gateway, "crm.listened")
            with anyio.fail_after(10):
                event = await anext(aiter(subscription))
        assert type(event).__name__ == "ToolsListChanged"
        assert "crm.listened" in {t.name for t in (await client.list_tools()).tools}


async def test_the_endpoint_publishes_its_protected_resource_metadata_and_names_it_when_refusing(
    gateway: Gateway  # noqa: F811
) -> None:
    origin = gateway.url.removesuffix("/mcp")
    async with httpx2.AsyncClient(timeout=5) as http:
        refused = await http.post(gateway.url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                                  headers={"Accept": "application/json, text/event-stream"})
        challenge = refused.headers["www-authenticate"]
        assert refused.status_code == 401 and challenge.startswith("Bearer resource_metadata=")
        url = challenge.split('resource_metadata="', 1)[1].split('"', 1)[0]
        assert url == f"{origin}/.well-known/oauth-protected-resource/mcp"
        documents = [await http.get(u) for u in (url, f"{origin}/.well-known/oauth-protected-resource")]
        scoped = await http.post(gateway.url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                                 headers={"Authorization": f"Bearer {gateway.token('memory:read')}"})
    for document in documents:
        assert document.status_code == 200
        body = document.json()
        assert body["resource"] == gateway.url
        assert {"tools:read", "tools:call"} <= set(body["scopes_supported"])
        assert body["bearer_methods_supported"] == ["header"]
    assert scoped.status_code == 403 and f'resource_metadata="{url}"' in scoped.headers["www-authenticate"]


@pytest.mark.parametrize("mode", MODES)
async def test_upstream_resources_templates_and_prompts_are_federated(federating: Gateway, mode: str) -> None:  # noqa: F811
    await listed(federating, {"local.echo", "rm.echo"})
    async with mcp_client(federating, federating.token("tools:*"), mode) as client:
        with anyio.fail_after(30):  # both upstreams' catalogs are listed once they are up
            while {p.name for p in (await client.list_prompts()).prompts} < {"local.greet", "rm.greet"}:
                await anyio.sleep(0.1)
        resources = {str(r.uri) for r in (await client.list_resources()).resources}
        templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
        motd = await client.read_resource("fixture://motd")
        item = await client.read_resource("fixture://items/42")
        prompt = await client.get_prompt("rm.greet", {"name": "Ada"})
        tool_prompt = await client.get_prompt("rm.echo", {"task": "say hi"})  # the gateway's own, per tool
        with pytest.raises(MCPError) as missing:
            await client.read_resource("fixture://nothing-here")
    assert "fixture://motd" in resources and "mem://tool/rm.echo/guide" in resources
    assert {"fixture://items/{item_id}", "mem://step/{call_id}"} <= templates
    assert motd.contents[0].text == "Federated, and still itself."
    assert json.loads(item.contents[0].text) == {"item": "42"}
    assert prompt.messages[0].content.text == "Say hello to Ada."
    assert "say hi" in tool_prompt.messages[0].content.text
    assert missing.value.data["error_type"] == "not_found"


@pytest.mark.parametrize("mode", MODES)
async def test_an_upstream_s_image_reaches_the_mcp_client_as_an_image_and_grpc_callers_as_json(
    federating: Gateway, mode: str  # noqa: F811
) -> None:
    await listed(federating, {"rm.picture"})
    async with mcp_client(federating, federating.token("tools:*"), mode) as client:
        result = await client.call_tool("rm.picture", {})
    assert not result.is_error
    assert [block.type for block in result.content] == ["text", "image"]
    assert (result.content[1].mime_type, result.content[1].data[:8]) == ("image/png", "iVBORw0K")
    async with channel(federating.grpc, federating.token("tools:*")) as ch:
        reply = await tools_pb2_grpc.ToolGatewayStub(ch).CallTool(tools_pb2.CallToolRequest(name="rm.picture"),
                                                                  timeout=30)
    blocks = json_format.MessageToDict(reply.result)["content"]
    assert [b["type"] for b in blocks] == ["text", "image"] and blocks[1]["mimeType"] == "image/png"

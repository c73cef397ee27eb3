"""`mnemesh tools serve-stdio`: the gateway's MCP server over stdio, started by the official SDK's stdio
client as a local MCP client would, in front of real upstream MCP servers, in both protocol eras."""

from __future__ import annotations

import os
import subprocess
import sys

import anyio
import mcp_types as types
import pytest
from test_gateway_upstreams import federating, http_upstream, listed, tool_error  # noqa: F401 - fixtures
from test_mcp import MODES, Gateway, gateway, register  # noqa: F401 - fixtures
from mcp import Client, StdioServerParameters

from libs.config import Settings

pytestmark = pytest.mark.integration


def settings_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment that gives a child process these settings (MNEMESH_<FIELD>)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNEMESH_")}
    for name in ("redis_url", "database_url", "data_dir", "namespace", "tool_upstreams_file",
                 "outbox_poll_seconds", "tool_gateway_grpc_port", "mcp_http_port"):
        value = getattr(settings, name)
        if value is not None:
            env[f"MNEMESH_{name.upper()}"] = str(value)
    env["MNEMESH_JWT_SECRET"] = settings.jwt_secret.get_secret_value()
    env["MNEMESH_METRICS_ENABLED"] = "false"
    return {**env, **extra}


def stdio_params(gw: Gateway, token: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "mnemesh", "tools", "serve-stdio"],
                                 env=settings_env(gw.settings, MNEMESH_TOKEN=token))


@pytest.mark.parametrize("mode", MODES)
async def test_a_local_client_lists_and_calls_federated_tools_over_stdio_through_the_pipeline(
    federating: Gateway, mode: str  # noqa: F811
) -> None:
    await listed(federating, {"local.echo", "rm.echo"})  # the upstreams answer
    async with Client(stdio_params(federating, federating.token("tools:read", "tools:call")), mode=mode) as client:
        with anyio.fail_after(60):  # the stdio gateway connects its own upstreams (the same config file)
            while not {"local.echo", "rm.echo"} <= {t.name for t in (await client.list_tools()).tools}:
                await anyio.sleep(0.2)
        result = await client.call_tool("rm.echo", {"text": "over stdio", "times": 2})
        invalid = await client.call_tool("rm.echo", {"times": 2})
        missing = await client.call_tool("crm.nothing", {})
    assert (result.is_error, result.structured_content) == (False, {"echo": "over stdio over stdio"})
    assert tool_error(invalid)["error_type"] == "validation" and invalid.structured_content is None  # output schema
    assert tool_error(invalid)["field"].startswith("arguments")
    assert missing.structured_content["error_type"] == "not_found"  # no such tool: no output schema either


async def test_the_stdio_caller_is_the_token_s_principal_and_its_scopes_hold(federating: Gateway) -> None:  # noqa: F811
    await listed(federating, {"rm.echo"})
    async with Client(stdio_params(federating, federating.token("tools:read")), mode="legacy") as client:
        with anyio.fail_after(60):
            while "rm.echo" not in {t.name for t in (await client.list_tools()).tools}:
                await anyio.sleep(0.2)
        refused = await client.call_tool("rm.echo", {"text": "hi"})
    assert tool_error(refused)["error_type"] == "permission_denied"
    assert "tools:call" in tool_error(refused)["reason"]


@pytest.mark.parametrize(("token", "reason"), [("", "no token"), ("not-a-jwt", "token")])
async def test_serve_stdio_without_a_valid_token_exits_2_saying_why(
    gateway: Gateway, token: str, reason: str  # noqa: F811
) -> None:
    done = await anyio.run_process([sys.executable, "-m", "mnemesh", "tools", "serve-stdio"], check=False,
                                   env=settings_env(gateway.settings, MNEMESH_TOKEN=token), stdin=subprocess.DEVNULL)
    assert done.returncode == 2
    assert reason in done.stderr.decode() and done.stdout == b""


async def test_a_2025_stdio_client_hears_tool_list_changes_made_through_another_replica(
    federating: Gateway  # noqa: F811
) -> None:
    changed = [anyio.Event()]

    async def on_message(message) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed[0].set()

    params = stdio_params(federating, federating.token("tools:read", "tools:call"))
    async with Client(params, mode="legacy", message_handler=on_message) as client:
        assert client.server_capabilities.tools.list_changed is True
        with anyio.fail_after(60):  # its own upstreams connect first (a change it announces itself)
            while not {"local.echo", "rm.echo"} <= {t.name for t in (await client.list_tools()).tools}:
                await anyio.sleep(0.2)
        changed[0] = anyio.Event()
        for attempt in range(30):  # the stdio replica subscribes to the change channel as it starts
            await register(federating, f"crm.seen_over_stdio_{attempt}")  # through the HTTP replica's gRPC
            with anyio.move_on_after(1):
                await changed[0].wait()
                break
        assert changed[0].is_set()
        assert "crm.seen_over_stdio_0" in {t.name for t in (await client.list_tools()).tools}


async def test_serve_stdio_answers_once_its_upstreams_are_up_so_the_first_listing_has_their_tools(
    federating: Gateway  # noqa: F811
) -> None:
    """A local client lists the tools right after initialize (and may never list them again)."""
    await listed(federating, {"local.echo", "rm.echo"})
    async with Client(stdio_params(federating, federating.token("tools:read", "tools:call")), mode="legacy") as client:
        first = {t.name for t in (await client.list_tools()).tools}
        local = await client.call_tool("local.echo", {"text": "at once"})
        remote = await client.call_tool("rm.echo", {"text": "at once"})
    assert {"local.echo", "local.count", "rm.echo", "rm.count"} <= first
    assert (local.structured_content, remote.structured_content) == ({"echo": "at once"}, {"echo": "at once"})


async def test_over_stdio_every_progress_notification_of_a_call_arrives_before_its_result(
    federating: Gateway  # noqa: F811
) -> None:
    """The SDK client under the gateway runs each progress callback in a task nobody awaits: the gateway waits for
    its forwards before it answers (a stdio upstream)."""
    tool = "local.count"
    await listed(federating, {tool})
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    heard: list[list[float]] = []
    async with Client(stdio_params(federating, federating.token("tools:read", "tools:call")), mode="legacy") as client:
        for _ in range(5):
            seen.clear()
            result = await client.call_tool(tool, {"steps": 40}, progress_callback=on_progress)
            heard.append(list(seen))  # what had arrived when the result did
            assert result.structured_content == {"steps": 40}
    assert heard == [[float(step) for step in range(1, 41)]] * 5


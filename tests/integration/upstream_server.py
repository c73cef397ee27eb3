"""An upstream MCP server the gateway federates in tests, on the official SDK: stdio or Streamable HTTP.

    python upstream_server.py stdio
    python upstream_server.py http <port>
    python upstream_server.py https <port> <certificate file> <key file>

Tools: `echo` (structured), `route` (an argument mirrored in a header, 2026-07-28), `whoami` (its process id), `fail` (a tool error), `slow` (waits until
cancelled, reporting that it was through a marker file), `count` (reports progress once per step),
`grow` (adds a tool, announcing the change), `picture` (text and an image), `ask_llm` (sampling),
`ask_user` (elicitation), `chatty` (log messages), `touch` (a resource update; subscriptions are
recorded), and one with a name too long to expose as is; the resource
`fixture://motd`, the template `fixture://items/{item_id}` and the prompt `greet`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Annotated

import anyio
import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

server = MCPServer("upstream-fixture")
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="


@server.tool(structured_output=True)
def echo(text: str, times: int = 1) -> dict[str, str]:
    """Repeat the text."""
    return {"echo": " ".join([text] * times)}


@server.tool(structured_output=True)
def route(region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})], parcel: str) -> dict[str, str]:
    """Where a parcel goes. `region` is mirrored in an `Mcp-Param-Region` header on 2026-07-28, which the SDK
    checks against the argument before the tool runs (a call without it is refused)."""
    return {"region": region, "parcel": parcel}


@server.tool()
def whoami() -> dict[str, int]:
    """The process id of this server."""
    return {"pid": os.getpid()}


@server.tool()
def fail(reason: str) -> str:
    """Always fails, with the reason given."""
    raise ToolError(f"refused: {reason}")


@server.tool()
async def slow(marker: str) -> str:
    """Waits until cancelled; writes 'started' then 'cancelled' to the marker file."""
    Path(marker).write_text("started")
    try:
        await anyio.sleep_forever()
    finally:
        Path(marker).write_text("cancelled")
    return "never"


@server.tool()
async def count(steps: int, ctx: Context) -> dict[str, int]:
    """Reports progress once per step, then answers."""
    for step in range(1, steps + 1):
        await ctx.report_progress(step, steps, f"step {step} of {steps}")
    return {"steps": steps}


@server.tool()
async def grow(name: str, ctx: Context) -> dict[str, str]:
    """Adds a tool named `name` (it answers its own name) and announces the changed tool list."""
    server.add_tool(lambda: {"name": name}, name=name, description=f"Added at run time: {name}.")
    with contextlib.suppress(Exception):  # the 2026-07-28 revision has no unsolicited notification
        await ctx.session.send_tool_list_changed()
    return {"added": name}


@server.tool(name="a_tool_whose_name_is_much_too_long_to_be_exposed_under_a_prefix_as_it_is")
def long_name() -> dict[str, bool]:
    """A tool with a long name."""
    return {"ok": True}


@server.tool()
def picture() -> list[types.ContentBlock]:
    """A caption and a 1x1 PNG."""
    return [types.TextContent(text="a red dot"), types.ImageContent(data=PNG, mime_type="image/png")]


def _asked(ctx: Context, request: types.CreateMessageRequest | types.ElicitRequest):
    """2026-07-28: the answer from the retried call, or the input_required result asking for it."""
    answer = (ctx.input_responses or {}).get("ask")
    return answer if answer is not None else types.InputRequiredResult(input_requests={"ask": request})


@server.tool()
async def ask_llm(prompt: str, ctx: Context) -> dict[str, str]:
    """Asks the client's LLM (sampling) and answers what it said."""
    messages = [types.SamplingMessage(role="user", content=types.TextContent(text=prompt))]
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        result = _asked(ctx, types.CreateMessageRequest(
            params=types.CreateMessageRequestParams(messages=messages, max_tokens=50)))
        if isinstance(result, types.InputRequiredResult):
            return result  # type: ignore[return-value]
    else:
        result = await ctx.session.create_message(messages=messages, max_tokens=50, related_request_id=ctx.request_id)
    return {"said": getattr(result.content, "text", ""), "model": result.model}


@server.tool()
async def ask_user(question: str, ctx: Context) -> dict[str, str]:
    """Asks the user (form elicitation) for a name and answers the action and the name."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        result = _asked(ctx, types.ElicitRequest(params=types.ElicitRequestFormParams(
            message=question, requested_schema=schema)))
        if isinstance(result, types.InputRequiredResult):
            return result  # type: ignore[return-value]
    else:
        result = await ctx.request_context.session.elicit_form(question, schema, ctx.request_id)
    return {"action": result.action, "name": str((result.content or {}).get("name", ""))}


@server.tool()
async def chatty(ctx: Context) -> dict[str, bool]:
    """Logs one message at each of debug, info and warning while it runs."""
    await ctx.debug("chatty: debug")
    await ctx.info("chatty: info")
    await ctx.warning("chatty: warning")
    return {"done": True}


SUBSCRIBED: set[str] = set()


@server.tool()
async def touch(uri: str, ctx: Context) -> dict[str, list[str]]:
    """Announces that the resource `uri` changed (2025-era sessions: on the session's GET stream), and
    answers the URIs its client subscribed to."""
    with contextlib.suppress(Exception):  # 2026-07-28 has no unsolicited notification outside a listen stream
        await ctx.session.send_resource_updated(uri)
    return {"subscribed": sorted(SUBSCRIBED)}


async def _subscribe(ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
    SUBSCRIBED.add(str(params.uri))
    return types.EmptyResult()


async def _unsubscribe(ctx, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
    SUBSCRIBED.discard(str(params.uri))
    return types.EmptyResult()


server._lowlevel_server.add_request_handler(  # noqa: SLF001 - a fixture's own server
    "resources/subscribe", types.SubscribeRequestParams, _subscribe)
server._lowlevel_server.add_request_handler(  # noqa: SLF001
    "resources/unsubscribe", types.UnsubscribeRequestParams, _unsubscribe)


@server.resource("fixture://motd", name="motd", description="The message of the day.", mime_type="text/plain")
def motd() -> str:
    return "Federated, and still itself."


@server.resource("fixture://items/{item_id}", name="item", description="One item.", mime_type="application/json")
def item(item_id: str) -> str:
    return json.dumps({"item": item_id})


@server.prompt(description="Greets someone.")
def greet(name: str) -> str:
    return f"Say hello to {name}."


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    elif sys.argv[1] == "https":
        import uvicorn

        uvicorn.run(server.streamable_http_app(host="127.0.0.1"), host="127.0.0.1", port=int(sys.argv[2]),
                    ssl_certfile=sys.argv[3], ssl_keyfile=sys.argv[4], log_level="warning")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))

"""The MCP server the conformance suite's server scenarios expect (`npx @modelcontextprotocol/conformance
server`), on the official SDK, federated by the gateway (without a name prefix) in
`scripts/conformance.py`:

    python tests/conformance/fixture_server.py http <port>     # or: stdio

Tools, resources and prompts are named and shaped as the scenarios describe them. Its log messages,
sampling and elicitation requests ride the call's own stream (2025-11-25), or, on 2026-07-28, come as
`input_required` results, so that a gateway in front of it can relay them to the calling client.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys

import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer, UserMessage
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

server = MCPServer("conformance-fixture")

# A 1x1 red PNG and a 44-byte silent WAV header: the smallest valid media the scenarios accept.
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==")
WAV = base64.b64encode(b"RIFF$\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00D\xac\x00\x00\x88X\x01\x00"
                       b"\x02\x00\x10\x00data\x00\x00\x00\x00").decode()


@server.tool(description="Returns a simple text response.")
def test_simple_text() -> list[types.ContentBlock]:
    return [types.TextContent(text="This is a simple text response for testing.")]


@server.tool(description="Returns an image.")
def test_image_content() -> list[types.ContentBlock]:
    return [types.ImageContent(data=PNG, mime_type="image/png")]


@server.tool(description="Returns audio.")
def test_audio_content() -> list[types.ContentBlock]:
    return [types.AudioContent(data=WAV, mime_type="audio/wav")]


def _embedded() -> types.EmbeddedResource:
    return types.EmbeddedResource(resource=types.TextResourceContents(
        uri="test://embedded-resource", mime_type="text/plain", text="This is an embedded resource content."))


@server.tool(description="Returns an embedded resource.")
def test_embedded_resource() -> list[types.ContentBlock]:
    return [_embedded()]


@server.tool(description="Returns text, an image and an embedded resource.")
def test_multiple_content_types() -> list[types.ContentBlock]:
    return [types.TextContent(text="Multiple content types test:"), types.ImageContent(data=PNG, mime_type="image/png"),
            _embedded()]


@server.tool(description="Sends three log messages while it runs.")
async def test_tool_with_logging(ctx: Context) -> str:
    for text in ("Tool execution started", "Tool processing data", "Tool execution completed"):
        await ctx.info(text)
        await asyncio.sleep(0.05)
    return "Logging test completed"


@server.tool(description="Always fails.")
def test_error_handling() -> str:
    raise RuntimeError("This tool intentionally returns an error for testing")


@server.tool(description="Reports progress three times.")
async def test_tool_with_progress(ctx: Context) -> str:
    for step in (0, 50, 100):
        await ctx.report_progress(step, 100, f"progress {step}")
        await asyncio.sleep(0.05)
    return "Progress test completed"


def _modern(ctx: Context) -> bool:
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def _asked(ctx: Context, key: str, request: types.CreateMessageRequest | types.ElicitRequest):
    """2026-07-28 has no request mid-call: the answer to `request` from the retried call, or the
    InputRequiredResult that asks for it (the client answers and calls again)."""
    answer = (ctx.input_responses or {}).get(key)
    return answer if answer is not None else types.InputRequiredResult(input_requests={key: request})


@server.tool(description="Asks the client's LLM to answer a prompt.")
async def test_sampling(prompt: str, ctx: Context) -> str:
    messages = [types.SamplingMessage(role="user", content=types.TextContent(text=prompt))]
    if _modern(ctx):
        result = _asked(ctx, "sample", types.CreateMessageRequest(
            params=types.CreateMessageRequestParams(messages=messages, max_tokens=100)))
        if isinstance(result, types.InputRequiredResult):
            return result  # type: ignore[return-value] - the SDK passes it on as the 2026-07-28 wire wants
    else:  # on the call's own stream, where a gateway relays it to its caller
        result = await ctx.session.create_message(messages=messages, max_tokens=100, related_request_id=ctx.request_id)
    content = result.content
    return f"LLM response: {getattr(content, 'text', content)}"


async def _elicit(ctx: Context, message: str, schema: dict):
    if _modern(ctx):
        return _asked(ctx, "elicit", types.ElicitRequest(params=types.ElicitRequestFormParams(
            message=message, requested_schema=schema)))
    return await ctx.request_context.session.elicit_form(message, schema, ctx.request_id)


_CONTACT = {"type": "object", "properties": {"username": {"type": "string", "description": "User's response"},
                                             "email": {"type": "string", "description": "User's email address"}},
            "required": ["username", "email"]}


@server.tool(description="Asks the user for a username and an email.")
async def test_elicitation(message: str, ctx: Context) -> str:
    result = await _elicit(ctx, message, _CONTACT)
    if isinstance(result, types.InputRequiredResult):
        return result  # type: ignore[return-value]
    return f"User response: action={result.action}, content={json.dumps(result.content)}"


@server.tool(name="json_schema_2020_12_tool", description="Tool with JSON Schema 2020-12 features")
def json_schema_tool(name: str = "", address: dict | None = None) -> str:
    return json.dumps({"name": name, "address": address})


@server.resource("test://static-text", name="static-text", description="A static text resource.",
                 mime_type="text/plain")
def static_text() -> str:
    return "This is the content of the static text resource."


@server.resource("test://static-binary", name="static-binary", description="A static binary resource.",
                 mime_type="image/png")
def static_binary() -> bytes:
    return base64.b64decode(PNG)


@server.resource("test://watched-resource", name="watched-resource", description="A resource to subscribe to.",
                 mime_type="text/plain")
def watched_resource() -> str:
    return "Watched resource content."


@server.resource("test://template/{id}/data", name="template-data", description="Data for an id.",
                 mime_type="application/json")
def template_data(id: str) -> str:  # noqa: A002 - the template's parameter name
    return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})


@server.prompt(description="A simple prompt.")
def test_simple_prompt() -> str:
    return "This is a simple prompt for testing."


@server.prompt(description="A prompt with two arguments.")
def test_prompt_with_arguments(arg1: str, arg2: str) -> str:
    return f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"


@server.tool(description="Elicits every primitive type with a default (SEP-1034).")
async def test_elicitation_sep1034_defaults(ctx: Context) -> str:
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "default": "John Doe"}, "age": {"type": "integer", "default": 30},
        "score": {"type": "number", "default": 95.5},
        "status": {"type": "string", "enum": ["active", "inactive", "pending"], "default": "active"},
        "verified": {"type": "boolean", "default": True}}}
    result = await _elicit(ctx, "Please review your details", schema)
    if isinstance(result, types.InputRequiredResult):
        return result  # type: ignore[return-value]
    return f"Elicitation completed: action={result.action}, content={json.dumps(result.content)}"


@server.tool(description="Elicits the five enum variants (SEP-1330).")
async def test_elicitation_sep1330_enums(ctx: Context) -> str:
    schema = {"type": "object", "properties": {
        "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
        "titledSingle": {"type": "string", "oneOf": [{"const": "value1", "title": "First Option"},
                                                     {"const": "value2", "title": "Second Option"},
                                                     {"const": "value3", "title": "Third Option"}]},
        "legacyEnum": {"type": "string", "enum": ["opt1", "opt2", "opt3"],
                       "enumNames": ["Option One", "Option Two", "Option Three"]},
        "untitledMulti": {"type": "array", "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
        "titledMulti": {"type": "array", "items": {"anyOf": [{"const": "value1", "title": "First Choice"},
                                                             {"const": "value2", "title": "Second Choice"},
                                                             {"const": "value3", "title": "Third Choice"}]}}}}
    result = await _elicit(ctx, "Choose your options", schema)
    if isinstance(result, types.InputRequiredResult):
        return result  # type: ignore[return-value]
    return f"Elicitation completed: action={result.action}, content={json.dumps(result.content)}"


@server.prompt(description="A prompt embedding a resource.")
def test_prompt_with_embedded_resource(resourceUri: str) -> list[UserMessage]:  # noqa: N803 - the scenario's name
    return [UserMessage(content=types.EmbeddedResource(resource=types.TextResourceContents(
                uri=resourceUri, mime_type="text/plain", text="Embedded resource content for testing."))),
            UserMessage(content="Please process the embedded resource above.")]


@server.prompt(description="A prompt with an image.")
def test_prompt_with_image() -> list[UserMessage]:
    return [UserMessage(content=types.ImageContent(data=PNG, mime_type="image/png")),
            UserMessage(content="Please analyze the image above.")]


async def _empty(ctx, params) -> types.EmptyResult:
    return types.EmptyResult()


def _add_2025_handlers() -> None:
    """logging/setLevel and resources/(un)subscribe: gone from the 2026-07-28 revision, still in the scenarios."""
    lowlevel = server._lowlevel_server  # noqa: SLF001 - a fixture's own server
    lowlevel.add_request_handler("logging/setLevel", types.SetLevelRequestParams, _empty)
    lowlevel.add_request_handler("resources/subscribe", types.SubscribeRequestParams, _empty)
    lowlevel.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, _empty)


@server.completion()
async def complete(ref, argument, context) -> types.Completion:
    return types.Completion(values=[v for v in ("paris", "park", "party") if v.startswith(argument.value)])


def _patch_json_schema_tool() -> None:
    """The scenario checks that $schema, $defs and additionalProperties reach the listing unchanged."""
    tool = server._tool_manager.get_tool("json_schema_2020_12_tool")  # noqa: SLF001 - a fixture's own server
    tool.parameters = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                       "$defs": {"address": {"type": "object", "properties": {"street": {"type": "string"},
                                                                              "city": {"type": "string"}}}},
                       "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
                       "additionalProperties": False}


_patch_json_schema_tool()
_add_2025_handlers()

if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))

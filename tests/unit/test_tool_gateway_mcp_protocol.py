"""Stateless sessions, cancellation keys, the change bus, protected-resource metadata and media results,
through their ASGI surface or their functions (no network)."""

from __future__ import annotations

import anyio
from mcp.shared.subscriptions import PromptsListChanged, ResourceUpdated, ToolsListChanged

from libs.auth import Principal
from services.tool_gateway.adapters.broadcast import ChangeBus, RedisBroadcast
from services.tool_gateway.domain.content import media_blocks
from services.tool_gateway.entrypoints.mcp_auth import Caller
from services.tool_gateway.entrypoints.mcp_metadata import ProtectedResourceMetadata
from services.tool_gateway.entrypoints.mcp_sessions import InFlightCalls, StatelessSessions, cancel_key

ALICE = Principal(subject="alice", tenant_id="acme", scopes=frozenset({"tools:*"}))
MALLORY = Principal(subject="mallory", tenant_id="acme", scopes=frozenset({"tools:*"}))


async def call_asgi(app, method: str, headers: dict[str, str], message=None, principal: Principal | None = None):
    scope = {"type": "http", "method": method, "path": "/mcp", "scheme": "http", "server": ("127.0.0.1", 8765),
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    if message is not None:
        scope["mcp.message"] = message
    if principal is not None:
        scope["user"] = Caller(principal, "token")
    sent = []

    async def receive():
        await anyio.sleep_forever()

    async def send(msg):
        sent.append(msg)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], {k.decode(): v.decode() for k, v in start.get("headers", [])}


async def sdk(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b"{}"})


class Published:
    def __init__(self) -> None:
        self.messages: list[dict] = []

    async def publish(self, message: dict) -> None:
        self.messages.append(message)


async def test_initialize_answers_a_fresh_session_id_and_other_requests_pass_through_untouched() -> None:
    app = StatelessSessions(sdk, in_flight=InFlightCalls(), cancels=None, changes=None)
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    first = await call_asgi(app, "POST", {}, init)
    second = await call_asgi(app, "POST", {}, init)
    listed = await call_asgi(app, "POST", {"Mcp-Session-Id": "abc"}, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    assert first[0] == 200 and len(first[1]["mcp-session-id"]) == 32
    assert first[1]["mcp-session-id"] != second[1]["mcp-session-id"]
    assert "mcp-session-id" not in listed[1]


async def test_a_cancellation_cancels_only_the_same_caller_s_call_here_or_is_broadcast() -> None:
    in_flight, published = InFlightCalls(), Published()
    app = StatelessSessions(sdk, in_flight=in_flight, cancels=published, changes=None)
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}}
    with in_flight.track(cancel_key(ALICE, "s1", 7)) as scope:
        status, _ = await call_asgi(app, "POST", {"Mcp-Session-Id": "s1"}, cancel, MALLORY)
        assert status == 202 and not scope.cancel_called  # another caller's key: not this call
        assert published.messages == [{"key": cancel_key(MALLORY, "s1", 7)}]  # maybe another replica's
        await call_asgi(app, "POST", {"Mcp-Session-Id": "s1"}, cancel, ALICE)
        assert scope.cancel_called
        await anyio.sleep(0)
    assert scope.cancelled_caught and len(published.messages) == 1  # found here: not broadcast


async def test_a_get_stream_needs_a_session_and_delete_is_a_no_op() -> None:
    app = StatelessSessions(sdk, in_flight=InFlightCalls(), cancels=None, changes=None)
    assert (await call_asgi(app, "GET", {"Accept": "text/event-stream"}))[0] == 400
    assert (await call_asgi(app, "DELETE", {"Mcp-Session-Id": "s1"}))[0] == 204
    assert (await call_asgi(app, "DELETE", {}))[0] == 405
    assert (await call_asgi(app, "PUT", {}))[0] == 405


async def test_the_change_bus_encodes_every_event_kind_and_delivers_locally() -> None:
    async def no_redis():
        raise AssertionError("local delivery needs no Redis")

    bus = ChangeBus(RedisBroadcast(no_redis, "changes"))
    seen = []
    unsubscribe = bus.subscribe(seen.append)
    for event in (ToolsListChanged(), PromptsListChanged(), ResourceUpdated(uri="fixture://motd")):
        bus.publish_local(event)
    unsubscribe()
    bus.publish_local(ToolsListChanged())
    assert seen == [ToolsListChanged(), PromptsListChanged(), ResourceUpdated(uri="fixture://motd")]


def test_protected_resource_metadata_names_the_endpoint_from_the_request_or_the_setting() -> None:
    scope = {"type": "http", "scheme": "http", "headers": [(b"host", b"gw.example:8765")]}
    derived = ProtectedResourceMetadata("/mcp", scopes=("tools:read",))
    configured = ProtectedResourceMetadata("/mcp", resource_url="https://mcp.example.com/mcp",
                                           authorization_servers=("https://idp.example.com",))
    assert derived.document(scope)["resource"] == "http://gw.example:8765/mcp"
    assert "authorization_servers" not in derived.document(scope)
    assert derived.url_for(scope) == "http://gw.example:8765/.well-known/oauth-protected-resource/mcp"
    assert configured.document(scope)["resource"] == "https://mcp.example.com/mcp"
    assert configured.document(scope)["authorization_servers"] == ["https://idp.example.com"]
    assert configured.url_for(scope) == "https://mcp.example.com/.well-known/oauth-protected-resource/mcp"


def test_only_a_lone_list_of_content_blocks_is_taken_for_media() -> None:
    image = {"type": "image", "data": "AA==", "mimeType": "image/png"}
    assert media_blocks({"content": [image]}) == [image]
    assert media_blocks({"content": [image], "other": 1}) is None
    assert media_blocks({"content": [{"type": "spreadsheet"}]}) is None
    assert media_blocks({"content": "text"}) is None

"""Resource subscriptions and logging levels of a session, with fakes: the cap per session, an unsubscribe
that needs no upstream, a Redis that refuses a command (answered unavailable, or skipped where nobody waits),
and the upstream connection's own subscriptions (asked once per URI, capped)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError
from redis.exceptions import NoPermissionError, ResponseError

from libs.auth import Principal
from libs.errors import Unavailable, ValidationFailed
from services.tool_gateway.adapters import upstreams
from services.tool_gateway.adapters.upstreams import UpstreamManager, _Connection
from services.tool_gateway.domain.upstream import UpstreamConfig
from services.tool_gateway.entrypoints.mcp_relay import ClientRelay, LocalLogLevels, RelayAnswers
from services.tool_gateway.entrypoints.mcp_sessions import InFlightCalls, StatelessSessions
from services.tool_gateway.entrypoints.mcp_subscribe import MAX_PER_SESSION, LocalSubscribed, session_handlers

ALICE = Principal(subject="alice", tenant_id="acme", scopes=frozenset({"tools:*"}))
CTX = SimpleNamespace(request=None)  # stdio-like: the session is "local"


class Catalog:
    def serves(self, uri: str) -> bool:
        return uri.startswith("fixture://")


class Upstreams:
    def __init__(self, up: bool = True) -> None:
        self.up, self.asked = up, []

    def catalogs(self):
        return [("rm", Catalog(), ())] if self.up else []

    async def subscribe(self, upstream: str, uri: str) -> None:
        if not self.up:
            raise Unavailable("the upstream 'rm' is down")
        self.asked.append(uri)


class Refusing:
    """A Redis that refuses every command (an ACL, a full memory): not a transient error."""

    async def get(self, key: str):
        raise NoPermissionError("NOPERM")

    async def set(self, key: str, level: str) -> None:
        raise ResponseError("OOM command not allowed")

    async def add(self, key: str, uri: str, limit: int) -> bool:
        raise ResponseError("OOM command not allowed")

    async def remove(self, key: str, uri: str) -> None:
        raise NoPermissionError("NOPERM")

    async def has(self, key: str, uri: str) -> bool:
        raise NoPermissionError("NOPERM")


def handlers(upstream: Upstreams, subscribed: Any = None, levels: Any = None):
    found = session_handlers(lambda ctx: ALICE, levels or LocalLogLevels(), upstream,
                             LocalSubscribed() if subscribed is None else subscribed)
    return {method: handler for method, (_, handler) in found.items()}


def uri(text: str) -> SimpleNamespace:
    return SimpleNamespace(uri=text)


async def test_a_session_holds_at_most_its_cap_of_subscriptions_and_the_upstream_is_not_asked_past_it() -> None:
    upstream = Upstreams()
    h = handlers(upstream)
    for n in range(MAX_PER_SESSION):
        await h["resources/subscribe"](CTX, uri(f"fixture://items/{n}"))
    await h["resources/subscribe"](CTX, uri("fixture://items/0"))  # one it holds already: fine
    with pytest.raises(MCPError) as full:
        await h["resources/subscribe"](CTX, uri("fixture://one-more"))
    assert full.value.error.code == types.INVALID_PARAMS and full.value.error.data["field"] == "uri"
    assert "fixture://one-more" not in upstream.asked
    await h["resources/unsubscribe"](CTX, uri("fixture://items/0"))
    await h["resources/subscribe"](CTX, uri("fixture://one-more"))  # room again


async def test_an_unsubscribe_needs_no_upstream_and_a_refused_subscribe_keeps_nothing() -> None:
    upstream, subscribed = Upstreams(), LocalSubscribed()
    h = handlers(upstream, subscribed)
    await h["resources/subscribe"](CTX, uri("fixture://motd"))
    upstream.up = False
    await h["resources/unsubscribe"](CTX, uri("fixture://motd"))  # the upstream is down: still ends it
    assert subscribed._uris and not any(subscribed._uris.values())
    upstream.catalogs = lambda: [("rm", Catalog(), ())]  # listed, but its connection refuses
    with pytest.raises(MCPError):
        await h["resources/subscribe"](CTX, uri("fixture://motd"))
    assert not any(subscribed._uris.values())


async def test_a_redis_that_refuses_a_command_is_answered_unavailable() -> None:
    h = handlers(Upstreams(), Refusing(), Refusing())
    for method, params in (("logging/setLevel", SimpleNamespace(level="info")),
                           ("resources/subscribe", uri("fixture://motd")),
                           ("resources/unsubscribe", uri("fixture://motd"))):
        with pytest.raises(MCPError) as refused:
            await h[method](CTX, params)
        assert refused.value.error.data["error_type"] == "unavailable", method


async def test_a_refused_level_read_relays_every_level_and_a_refused_update_check_skips_the_update() -> None:
    sent: list[dict] = []

    async def emit(payload: dict) -> None:
        sent.append(payload)

    relay = ClientRelay(emit, RelayAnswers(), ALICE, "s1", Refusing(), 5)  # type: ignore[arg-type]
    await relay.log({"level": "debug", "data": "x"})
    assert [m["params"]["level"] for m in sent] == ["debug"]
    sessions = StatelessSessions(None, in_flight=InFlightCalls(), cancels=None, changes=None,  # type: ignore[arg-type]
                                 subscriptions=Refusing())
    frames: list[dict] = []

    async def send(message: dict) -> None:
        frames.append(message)

    await sessions._send_update(ALICE, "s1", "fixture://motd", send)  # the stream goes on
    assert frames == []


class _Subscribing:
    protocol_version = "2025-11-25"
    server_capabilities = types.ServerCapabilities(resources=types.ResourcesCapability(subscribe=True))

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def subscribe_resource(self, uri: str) -> None:
        self.asked.append(uri)


async def test_the_upstream_is_asked_once_per_uri_and_its_subscriptions_are_capped(monkeypatch) -> None:
    monkeypatch.setattr(upstreams, "MAX_SUBSCRIBED_PER_UPSTREAM", 3)
    manager = UpstreamManager()
    manager.connections["rm"] = conn = _Connection(UpstreamConfig(name="rm", url="http://127.0.0.1:9/mcp"))
    manager.status["rm"] = upstreams.UpstreamStatus(state="up")
    conn.client = client = _Subscribing()  # type: ignore[assignment]
    for text in ("fixture://a", "fixture://a", "fixture://b", "fixture://c"):
        await manager.subscribe("rm", text)
    assert client.asked == ["fixture://a", "fixture://b", "fixture://c"]
    with pytest.raises(ValidationFailed):
        await manager.subscribe("rm", "fixture://d")
    await manager.subscribe("rm", "fixture://b")  # held already: no error, no request
    assert client.asked == ["fixture://a", "fixture://b", "fixture://c"]


async def test_logging_and_subscriptions_are_announced_only_where_they_are_delivered() -> None:
    from gateway_fakes import fake_ports
    from mcp import Client

    from services.tool_gateway.entrypoints.mcp_server import build_server

    stdio_like = build_server(fake_ports(), ALICE, upstreams=Upstreams())  # no session state: nothing delivers
    async with Client(stdio_like) as client:
        caps = client.server_capabilities
    assert caps.logging is None and not (caps.resources and caps.resources.subscribe)
    http_like = build_server(fake_ports(), ALICE, upstreams=Upstreams(), levels=LocalLogLevels(),
                             subscribed=LocalSubscribed())
    async with Client(http_like, mode="legacy") as client:
        caps = client.server_capabilities
    assert caps.logging is not None and caps.resources is not None and caps.resources.subscribe


async def test_a_listen_stream_keeps_only_the_resource_uris_the_caller_may_read() -> None:
    from services.tool_gateway.entrypoints.mcp_subscribe import scoped_listen

    class Scoped(Upstreams):
        def catalogs(self):
            return [("hr", Catalog(), ("hr:read",))]

    heard: list[types.SubscriptionsListenRequestParams] = []

    async def listen(ctx, params):
        heard.append(params)
        return None

    outsider = Principal(subject="eve", tenant_id="acme", scopes=frozenset({"tools:read"}))
    insider = Principal(subject="hal", tenant_id="acme", scopes=frozenset({"tools:read", "hr:read"}))
    params = types.SubscriptionsListenRequestParams(notifications=types.SubscriptionFilter(
        tools_list_changed=True, resource_subscriptions=["fixture://salaries", "mem://tool/x"]))
    for who in (outsider, insider):
        await scoped_listen(listen, lambda ctx, who=who: who, Scoped())(CTX, params)
    assert heard[0].notifications.resource_subscriptions == ["mem://tool/x"]
    assert heard[0].notifications.tools_list_changed
    assert heard[1].notifications.resource_subscriptions == ["fixture://salaries", "mem://tool/x"]

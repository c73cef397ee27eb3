"""Messages to every gateway replica over Redis pub/sub: tool-list changes and cancellations.

Fire and forget, as both uses want: a replica that is not listening has no stream open and no
call running that a message could concern. `ChangeBus` is the SDK's `SubscriptionBus` seam
(`subscriptions/listen` streams on the 2026-07-28 wire) and feeds the 2025-era GET streams too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio
import redis.exceptions
from mcp.shared.subscriptions import (
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)

from libs.logs import get_logger

__all__ = ["ChangeBus", "RedisBroadcast", "TOOLS_CHANGED"]

log = get_logger(__name__)
# Prompts (one per tool) and resources (a guide per tool) follow the tools, so they change together.
TOOLS_CHANGED: tuple[ServerEvent, ...] = (ToolsListChanged(), PromptsListChanged(), ResourcesListChanged())
_KINDS: dict[str, ServerEvent] = {"tools": ToolsListChanged(), "prompts": PromptsListChanged(),
                                  "resources": ResourcesListChanged()}


class RedisBroadcast:
    """One Redis channel; `run` (a background task) hands what arrives to the local listeners."""

    def __init__(self, client: Callable[[], Awaitable[redis.asyncio.Redis]], channel: str, *,
                 retry_seconds: float = 1.0) -> None:
        self.client, self.channel, self.retry_seconds = client, channel, retry_seconds
        self._listeners: dict[object, Callable[[dict[str, Any]], None]] = {}

    async def publish(self, message: dict[str, Any]) -> None:
        await (await self.client()).publish(self.channel, json.dumps(message))

    def subscribe(self, listener: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
        token = object()
        self._listeners[token] = listener
        return lambda: self._listeners.pop(token, None)

    def deliver(self, message: dict[str, Any]) -> None:
        for listener in list(self._listeners.values()):
            try:
                listener(message)
            except Exception:  # noqa: BLE001 - one listener's fault must not starve the others
                log.exception("broadcast listener failed", channel=self.channel)

    async def run(self) -> None:
        while True:
            try:
                async with (await self.client()).pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(self.channel)
                    async for message in pubsub.listen():
                        if message.get("type") != "message":
                            continue
                        try:
                            decoded = json.loads(message["data"])
                        except ValueError:
                            log.warning("broadcast message is not JSON; dropped", channel=self.channel)
                            continue
                        if isinstance(decoded, dict):
                            self.deliver(decoded)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
                log.warning("broadcast channel lost; resubscribing", channel=self.channel, error=type(exc).__name__)
                await asyncio.sleep(self.retry_seconds)
            except redis.exceptions.ResponseError as exc:  # e.g. an ACL without this channel: say so, keep serving
                log.error("broadcast channel refused; replicas will not hear each other's changes and cancellations",
                          channel=self.channel, error=str(exc)[:200],
                          hint="allow PUBLISH and SUBSCRIBE on the channel (infra/redis/users.acl)")
                await asyncio.sleep(max(self.retry_seconds, 30.0))


def _encode(event: ServerEvent) -> dict[str, Any]:
    if isinstance(event, ResourceUpdated):
        return {"kind": "resource", "uri": event.uri}
    return {"kind": next(k for k, v in _KINDS.items() if type(v) is type(event))}


def _decode(message: dict[str, Any]) -> ServerEvent | None:
    if message.get("kind") == "resource" and isinstance(message.get("uri"), str):
        return ResourceUpdated(uri=message["uri"])
    return _KINDS.get(message.get("kind", ""))


class ChangeBus:
    """The SDK's SubscriptionBus over a RedisBroadcast: a change published on one replica reaches the
    listen streams and GET streams of every replica. `publish_local` is for what each replica learns
    by itself (its own upstream connections' tool lists)."""

    def __init__(self, broadcast: RedisBroadcast) -> None:
        self.broadcast = broadcast

    async def publish(self, event: ServerEvent) -> None:
        await self.broadcast.publish(_encode(event))

    def publish_local(self, event: ServerEvent) -> None:
        self.broadcast.deliver(_encode(event))

    def subscribe(self, listener: Callable[[ServerEvent], None]) -> Callable[[], None]:
        def on_message(message: dict[str, Any]) -> None:
            event = _decode(message)
            if event is not None:
                listener(event)

        return self.broadcast.subscribe(on_message)

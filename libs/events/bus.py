"""Redis Streams bus on FastStream: consumer groups, explicit acks, reclaim, dead letters.

Events travel as plain stream fields (see Envelope.to_fields), so any producer
can publish with a plain XADD. Each subscription runs two FastStream subscribers
in one consumer group:

- a reader (XREADGROUP '>') for new entries;
- a claimer (XAUTOCLAIM, ``min_idle_time``) that takes entries left pending by a
  consumer that died or failed, so they are retried elsewhere.

A consumer is named after its replica, not its process (`stable_consumer_name`), so a
restarted process finds the entries its previous life held: at start it makes them
claimable at once, and its claimer takes them back within a poll instead of waiting
``min_idle_time`` for them to look abandoned.

Acks are manual. An entry is acknowledged after its handler succeeded, or after
it went to the dead-letter stream ``<stream>.dead`` with its reason: at once when
it is malformed (retrying cannot help), after ``max_deliveries`` when its handler
keeps failing. Nothing kills the consumer.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import socket
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import hiredis
from faststream import AckPolicy
from faststream.redis import RedisBroker, RedisStreamMessage, StreamSub
from opentelemetry import metrics, trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from redis.asyncio import Redis
from redis.exceptions import NoScriptError, ResponseError

from libs.errors import DomainError
from libs.events.envelope import CREDENTIAL_FIELD, Envelope, MalformedEvent
from libs.events.schema import dead_letter_stream
from libs.logs import get_logger
from libs.telemetry import extract, tracer
from libs.transient import is_transient

__all__ = ["EventBus", "Fenced", "Handler", "stable_consumer_name"]

log = get_logger(__name__)
Handler = Callable[[Envelope], Awaitable[None]]
_FIELDS_KEY = b"__data__"


async def _fields_parser(msg: dict[str, Any], original: Callable[[dict[str, Any]], Awaitable[Any]]) -> Any:
    """Hand the entry's raw fields to FastStream as one JSON body, whatever bytes they hold.

    FastStream's own decoder chokes on non-UTF-8 values or on fields named
    ``data``/``headers``; a poison entry must still reach our handler to be
    dead-lettered, so we decode here and never let the parser fail.
    """
    raw: dict[bytes, bytes] = msg.get("data") or {}
    fields, undecodable = {}, []
    for key, value in raw.items():
        name = key.decode("utf-8", "replace")
        try:
            key.decode("utf-8")
            fields[name] = value.decode("utf-8")
        except UnicodeDecodeError:
            fields[name] = value.decode("utf-8", "replace")
            undecodable.append(name)
    body = json.dumps({"fields": fields, "undecodable": undecodable}).encode()
    return await original({**msg, "data": {_FIELDS_KEY: body}})


def _storable(value: str) -> str:
    """`value` as Redis can store it: a lone surrogate (a JSON escape such as \\ud800 decoded) cannot be
    encoded as UTF-8, so it is kept as its escape."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


# XADD only while the caller's term is not older than the fence (KEYS[2]); one atomic step.
_FENCED_XADD = """
local fence = tonumber(redis.call('GET', KEYS[2]) or '0')
if fence > tonumber(ARGV[1]) then return redis.error_reply('FENCED term ' .. ARGV[1] .. ' < ' .. fence) end
return redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2))
"""
# A batch of them in one script call (KEYS[1]: the fence; KEYS[2..]: the target streams; ARGV[1]: the term,
# then per entry its target's index in KEYS, its field count and its fields): the fence is checked once, and
# nothing runs between the XADDs of a script. Returns how many went.
_FENCED_XADDS = """
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
if fence > tonumber(ARGV[1]) then return redis.error_reply('FENCED term ' .. ARGV[1] .. ' < ' .. fence) end
local i, sent = 2, 0
while i <= #ARGV do
  local n = tonumber(ARGV[i + 1])
  redis.call('XADD', KEYS[tonumber(ARGV[i])], '*', unpack(ARGV, i + 2, i + 1 + n))
  i = i + 2 + n
  sent = sent + 1
end
return sent
"""
_RAISE_FENCE = """
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
if fence < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
return redis.call('GET', KEYS[1])
"""


async def _send_packed(client: Redis, command: tuple) -> Any:
    """Send `command` (str and int arguments) packed by hiredis in C, and read its reply: redis-py packs
    in Python, about 40 µs for an event's arguments where hiredis takes 5 (the same bytes)."""
    pool = client.connection_pool
    conn = await pool.get_connection()
    try:
        await conn.send_packed_command([hiredis.pack_command(command)])
        return await conn.read_response()
    except ResponseError:
        raise  # an error reply: the connection is fine
    except BaseException:
        await conn.disconnect()  # cut mid-command (cancelled, connection lost): not reused half-read
        raise
    finally:
        await pool.release(conn)


class Fenced(Exception):
    """A publish carried an older term than the fence: its publisher no longer leads."""


def stable_consumer_name(service: str, replica: str | None = None) -> str:
    """The consumer name of `service` on this replica: the same after a restart, different per replica.

    `replica` defaults to the host name, which is the pod name on Kubernetes and the container id
    under Docker: stable while that pod or container lives, unique among replicas. Two processes of
    one service on one host must pass distinct `replica` values.
    """
    replica = replica or socket.gethostname()
    return f"{service}-{re.sub(r'[^A-Za-z0-9_.-]', '_', replica)}"


def _entry_order(entry_id: bytes | str) -> tuple[int, int]:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


class EventBus:
    """Publish envelopes and subscribe handlers; one per service process."""

    def __init__(
        self,
        redis_url: str,
        *,
        consumer_name: str,
        max_deliveries: int = 5,
        min_idle_ms: int = 30_000,
        maxlen: int = 100_000,
        retention_ms: int = 86_400_000,
        namespace: str = "",
    ) -> None:
        self.broker = RedisBroker(redis_url, graceful_timeout=2.5, logger=logging.getLogger("mnemesh.bus"),
                                  log_level=logging.DEBUG)
        self.consumer_name = consumer_name
        self.max_deliveries = max_deliveries
        self.min_idle_ms = min_idle_ms
        self.maxlen, self.retention_ms = maxlen, retention_ms
        self.namespace = namespace
        meter = metrics.get_meter("mnemesh.bus")
        self._handled = meter.create_counter("stream_events_handled", description="events handled, by outcome")
        self._published = meter.create_counter("stream_events_published", description="events published")
        self._subscriptions: list[tuple[str, str]] = []
        self._streams: set[str] = set()  # Redis keys this bus published to or consumes

    def stream_name(self, stream: str) -> str:
        """The Redis key of a logical stream, in this bus's namespace."""
        return f"{self.namespace}.{stream}" if self.namespace else stream

    async def redis(self) -> Redis:
        return await self.broker.connect()

    async def raise_fence(self, key: str, term: int) -> None:
        """Refuse fenced publishes with a term below `term` from now on (never lowers the fence)."""
        await (await self.redis()).eval(_RAISE_FENCE, 1, key, term)

    async def publish(self, envelope: Envelope, stream: str | None = None,
                      fence: tuple[str, int] | None = None) -> str:
        """XADD the envelope to its stream (or `stream`); return the entry id.

        With `fence` (key, term), the XADD happens only if the term is not older than the
        fence at that key; Fenced otherwise.
        """
        target = self.stream_name(stream or envelope.stream)
        with tracer().start_as_current_span(f"publish {target}", kind=SpanKind.PRODUCER,
                                            context=extract({"traceparent": envelope.traceparent})) as span:
            span.set_attributes({"messaging.system": "redis", "messaging.destination.name": target,
                                 "mnemesh.event_type": envelope.event_type, "mnemesh.event_id": envelope.event_id})
            # No MAXLEN here: it would trim entries no group has read yet. trim() is safe.
            client = await self.redis()
            if fence is None:
                entry_id = await client.xadd(target, envelope.to_fields())
            else:
                flat = [item for pair in envelope.to_fields().items() for item in pair]
                try:
                    entry_id = await client.eval(_FENCED_XADD, 2, target, fence[0], fence[1], *flat)
                except ResponseError as exc:
                    if "FENCED" in str(exc):
                        raise Fenced(str(exc)) from None
                    raise
        self._published.add(1, {"stream": target})
        self._streams.add(target)
        return entry_id.decode() if isinstance(entry_id, bytes) else entry_id

    async def publish_fenced_batch(self, items: list[tuple[Envelope, str]], fence: tuple[str, int]) -> int:
        """XADD each (envelope, stream) in order, in one round trip, while `fence` allows; return how many went.

        One pipeline means one fsync for the batch under `appendfsync always` (Redis fsyncs once per
        event-loop turn), which is what makes durable publication affordable. The batch is one script call:
        the fence is checked once for all of it (nothing runs between a script's XADDs), and a fenced batch
        sends nothing (0).
        """
        if not items:
            return 0
        client = await self.redis()
        by_target: dict[str, list[Envelope]] = {}
        for envelope, stream in items:
            by_target.setdefault(self.stream_name(stream), []).append(envelope)
        # One span per target stream and batch, linked to the trace of each event it carries (the
        # OpenTelemetry messaging conventions for batch publishing), not a span per event.
        with contextlib.ExitStack() as spans:
            for target, envelopes in by_target.items():
                span = spans.enter_context(tracer().start_span(
                    f"publish {target}", kind=SpanKind.PRODUCER,
                    links=[Link(ctx) for e in envelopes if (ctx := _span_context(e.traceparent)) is not None]))
                span.set_attributes({"messaging.system": "redis", "messaging.destination.name": target,
                                     "messaging.batch.message_count": len(envelopes)})
            sent = await self._fenced_xadds(client, items, fence)
        for _, stream in items[:sent]:
            self._published.add(1, {"stream": self.stream_name(stream)})
            self._streams.add(self.stream_name(stream))
        return sent

    async def _fenced_xadds(self, client: Redis, items: list[tuple[Envelope, str]], fence: tuple[str, int]) -> int:
        """The fenced XADDs of the batch in one call of the script by its digest (EVALSHA): one command to
        pack and answer instead of one per event (redis-py packs commands in Python: per event, that was most
        of the relay's CPU). A Redis that lost its scripts (restarted, SCRIPT FLUSH) gets it again."""
        script = _FENCED_XADDS
        digest = hashlib.sha1(script.encode()).hexdigest()  # noqa: S324 - Redis names scripts by their SHA-1
        keys: dict[str, int] = {fence[0]: 1}
        args: list[object] = [fence[1]]
        for envelope, stream in items:
            fields = envelope.to_fields()
            args += (keys.setdefault(self.stream_name(stream), len(keys) + 1), len(fields) * 2)
            for pair in fields.items():
                args += pair
        for attempt in range(2):
            try:
                return int(await _send_packed(client, ("EVALSHA", digest, len(keys), *keys, *args)))
            except NoScriptError:
                if attempt:
                    raise
                await client.script_load(script)
            except ResponseError as exc:
                if "FENCED" in str(exc):
                    return 0
                raise
        return 0

    def subscribe(self, stream: str, group: str, handler: Handler) -> None:
        """Register `handler` for `stream` in consumer group `group`; call before start()."""
        stream = self.stream_name(stream)

        async def deliver(body: dict[str, Any], msg: RedisStreamMessage) -> None:
            await self._deliver(stream, group, handler, body, msg)

        for extra in ({}, {"min_idle_time": self.min_idle_ms}):
            sub = self.broker.subscriber(
                stream=StreamSub(stream, group=group, consumer=self.consumer_name, **extra),
                ack_policy=AckPolicy.MANUAL,
                parser=_fields_parser,
            )
            sub(deliver)
        self._subscriptions.append((stream, group))
        self._streams.add(stream)

    async def start(self) -> None:
        redis = await self.redis()
        for stream, group in self._subscriptions:
            # Create groups at the start of the stream, so events published before the
            # first consumer ever ran are still delivered.
            try:
                await redis.xgroup_create(stream, group, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            await self._take_back_own_pending(redis, stream, group)
        await self.broker.start()

    async def _take_back_own_pending(self, redis: Redis, stream: str, group: str) -> None:
        """Make the entries this consumer's previous process held claimable now.

        They were delivered to a process that is gone (a crash, a SIGKILL): nobody handles them,
        but they are young, so the claimer would wait ``min_idle_time`` for them. Re-claiming them
        with IDLE set to that time lets the claimer take them at its next poll. JUSTID leaves
        their delivery counts alone: the claimer's delivery is the one that counts.
        """
        start = "-"
        while True:
            pending = await redis.xpending_range(stream, group, min=start, max="+", count=100,
                                                 consumername=self.consumer_name)
            if not pending:
                return
            ids = [entry["message_id"] for entry in pending]
            await redis.xclaim(stream, group, self.consumer_name, min_idle_time=0, message_ids=ids,
                               idle=self.min_idle_ms, justid=True)
            log.info("taking back pending entries of a previous process", stream=stream, group=group,
                     consumer=self.consumer_name, entries=len(ids))
            if len(pending) < 100:
                return
            last = ids[-1].decode() if isinstance(ids[-1], bytes) else ids[-1]
            start = "(" + last

    async def stop(self) -> None:
        await self.broker.stop()

    async def trim(self) -> dict[str, int]:
        """Trim the streams this bus uses, never removing an entry someone may still need.

        Only streams longer than `maxlen` are trimmed, and only of entries that are older
        than `retention_ms` (a consumer group created later can still replay that window;
        beyond it, projections rebuild from PostgreSQL) and that every existing consumer
        group has read and acknowledged. Returns the entries removed per stream.
        """
        redis = await self.redis()
        removed = {}
        for stream in sorted(self._streams):
            if await redis.xlen(stream) <= self.maxlen:
                continue
            floor = f"{int(time.time() * 1000) - self.retention_ms}-0"
            for group in await redis.xinfo_groups(stream):
                needed = [group["last-delivered-id"]]
                pending = await redis.xpending(stream, group["name"])
                if pending["pending"]:
                    needed.append(pending["min"])
                floor = min([floor, *needed], key=_entry_order)
            removed[stream] = await redis.xtrim(stream, minid=floor, approximate=True)
        return removed

    async def prune_consumers(self, idle_ms: int = 3_600_000) -> int:
        """Remove consumers of this bus's groups that hold nothing and have been idle a long time
        (replicas that are gone, scaled-down pods; their names would pile up)."""
        redis = await self.redis()
        pruned = 0
        for stream, group in self._subscriptions:
            for consumer in await redis.xinfo_consumers(stream, group):
                name = consumer["name"].decode() if isinstance(consumer["name"], bytes) else consumer["name"]
                if name != self.consumer_name and consumer["pending"] == 0 and consumer["idle"] > idle_ms:
                    pruned += await redis.xgroup_delconsumer(stream, group, name) >= 0
        return pruned

    async def _deliver(
        self, stream: str, group: str, handler: Handler, body: dict[str, Any], msg: RedisStreamMessage
    ) -> None:
        entry_id = msg.raw_message["message_ids"][0]
        entry_id = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
        fields: dict[str, str] = body.get("fields", {})
        try:
            if body.get("undecodable"):
                raise MalformedEvent(field=body["undecodable"][0], reason="is not valid UTF-8",
                                     hint="publish every field as UTF-8 text")
            envelope = Envelope.from_fields(fields)
        except MalformedEvent as exc:
            await self.dead_letter(stream, fields, exc.to_dict(), group=group, entry_id=entry_id, deliveries=1)
            await msg.ack()
            return
        with tracer().start_as_current_span(
            f"consume {stream}", kind=SpanKind.CONSUMER, context=extract({"traceparent": envelope.traceparent})
        ) as span:
            span.set_attributes({"messaging.system": "redis", "messaging.destination.name": stream,
                                 "messaging.consumer.group.name": group, "messaging.message.id": entry_id,
                                 "mnemesh.event_type": envelope.event_type, "mnemesh.event_id": envelope.event_id})
            try:
                await handler(envelope)
            except Exception as exc:  # noqa: BLE001 - any handler failure is retried or dead-lettered, never fatal
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                await self._on_failure(stream, group, entry_id, fields, exc, msg)
                return
        await msg.ack()
        self._handled.add(1, {"stream": stream, "group": group, "outcome": "ok"})

    async def _on_failure(self, stream: str, group: str, entry_id: str, fields: dict[str, str], exc: Exception,
                          msg: RedisStreamMessage) -> None:
        deliveries = await msg.get_delivery_count()
        if is_transient(exc):
            # The event is fine; what it needs is away. It stays pending however long that takes.
            log.warning("event handler waits for its infrastructure", stream=stream, group=group,
                        entry_id=entry_id, deliveries=deliveries, error=str(exc))
            self._handled.add(1, {"stream": stream, "group": group, "outcome": "retry"})
            return
        # A non-retryable domain error means the event itself is wrong (e.g. a command that fails
        # validation): retrying cannot help, so it is dead-lettered at once.
        permanent = isinstance(exc, DomainError) and not exc.retryable
        if not permanent:
            log.exception("event handler failed", stream=stream, group=group, entry_id=entry_id,
                          deliveries=deliveries, max_deliveries=self.max_deliveries)
        if permanent or deliveries >= self.max_deliveries:
            reason = exc.to_dict() if isinstance(exc, DomainError) else {
                "error_type": type(exc).__name__, "field": "", "reason": str(exc) or repr(exc), "retryable": False,
                "hint": "fix the handler or the event, then replay it from the dead-letter stream"}
            await self.dead_letter(stream, fields, reason, group=group, entry_id=entry_id, deliveries=deliveries)
            await msg.ack()
        else:
            self._handled.add(1, {"stream": stream, "group": group, "outcome": "retry"})
            # Left pending: the claimer retries it after min_idle_time.

    async def dead_letter(self, stream: str, fields: dict[str, str], reason: dict[str, object], *, group: str = "",
                          entry_id: str = "", deliveries: int = 0) -> None:
        """Put an entry that cannot be handled on `<stream>.dead`, with its reason; `stream` is the Redis key."""
        dead = {
            # A producer's credential is not kept: a replay needs a fresh token anyway.
            **{f"original.{k}": "[redacted]" if k == CREDENTIAL_FIELD else v for k, v in fields.items()},
            "dead.stream": stream,
            "dead.entry_id": entry_id,
            "dead.group": group,
            "dead.deliveries": str(deliveries),
            "dead.failed_at": datetime.now(UTC).isoformat(),
            "dead.reason": json.dumps(reason, ensure_ascii=False),
        }
        # Never trimmed: a dead letter may be the only copy left, kept until someone replays or drops it.
        await (await self.redis()).xadd(dead_letter_stream(stream), {_storable(k): _storable(v)
                                                                     for k, v in dead.items()})
        self._handled.add(1, {"stream": stream, "group": group, "outcome": "dead_letter"})
        log.warning("event dead-lettered", stream=stream, group=group, entry_id=entry_id, **reason)


def _span_context(traceparent: str):
    if not traceparent:
        return None
    ctx = trace.get_current_span(extract({"traceparent": traceparent})).get_span_context()
    return ctx if ctx.is_valid else None

"""Consume a stream in batches: many entries, one transaction per tenant, one outcome per entry.

`EventBus.subscribe` hands its handler one entry at a time, which caps a writer at one
transaction (and a few round trips) per command. A `BatchConsumer` reads up to `batch_size`
entries with one XREADGROUP, admits each (libs/events/producers.py: event type of the stream,
producer credential on external streams), groups them by tenant and calls the batch handler
once per group inside one transaction acting as that tenant, with the processed-event rows of
the group (idempotency by event id, as `libs.idempotency.idempotent`: a redelivered entry is
acknowledged without a second effect).

The handler answers one outcome per envelope: None (done) or the exception of that entry, so one
bad command never fails its neighbours. After the commit: successes and duplicates are acked; a
non-retryable DomainError is dead-lettered at once; another failure stays pending and is
reclaimed (XAUTOCLAIM after `min_idle_ms`) until `max_deliveries`, then dead-lettered. A
transient failure of the whole transaction (PostgreSQL away) acks nothing: every entry stays
pending and comes back. Acks follow commits, so a process killed mid-batch loses nothing, and
the processed-event rows make the redelivery a no-op for what had committed.

Same consumer group and consumer name as the bus would use, so pending entries of a previous
process (same replica) are read back first at start.

With `in_flight` above 1, the consumer reads and admits the next batch while earlier ones are still in
their transactions (a writer otherwise idles through every round trip of a commit). Entries that share
an order key (`order_key`, per tenant: e.g. the user a command is for) are still handled in stream
order: a batch holding a key of a batch still in flight waits for that batch to finish before it starts.

Across replicas (consumers of one group) the same order holds: before an entry is handled, the group's
pending list says which earlier entries other consumers still hold, and an entry whose key one of them
shares is parked until that one is settled. An entry this consumer handled and left pending (it failed and
waits to be retried) holds its key's later entries back the same way, here too, until it is settled (or
another consumer takes it). Which earlier entries are unsettled is batch_order.KeyOrder's to say. Entries
are delivered in stream order, so an earlier entry is either settled or pending somewhere; the earliest
unsettled entry of a key is never parked, so the parked always move on. An entry pending elsewhere for `min_idle_ms` or more (its consumer dead, or its
failure waiting to be retried) is reclaimed at once and handled before the entries it held back. The
consumer keeps the entries it holds (in flight, waiting to start, or parked) fresh in the pending list,
so no other replica reclaims them while they wait or commit; it stops reading while `batch_size` ×
`in_flight` entries are parked, and released entries still go in batches of at most `batch_size`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass

import asyncpg
from opentelemetry import metrics, trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from redis.exceptions import ResponseError

from libs.auth import Principal, TokenVerifier
from libs.db import ALL_TENANTS, Database
from libs.errors import DomainError, Unauthenticated, Unavailable
from libs.events.batch_order import KeyOrder, position, readable, text
from libs.events.bus import EventBus
from libs.events.envelope import Envelope, MalformedEvent
from libs.events.producers import admit
from libs.logs import get_logger
from libs.telemetry import extract, tracer
from libs.transient import is_transient

__all__ = ["BatchConsumer", "BatchHandler"]

log = get_logger(__name__)

# (tenant id, envelopes of that tenant, the transaction's connection) -> one outcome per envelope.
BatchHandler = Callable[[str, list[Envelope], asyncpg.Connection], Awaitable[Sequence[BaseException | None]]]

# Per tenant (a row from before tenants were kept, tenant_id '', counts for every tenant): libs/idempotency.py.
_MARK_PROCESSED = ("WITH marked AS (INSERT INTO processed_events (consumer, tenant_id, event_id)"
                   " SELECT $1, $3, e FROM unnest($2::uuid[]) AS e WHERE NOT EXISTS (SELECT 1 FROM processed_events p"
                   " WHERE p.consumer = $1 AND p.tenant_id = '' AND p.event_id = e)"
                   " ON CONFLICT DO NOTHING RETURNING event_id::text AS id)"
                   " SELECT coalesce(array_agg(id), '{}') FROM marked")
_UNMARK = "DELETE FROM processed_events WHERE consumer = $1 AND tenant_id = $3 AND event_id = ANY($2::uuid[])"


@dataclass
class _Entry:
    entry_id: str
    fields: dict[str, str]
    envelope: Envelope | None = None
    order: Hashable = None  # (tenant id, order key) once admitted by a consumer with an order_key


# Reset the idle time of the entries (ARGV[3:]) that this consumer (ARGV[2]) of the group (ARGV[1]) still
# owns; answer those another consumer owns now. In one script: nothing runs between the check and the claim.
_TOUCH = """
local lost = {}
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if p[1] then
    if p[1][2] == ARGV[2] then
      redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    else
      table.insert(lost, ARGV[i])
    end
  end
end
return lost
"""


class _VerifiedOnce:
    """The consumer's TokenVerifier for one batch: each distinct credential is verified once (a producer's
    entries carry the same token), its outcome, principal or refusal, reused for the batch's other entries."""

    def __init__(self, verifier: TokenVerifier) -> None:
        self.verifier, self.fetches_keys = verifier, verifier.fetches_keys
        self._outcomes: dict[str | None, Principal | Unauthenticated] = {}

    def verify(self, token: str | None) -> Principal:
        if token not in self._outcomes:
            try:
                self._outcomes[token] = self.verifier.verify(token)
            except Unauthenticated as exc:
                self._outcomes[token] = exc
        outcome = self._outcomes[token]
        if isinstance(outcome, Unauthenticated):
            raise Unauthenticated(outcome.reason, field=outcome.field, hint=outcome.hint)
        return outcome


class BatchConsumer:
    def __init__(self, bus: EventBus, db: Database, stream: str, group: str, handler: BatchHandler,
                 verifier: TokenVerifier | None, *, batch_size: int = 200, block_ms: int = 500,
                 delete_handled: bool = False,
                 scrub: Callable[[dict[str, str]], dict[str, str]] | None = None,
                 scrub_reason: Callable[[str], str] | None = None,
                 in_flight: int = 1, order_key: Callable[[Envelope], Hashable] | None = None) -> None:
        """`delete_handled`: XDEL entries once acknowledged (a command stream whose entries may hold data
        that must not outlive its handling); `scrub`: what a dead-lettered entry's fields keep, and
        `scrub_reason` what of its reason's text (a parser's message may quote what was sent);
        `in_flight`: batches handled at once, entries of one tenant and `order_key` (called on admitted
        envelopes only) in stream order."""
        if in_flight < 1 or (in_flight > 1 and order_key is None):
            raise ValueError("in_flight must be 1, or more with an order_key that says which entries keep their order")
        self.delete_handled, self.scrub, self.scrub_reason = delete_handled, scrub, scrub_reason
        self.in_flight, self.order_key = in_flight, order_key
        self._batches: dict[asyncio.Task, frozenset] = {}  # in flight: the batch's task -> its order keys
        self._entry_ids: set[str] = set()  # the entries of those batches
        self._parked: list[_Entry] = []  # waiting for an earlier entry of their key (another consumer's, or ours
        # awaiting its retry)
        self._next_touch = self._next_claim = 0.0
        self.bus, self.db, self.stream, self.group = bus, db, stream, group
        self.handler, self.verifier = handler, verifier
        self.batch_size, self.block_ms = batch_size, block_ms
        self.key = bus.stream_name(stream)
        self.consumer = bus.consumer_name
        # Which earlier entries of a key are still unsettled: other consumers', and ours waiting to be retried.
        self._order = KeyOrder(bus, self.key, group, self.consumer, order_key) if order_key is not None else None
        self.ready = asyncio.Event()  # the group exists and reading has begun (tests wait on it)
        meter = metrics.get_meter("mnemesh.batches")
        self._handled = meter.create_counter("stream_events_handled", description="events handled, by outcome")
        self._batch_size = meter.create_histogram("stream_batch_size", description="entries per batch read")

    async def run(self) -> None:
        """Consume until cancelled. Redis going away is waited out (with a capped backoff), never fatal:
        nothing is acknowledged that was not committed, so whatever was in flight comes back."""
        delay = 0.1
        while True:
            try:
                await self._consume()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - transient: wait and resume; anything else ends the task
                if not is_transient(exc):
                    raise
                log.warning("batch consumer waits for Redis", stream=self.key, error=str(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            else:
                delay = 0.1

    async def _consume(self) -> None:
        try:
            await self._read()
        finally:  # whatever is in flight and uncommitted stays pending and comes back
            for task in self._batches:
                task.cancel()
            for outcome in await asyncio.gather(*self._batches, return_exceptions=True):
                if isinstance(outcome, Exception):  # not lost behind the error that ended the reading
                    log.error("a batch in flight failed", stream=self.key, exc_info=outcome)
            self._batches.clear()
            self._entry_ids.clear()
            self._parked.clear()  # still pending here: read back, in stream order, when reading resumes
            if self._order is not None:
                self._order.reset()

    async def _read(self) -> None:
        redis = await self.bus.redis()
        try:
            await redis.xgroup_create(self.key, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        # First what this consumer held in a previous life (a crash, a SIGKILL mid-batch).
        own = await redis.xreadgroup(self.group, self.consumer, {self.key: "0"}, count=10_000)
        self.ready.set()
        if own and own[0][1]:
            log.info("taking back pending entries of a previous process", stream=self.key, entries=len(own[0][1]))
            for start in range(0, len(own[0][1]), self.batch_size):
                await self._dispatch(own[0][1][start:start + self.batch_size])
        while True:
            await self._touch()
            if time.monotonic() >= self._next_claim:  # entries left pending by failures or dead consumers
                self._next_claim = time.monotonic() + self.bus.min_idle_ms / 2000
                # JUSTID claims without counting a delivery: an entry of a batch of ours still in flight (a
                # commit slower than min_idle_ms) or parked is left where it is, its delivery count untouched.
                ids = await redis.xautoclaim(self.key, self.group, self.consumer, self.bus.min_idle_ms, "0-0",
                                             count=self.batch_size, justid=True)  # (redis-py: the ids alone)
                held = self._held()
                ids = [text(i) for i in ids if text(i) not in held]
                claimed = await redis.xclaim(self.key, self.group, self.consumer, 0, ids) if ids else []
                # An entry deleted while pending: Redis 6.2 (embedded) answers (None, None) for it and keeps it
                # pending (Redis 7 dropped it already); nothing is left to handle.
                claimed = [(i, fields) for i, fields in claimed if i is not None]
                deleted = set(ids) - {text(i) for i, _ in claimed}
                if deleted:
                    await redis.xack(self.key, self.group, *deleted)
                if claimed:  # (XCLAIM counted these deliveries)
                    await self._dispatch(claimed)
            if len(self._parked) >= self.batch_size * self.in_flight:  # enough waiting: read no more meanwhile
                await asyncio.sleep(0.02)
                self._reap()
                await self._start([])
                continue
            # Parked entries are looked at again soon: what holds them back is usually one commit away. What
            # this consumer holds is refreshed often enough however long reading may block.
            block = min(self.block_ms, 20) if self._parked else self.block_ms
            read = await redis.xreadgroup(self.group, self.consumer, {self.key: ">"}, count=self.batch_size,
                                          block=min(block, max(1, self.bus.min_idle_ms // 4)) if self._entry_ids
                                          else block)
            self._reap()
            if read and read[0][1]:
                await self._dispatch(read[0][1])
            elif self._parked:
                await self._start([])

    def _held(self) -> set[str]:
        """The entries this consumer holds: in flight (or waiting to start), or parked."""
        return self._entry_ids | {e.entry_id for e in self._parked}

    async def _touch(self) -> None:
        """Every min_idle_ms / 4, reset the idle time of the entries this consumer holds and still owns (no
        delivery counted), so no other replica takes them for abandoned while they wait or commit. A parked
        entry another replica took after all (a stalled loop) is its own now: it leaves the parked."""
        if time.monotonic() < self._next_touch:
            return
        self._next_touch = time.monotonic() + self.bus.min_idle_ms / 4000
        held = self._held()
        if held:
            redis = await self.bus.redis()
            lost = {text(i) for i in await redis.eval(_TOUCH, 1, self.key, self.group, self.consumer, *sorted(held))}
            if lost:
                self._parked = [e for e in self._parked if e.entry_id not in lost]

    async def _dispatch(self, raw: list) -> None:
        """Handle a batch now (no order key), or start it once it may run beside the batches in flight."""
        if self.order_key is None:
            await self.handle(raw)
            return
        admitted, done = await self._admit(raw)
        entries = []
        for entry in admitted:
            try:
                entry.order = (entry.envelope.tenant_id, self.order_key(entry.envelope))
            except DomainError as exc:  # e.g. a payload that does not parse, on a stream that admits it unread
                await self._dead_letter(entry, exc, 1)
                done.append(entry.entry_id)
            else:
                entries.append(entry)
        if done:  # settled at admission: acknowledged now, whatever happens to the batch
            await self._ack(done)
        await self._start(entries)

    async def _start(self, entries: list[_Entry]) -> None:
        """Park the entries an unsettled earlier entry of their key keeps back (another consumer's, or ours
        awaiting its retry; with the parked before them, in stream order); start the rest as a batch once no
        batch in flight shares a key with it and there is room."""
        if self._parked:
            entries = sorted(self._parked + entries, key=lambda e: position(e.entry_id))
            self._parked = []
        if not entries:
            return
        first_held = await self._order.first_unsettled(entries, self._held())
        if self._order.reclaim_now:  # one holding an entry back looks abandoned: reclaimed in the next round
            self._order.reclaim_now, self._next_claim = False, 0.0
        ready = []
        for entry in entries:
            earlier = first_held.get(entry.order)
            (self._parked if earlier is not None and earlier < position(entry.entry_id) else ready).append(entry)
        for start in range(0, len(ready), self.batch_size):
            await self._launch(ready[start:start + self.batch_size])

    async def _launch(self, batch: list[_Entry]) -> None:
        """Start a batch once no batch in flight shares a key with it and there is room; held (and so
        refreshed) from now on."""
        keys, ids = {entry.order for entry in batch}, {e.entry_id for e in batch}
        self._entry_ids |= ids
        while True:
            self._reap()
            earlier_batches = [task for task, held in self._batches.items() if not keys.isdisjoint(held)]
            if not earlier_batches and len(self._batches) < self.in_flight:
                break
            await asyncio.wait(earlier_batches or self._batches, timeout=self.bus.min_idle_ms / 4000,
                               return_when=asyncio.FIRST_COMPLETED)
            await self._touch()
        if self._order.retrying:  # a batch of these keys that ended since they were looked at left one to retry
            first = self._order.first_retrying()
            back = {e.entry_id for e in batch if e.order in first and first[e.order] < position(e.entry_id)}
            if back:
                self._parked += [e for e in batch if e.entry_id in back]
                self._entry_ids -= back
                batch = [e for e in batch if e.entry_id not in back]
                keys, ids = {entry.order for entry in batch}, ids - back
                if not batch:
                    return
        task = asyncio.create_task(self._commit(batch, []))
        task.add_done_callback(lambda _: self._entry_ids.difference_update(ids))
        self._batches[task] = keys

    def _reap(self) -> None:
        """Forget the batches that finished; a failure of one (Redis away) is raised here, to `run`."""
        for task in [t for t in self._batches if t.done()]:
            del self._batches[task]
            task.result()

    async def handle(self, raw: list) -> None:
        """Handle entries as XREADGROUP returns them: [(entry id, {field: value} or None), ...]."""
        await self._commit(*await self._admit(raw))

    async def _admit(self, raw: list) -> tuple[list[_Entry], list[str]]:
        """The entries to handle, and the ids already settled (trimmed, or dead-lettered at admission)."""
        entries, done = [], []
        verifier = _VerifiedOnce(self.verifier) if self.verifier is not None else None
        for entry_id, fields in raw:
            if fields is None:  # trimmed while pending: nothing left to handle
                done.append(text(entry_id))
                continue
            entry = _Entry(text(entry_id), {})
            try:
                entry.fields = {text(k): v.decode("utf-8") if isinstance(v, bytes) else v for k, v in fields.items()}
            except UnicodeDecodeError:  # kept as far as it reads, for the dead letter
                entry.fields = {readable(k): readable(v) for k, v in fields.items()}
                await self._dead_letter(entry, MalformedEvent(field="fields", reason="are not valid UTF-8",
                                                              hint="publish every field as UTF-8 text"), 1)
                done.append(entry.entry_id)
                continue
            try:
                entry.envelope = Envelope.from_fields(entry.fields)
                if entry.envelope.tenant_id == ALL_TENANTS:
                    raise MalformedEvent(field="tenant_id", reason=f"{ALL_TENANTS!r} names no tenant",
                                         hint="publish with the tenant id of your token")
                await admit(self.stream, entry.envelope, verifier)
            except Unavailable as exc:  # what admits entries is away (the signing keys): this read waits, pending
                if done:
                    await self._ack(done)
                raise ConnectionError(f"entries cannot be admitted now: {exc.reason}") from exc
            except DomainError as exc:
                await self._dead_letter(entry, exc, 1)
                done.append(entry.entry_id)
                continue
            entries.append(entry)
        self._batch_size.record(len(raw), {"stream": self.key})
        return entries, done

    async def _commit(self, entries: list[_Entry], done: list[str]) -> None:
        """Run the handler per tenant, then acknowledge what committed or was settled; with an order key, what
        is left pending to be retried holds back its key's later entries (noted before this batch counts as
        ended)."""
        by_tenant: dict[str, list[_Entry]] = {}
        for entry in entries:
            by_tenant.setdefault(entry.envelope.tenant_id, []).append(entry)
        for tenant_id, group in by_tenant.items():
            done += await self._handle_tenant(tenant_id, group)
        await self._ack(done)
        if self._order is not None:
            self._order.note(entries, set(done))

    async def _ack(self, ids: list[str]) -> None:
        if not ids:
            return
        redis = await self.bus.redis()
        if self.delete_handled:  # both in one round trip
            pipe = redis.pipeline(transaction=False)
            pipe.xack(self.key, self.group, *ids)
            pipe.xdel(self.key, *ids)
            await pipe.execute()
        else:
            await redis.xack(self.key, self.group, *ids)

    async def _handle_tenant(self, tenant_id: str, entries: list[_Entry]) -> list[str]:
        """Run the handler for one tenant's entries; return the entry ids to acknowledge."""
        links = [Link(ctx) for e in entries
                 if (ctx := _span_context(e.envelope.traceparent)) is not None]
        with tracer().start_as_current_span(f"consume {self.key}", kind=SpanKind.CONSUMER, links=links) as span:
            span.set_attributes({"messaging.system": "redis", "messaging.destination.name": self.key,
                                 "messaging.consumer.group.name": self.group,
                                 "messaging.batch.message_count": len(entries)})
            failures: dict[int, BaseException] = {}
            try:
                async with self.db.transaction(tenant_id) as conn:
                    first = set(await conn.fetchval(_MARK_PROCESSED, self.group,
                                                    [e.envelope.event_id for e in entries], tenant_id))
                    fresh = []
                    for i, entry in enumerate(entries):
                        if entry.envelope.event_id in first:
                            first.discard(entry.envelope.event_id)  # a second copy in one batch is a duplicate
                            fresh.append(i)
                    outcomes = await self.handler(tenant_id, [entries[i].envelope for i in fresh], conn) \
                        if fresh else []
                    failures = {i: exc for i, exc in zip(fresh, outcomes, strict=True) if exc is not None}
                    if failures:  # not done: a retry, or a replay from the dead letters, may apply them
                        await conn.execute(_UNMARK, self.group, [entries[i].envelope.event_id for i in failures],
                                           tenant_id)
            except Exception as exc:  # noqa: BLE001 - classified below: retried, or each entry's failure
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                if is_transient(exc):
                    log.warning("batch waits for its infrastructure", stream=self.key, entries=len(entries),
                                error=str(exc))
                    self._handled.add(len(entries), {"stream": self.key, "group": self.group, "outcome": "retry"})
                    return []
                log.exception("batch handler failed", stream=self.key, entries=len(entries))
                failures = dict.fromkeys(range(len(entries)), exc)
        ok = [e.entry_id for i, e in enumerate(entries) if i not in failures]
        self._handled.add(len(ok), {"stream": self.key, "group": self.group, "outcome": "ok"})
        return ok + await self._settle(entries, failures)

    async def _settle(self, entries: list[_Entry], failures: dict[int, BaseException]) -> list[str]:
        """Dead-letter what can never succeed; leave the rest pending. Returns the ids dead-lettered."""
        settled = []
        for i, exc in failures.items():
            entry = entries[i]
            if isinstance(exc, DomainError) and not exc.retryable:
                await self._dead_letter(entry, exc, 1)
                settled.append(entry.entry_id)
                continue
            pending = await (await self.bus.redis()).xpending_range(self.key, self.group, min=entry.entry_id,
                                                                    max=entry.entry_id, count=1)
            deliveries = pending[0]["times_delivered"] if pending else 1
            if deliveries >= self.bus.max_deliveries:
                await self._dead_letter(entry, exc, deliveries)
                settled.append(entry.entry_id)
            else:
                self._handled.add(1, {"stream": self.key, "group": self.group, "outcome": "retry"})
        return settled

    async def _dead_letter(self, entry: _Entry, exc: BaseException, deliveries: int) -> None:
        reason = exc.to_dict() if isinstance(exc, DomainError) else {
            "error_type": type(exc).__name__, "field": "", "reason": str(exc) or repr(exc), "retryable": False,
            "hint": "fix the handler or the event, then replay it from the dead-letter stream"}
        try:
            fields = self.scrub(entry.fields) if self.scrub else entry.fields
            if self.scrub_reason:
                reason = {k: self.scrub_reason(v) if isinstance(v, str) else v for k, v in reason.items()}
        except Exception as failure:  # noqa: BLE001 - what could not be scrubbed is not kept; the consumer goes on
            log.exception("dead letter not scrubbed", stream=self.key, entry_id=entry.entry_id)
            fields = {name: entry.fields[name] for name in ("event_id", "event_type", "tenant_id")
                      if name in entry.fields} | {"not_kept": f"the fields could not be scrubbed ({type(failure).__name__})"}
            reason = {"error_type": str(reason.get("error_type", "")), "field": str(reason.get("field", "")),
                      "reason": "[not kept: could not be scrubbed]", "retryable": False, "hint": ""}
        await self.bus.dead_letter(self.key, fields, reason, group=self.group, entry_id=entry.entry_id,
                                   deliveries=deliveries)


def _span_context(traceparent: str):
    if not traceparent:
        return None
    ctx = trace.get_current_span(extract({"traceparent": traceparent})).get_span_context()
    return ctx if ctx.is_valid else None

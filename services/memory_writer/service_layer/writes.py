"""The write pipeline: one write, or a batch of writes (corrections and confirmations: corrections.py).

Every write goes through `_write_in` inside a unit of work: validation (fields, entity format
by key or the tenant's schema, the level the source may claim), idempotency, the confidence
rules of its entity key, then the row and its events. A batch is one unit (one transaction):
each write's domain errors are its own; a failure after a write touched the database (an
integrity error, a conflict) makes the batch run again with one savepoint per write, so the
failing write alone is undone and reported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from libs.errors import Conflict, DomainError, IdempotencyKeyReused, ValidationFailed
from libs.eventstore import ANY_VERSION
from libs.logs import get_logger
from libs.transient import is_transient
from services.memory_writer.domain import (
    Confidence,
    MemoryCorrected,
    MemoryMerged,
    MemoryQuarantined,
    MemoryRecord,
    MemoryWritten,
    Source,
    Status,
    WriteMemory,
    WriteResult,
    WriteStatus,
    decide,
    new_memory,
    normalized,
)
from services.memory_writer.domain.guard import Signals, assess
from services.memory_writer.domain.policy import DEFAULT_POLICY, WritePolicy
from services.memory_writer.domain.similarity import (
    NEAR_THRESHOLD,
    bands,
    content_digest,
    lsh_keys,
    minhash,
    minhash_many,
    similarity,
)
from services.memory_writer.service_layer.unit_of_work import Lookups, UnitOfWork

__all__ = ["WritePolicy", "tenant_rules", "write_batch", "write_memory"]

MAX_BATCH = 500
log = get_logger(__name__)
Outcome = WriteResult | BaseException


class _AfterWrite(Exception):
    """A write failed after it touched the database: the unit must be undone, or the write isolated."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _owned(cmd: WriteMemory, tenant_id: str) -> WriteMemory:
    if tenant_id:
        if cmd.tenant_id and cmd.tenant_id != tenant_id:
            raise ValidationFailed(f"is {cmd.tenant_id!r}, but the command was published under {tenant_id!r}",
                                   field="tenant.tenant_id", hint="publish commands under the tenant they belong to")
        if cmd.tenant_id != tenant_id:
            cmd = replace(cmd, tenant_id=tenant_id)
    return cmd


def _retried(existing: MemoryRecord, record: MemoryRecord) -> WriteResult:
    """The answer to a write whose idempotency key is taken: the first result for a true retry,
    a refusal for a different write under the same key (never a silent drop of the new content)."""
    if existing.request_hash and existing.request_hash != record.request_hash:
        raise IdempotencyKeyReused(
            "was already used for a different write", field="idempotency_key",
            hint="use a new idempotency key for new content; reuse a key only to retry the same write")
    return WriteResult(existing.memory_id, duplicate=True, version=1, status=WriteStatus.DUPLICATE,
                       must_confirm=existing.must_confirm)


BURST_WINDOW = timedelta(minutes=1)


class _Recent:
    """Writes per user in the last minute, measured once per unit and counted on as it writes; `limit`
    is how many the guard lets through before it quarantines the rest of a burst (the unit's `policy`'s)."""

    def __init__(self, uow: UnitOfWork, now: datetime, policy: WritePolicy = DEFAULT_POLICY) -> None:
        self.uow, self.now, self.counts, self.policy = uow, now, {}, policy
        self.limit = policy.burst_limit

    async def take(self, tenant_id: str, user_id: str) -> int:
        if user_id not in self.counts:
            self.counts[user_id] = await self.uow.recent_writes(tenant_id, user_id, self.now - BURST_WINDOW)
        before = self.counts[user_id]
        self.counts[user_id] += 1
        return before


async def tenant_rules(uow: UnitOfWork, tenant_id: str, policy: WritePolicy) -> WritePolicy:
    """The deployment's rules with the tenant's own, read in the unit's transaction (every replica follows a
    change at once)."""
    return policy.for_tenant(tenant_id, await uow.contacts_policy(tenant_id))


async def _prepared(uow: UnitOfWork, cmd: WriteMemory, now: datetime, schema: dict | None,
                    policy: WritePolicy = DEFAULT_POLICY) -> MemoryRecord:
    """The validated record of `cmd` (ValidationFailed otherwise), with its keyed hashes if sensitive."""
    record = new_memory(cmd, now, schema, contacts_sensitive=policy.contacts_sensitive(cmd.tenant_id))
    if record.sensitive_kind:  # compared and looked up by keyed hashes: the plaintext is sealed on add
        record = replace(
            record, content_hmac=await uow.keyed_hash(record.tenant_id, normalized(record.content)),
            sensitive_hashes=tuple([await uow.keyed_hash(record.tenant_id, normalized(v))
                                    for v in record.sensitive_values]))
    return record


def _digest(record: MemoryRecord) -> str:
    return record.content_hmac or content_digest(record.content)


# A batch needs each signature twice (for its lookups, then to link): computed once, for the whole batch
# in one vectorised pass (_sign_all), and kept here, at most _SIGNATURES_KEPT of them.
_signatures: dict[str, tuple[int, ...]] = {}
_SIGNATURES_KEPT = 4096


def _signed_text(record: MemoryRecord) -> str:
    return record.redacted if record.sensitive_kind else record.content


def _keep_room(extra: int) -> None:
    if len(_signatures) + extra > _SIGNATURES_KEPT:
        _signatures.clear()


def _sign_all(records: Sequence[MemoryRecord]) -> None:
    texts = [t for t in dict.fromkeys(map(_signed_text, records)) if t not in _signatures]
    _keep_room(len(texts))
    _signatures.update(zip(texts, map(tuple, minhash_many(texts)), strict=True))


def _signature_of(record: MemoryRecord) -> list[int]:
    text = _signed_text(record)
    signature = _signatures.get(text)
    if signature is None:
        _keep_room(1)
        signature = _signatures[text] = tuple(minhash(text))
    return list(signature)


def _lookups(records: Sequence[MemoryRecord], now: datetime) -> Lookups:
    """What `_write_in` will look up for `records` (a superset: a quarantined write looks up less)."""
    lookups = Lookups(since=now - BURST_WINDOW)
    _sign_all([r for r in records if not r.key])
    for r in records:
        lookups.users.add(r.user_id)
        if r.idempotency_key:
            lookups.idempotency_keys.add(r.idempotency_key)
        lookups.sealing.add(r.user_id)  # every memory.written is stored sealed (see the unit of work)
        if r.key:
            lookups.entity_keys.add((r.user_id, r.key))
        else:
            lookups.identical.add((r.user_id, int(r.layer), _digest(r)))
            signature = _signature_of(r)
            layer = int(r.layer)
            lookups.buckets.update(zip(lsh_keys(r.user_id, layer, signature),
                                       ((r.user_id, layer, b) for b in bands(signature)), strict=True))
    return lookups


async def _write_in(uow: UnitOfWork, cmd: WriteMemory, now: datetime, schema: dict | None,
                    recent: _Recent, record: MemoryRecord | None = None) -> WriteResult:
    """One write inside `uow` (`record`: its record if already prepared). DomainErrors raised before
    anything is written are the write's own; anything raised after is wrapped in _AfterWrite."""
    record = record or await _prepared(uow, cmd, now, schema, recent.policy)
    current = None
    if record.key:  # hold the key first: same-key writes are serialised, whatever their idempotency keys
        current = await uow.current_of(record.tenant_id, record.user_id, record.key)
    if cmd.idempotency_key:
        existing = await uow.find_by_idempotency_key(cmd.tenant_id, cmd.idempotency_key)
        if existing:
            return _retried(existing, record)
    decision = decide(record, current) if record.key else None
    if decision is not None:
        if decision.outcome is WriteStatus.DUPLICATE:
            return WriteResult(current.memory_id, duplicate=True, version=1, status=WriteStatus.DUPLICATE,
                               must_confirm=current.must_confirm)
        record = decision.record
    contradicts = (decision is not None and decision.outcome is WriteStatus.CANDIDATE
                   and record.source is Source.MODEL_INFERENCE and current.confidence is Confidence.L1_STRONG)
    verdict = assess(record.content, Signals(source=int(record.source), contradicts_l1=contradicts,
                                             recent_writes=await recent.take(record.tenant_id, record.user_id),
                                             burst_limit=recent.limit))
    if verdict.quarantine:  # stored apart, announced without content, never served
        record = replace(record, status=Status.QUARANTINED, quarantine_reasons=verdict.reasons)
        decision = None
    if record.status is Status.CURRENT and not record.key:
        merged = await _merge_or_link(uow, record)
        if isinstance(merged, WriteResult):
            return merged
        record = merged
    old = decision.supersedes if decision else None
    if old is None and not await uow.add(record):
        # A concurrent write with the same idempotency key got there first (nothing was written here).
        return _retried(await uow.find_by_idempotency_key(cmd.tenant_id, cmd.idempotency_key), record)
    try:
        if old is not None:
            await uow.supersede(record.tenant_id, old.memory_id, record.memory_id, now)
            if not await uow.add(record):  # the key lock makes this all but impossible; undo the supersede
                raise Conflict("a concurrent write used the same idempotency key", field="idempotency_key",
                               hint="retry: the other write's result will be returned")
        if record.status is Status.QUARANTINED:
            version = await uow.record(f"memory-{record.memory_id}", 0, MemoryQuarantined(record))
            return WriteResult(record.memory_id, duplicate=False, version=version, status=WriteStatus.QUARANTINED,
                               quarantine_reasons=record.quarantine_reasons)
        version = await uow.record(f"memory-{record.memory_id}", 0, MemoryWritten(record))
        if old is not None:
            version = await uow.record(f"memory-{record.memory_id}", version, MemoryCorrected(old, record))
    except Exception as exc:
        raise _AfterWrite(exc) from exc
    status = WriteStatus.CANDIDATE if record.status is Status.CANDIDATE else WriteStatus.STORED
    return WriteResult(record.memory_id, duplicate=False, version=version, status=status,
                       supersedes=old.memory_id if old else "", must_confirm=record.must_confirm,
                       near_duplicate_of=record.near_duplicate_of)


async def _merge_or_link(uow: UnitOfWork, record: MemoryRecord) -> WriteResult | MemoryRecord:
    """An identical memory of the same user and layer absorbs the write (no second row); otherwise the
    record, linked to the memory it closely resembles, if any."""
    digest = _digest(record)
    existing = await uow.find_identical(record.tenant_id, record.user_id, int(record.layer), digest)
    if existing is not None and record.idempotency_key:
        # find_identical may have waited for a concurrent write of this content to commit: if that was this
        # write under the same key (a retry sent twice), its result is the answer, not a merge into it.
        first = await uow.find_by_idempotency_key(record.tenant_id, record.idempotency_key)
        if first is not None:
            return _retried(first, record)
    if existing is not None:
        kept = replace(existing, engagement=existing.engagement + 1.0, merged_count=existing.merged_count + 1,
                       tags=tuple(dict.fromkeys((*existing.tags, *record.tags))),
                       derived_from=tuple(dict.fromkeys((*existing.derived_from, *record.derived_from))))
        try:
            await uow.merge_into(kept)
            version = await uow.record(f"memory-{kept.memory_id}", ANY_VERSION, MemoryMerged(kept, record))
            if record.idempotency_key:  # a retry of this write finds its result instead of merging again
                await uow.add_merged_key(record.tenant_id, record.idempotency_key, kept.memory_id, record.request_hash)
        except Exception as exc:
            raise _AfterWrite(exc) from exc
        return WriteResult(kept.memory_id, duplicate=True, version=version, status=WriteStatus.MERGED,
                           must_confirm=kept.must_confirm)
    signature = _signature_of(record)
    near = ""
    best = NEAR_THRESHOLD
    for memory_id, other in await uow.near_candidates(record.tenant_id, record.user_id, int(record.layer),
                                                      bands(signature)):
        score = similarity(signature, other)
        if score >= best:
            near, best = memory_id, score
    return replace(record, content_digest=digest, minhash=tuple(signature), near_duplicate_of=near)


async def write_memory(cmd: WriteMemory, uow: UnitOfWork, *, on_behalf_of: str = "",
                       now: datetime | None = None, policy: WritePolicy = DEFAULT_POLICY) -> WriteResult:
    """Write one memory. `on_behalf_of` is the tenant a stream command was published under; `policy` the
    deployment's write rules (burst limit, tenants whose contacts are sensitive), which the tenant's own
    rule overrides."""
    cmd = _owned(cmd, on_behalf_of)
    async with uow:
        await uow.hold_keys(cmd.tenant_id, [cmd.user_id])  # first: a forget of the user waits for this write
        schemas = await uow.entity_schemas(cmd.tenant_id, {cmd.key} if cmd.key else set())
        policy = await tenant_rules(uow, cmd.tenant_id, policy)
        try:
            now = now or datetime.now(UTC)
            return await _write_in(uow, cmd, now, schemas.get(cmd.key), _Recent(uow, now, policy))
        except _AfterWrite as exc:
            raise exc.cause from None


async def write_batch(cmds: Sequence[WriteMemory], uow_factory: Callable[[], UnitOfWork], *, tenant_id: str,
                      now: datetime | None = None, before_each: Callable[[int], None] | None = None,
                      policy: WritePolicy = DEFAULT_POLICY) -> list[Outcome]:
    """Write `cmds` for `tenant_id` in one transaction; one outcome per command, in order.

    An outcome is the WriteResult, or the exception of that command (a DomainError saying what
    is wrong with it, or what the store refused). A transient failure (the database went away)
    raises: nothing of the batch was written, and the whole batch may be retried.
    `before_each(i)` runs before command i (the stream entry point sets the causation there).
    """
    if len(cmds) > MAX_BATCH:
        raise ValidationFailed(f"has {len(cmds)} writes; the limit is {MAX_BATCH}", field="writes",
                               hint=f"send at most {MAX_BATCH} writes per batch")
    now = now or datetime.now(UTC)
    try:
        return await _batch(cmds, uow_factory(), tenant_id, now, before_each, policy, isolate=False)
    except _AfterWrite as exc:
        # Rare: a write failed after touching the database, which spoils the transaction. Run the
        # batch again, each write in its own savepoint, so only that write is undone.
        log.warning("batch runs again write by write", tenant_id=tenant_id, writes=len(cmds), error=str(exc.cause))
        return await _batch(cmds, uow_factory(), tenant_id, now, before_each, policy, isolate=True)


async def _batch(cmds: Sequence[WriteMemory], uow: UnitOfWork, tenant_id: str, now: datetime,
                 before_each: Callable[[int], None] | None, policy: WritePolicy, *, isolate: bool) -> list[Outcome]:
    """The batch in `uow`. Normally in batch mode (UnitOfWork.prefetch .. flush): its lookups in a few
    statements, its writes held back and written together. `isolate`: write by write, each in a savepoint."""
    outcomes: list[Outcome | None] = [None] * len(cmds)
    owned: dict[int, WriteMemory] = {}
    for i, cmd in enumerate(cmds):
        try:
            owned[i] = _owned(cmd, tenant_id)
        except DomainError as exc:
            outcomes[i] = exc
    async with uow:
        await uow.hold_keys(tenant_id, sorted({c.user_id for c in owned.values()}))  # first (see write_memory)
        schemas = await uow.entity_schemas(tenant_id, {c.key for c in owned.values() if c.key})
        policy = await tenant_rules(uow, tenant_id, policy)
        recent = _Recent(uow, now, policy)
        prepared: dict[int, MemoryRecord] = {}
        if not isolate:
            for i, cmd in list(owned.items()):
                try:
                    # A microsecond apart: the batch's order stays the order of its records (session turns).
                    prepared[i] = await _prepared(uow, cmd, now + timedelta(microseconds=i), schemas.get(cmd.key),
                                                  policy)
                except DomainError as exc:  # refused before anything of it was written
                    if is_transient(exc):  # (Busy) the batch is retried, not this write failed
                        raise
                    outcomes[i] = exc
                    del owned[i]
            await uow.prefetch(tenant_id, _lookups(list(prepared.values()), now))
        for i, cmd in owned.items():
            if before_each is not None:
                before_each(i)
            scope = uow.savepoint() if isolate else contextlib.nullcontext()
            try:
                async with scope:
                    outcomes[i] = await _write_in(uow, cmd, now + timedelta(microseconds=i), schemas.get(cmd.key),
                                                  recent, prepared.get(i))
            except DomainError as exc:  # refused before anything of it was written
                if is_transient(exc):  # (Busy) the batch is retried, not this write failed
                    raise
                outcomes[i] = exc
            except Exception as exc:  # noqa: BLE001 - classified: the batch retried, isolated, or this write's error
                cause = exc.cause if isinstance(exc, _AfterWrite) else exc
                if is_transient(cause):
                    raise cause from None  # nothing of the batch commits; all of it may be retried
                if not isolate:
                    raise _AfterWrite(cause) from cause
                outcomes[i] = cause
        if not isolate:
            try:
                await uow.flush()
            except Exception as exc:  # noqa: BLE001 - a transient failure retries the batch; others isolate it
                if is_transient(exc):
                    raise
                raise _AfterWrite(exc) from exc
    return outcomes  # type: ignore[return-value]

"""Memory records <-> protobuf messages, for the gRPC and stream entry points and the event payloads."""

from __future__ import annotations

from datetime import UTC

from google.protobuf import json_format, struct_pb2, timestamp_pb2

from libs.protogen.mnemesh.v1 import common_pb2, events_pb2, memory_pb2
from services.memory_writer.domain import (
    DomainEvent,
    MemoryArchived,
    MemoryConfirmed,
    MemoryCorrected,
    MemoryExpired,
    MemoryMerged,
    MemoryQuarantined,
    MemoryRecord,
    MemoryReleased,
    MemoryWritten,
    SessionCompressed,
    WriteMemory,
    WriteResult,
)

__all__ = ["command_from_proto", "event_to_proto", "memory_to_proto", "result_to_proto", "timestamp"]


def _ts(value) -> timestamp_pb2.Timestamp | None:
    if value is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value)
    return ts


timestamp = _ts


def memory_to_proto(r: MemoryRecord, *, revealed: bool = False, sealed: bool = False) -> common_pb2.Memory:
    """The Memory message of `r`. A sensitive record shows its redacted text unless `revealed` (its
    content was opened for a caller with memory:sensitive); `sealed` adds the ciphertext (events)."""
    attributes = struct_pb2.Struct()
    attributes.update(r.attributes)
    content = r.content if revealed or not r.sensitive_kind else r.redacted
    return common_pb2.Memory(
        memory_id=r.memory_id,
        tenant=common_pb2.TenantContext(tenant_id=r.tenant_id, user_id=r.user_id, session_id=r.session_id),
        sensitive_kind=r.sensitive_kind, sealed_content=r.sealed if sealed else b"",
        sensitive_hashes=list(r.sensitive_hashes),
        layer=int(r.layer), source=int(r.source), content=content, key=r.key, created_at=_ts(r.created_at),
        expires_at=_ts(r.expires_at), confidence=int(r.confidence), engagement=r.engagement, tags=list(r.tags),
        derived_from=list(r.derived_from), step_id=r.step_id, attributes=attributes, status=int(r.status),
        must_confirm=r.must_confirm, near_duplicate_of=r.near_duplicate_of, merged_count=r.merged_count,
    )


def result_to_proto(result: WriteResult) -> memory_pb2.WriteMemoryResponse:
    return memory_pb2.WriteMemoryResponse(memory_id=result.memory_id, duplicate=result.duplicate,
                                          version=result.version, status=int(result.status),
                                          supersedes=result.supersedes, must_confirm=result.must_confirm,
                                          quarantine_reasons=list(result.quarantine_reasons),
                                          near_duplicate_of=result.near_duplicate_of)


def command_from_proto(msg: memory_pb2.WriteMemoryRequest, written_by: str = "") -> WriteMemory:
    """The gRPC request and the stream command are the same message."""
    return WriteMemory(
        tenant_id=msg.tenant.tenant_id, user_id=msg.tenant.user_id, session_id=msg.tenant.session_id,
        layer=msg.layer, source=msg.source, content=msg.content, key=msg.key, confidence=msg.confidence,
        tags=tuple(msg.tags), derived_from=tuple(msg.derived_from), step_id=msg.step_id,
        expires_at=msg.expires_at.ToDatetime(tzinfo=UTC) if msg.HasField("expires_at") else None,
        idempotency_key=msg.idempotency_key,
        # (json_format's printer walks even an empty Struct: about 20 µs a command)
        attributes=json_format.MessageToDict(msg.attributes) if msg.attributes.fields else {},
        written_by=written_by,
    )


def _tenant(r: MemoryRecord) -> common_pb2.TenantContext:
    return common_pb2.TenantContext(tenant_id=r.tenant_id, user_id=r.user_id, session_id=r.session_id)


def event_to_proto(event: DomainEvent) -> tuple[str, object]:
    """(event type, payload message) of a domain event."""
    if isinstance(event, MemoryWritten):
        return "memory.written", events_pb2.MemoryWritten(memory=memory_to_proto(event.record, sealed=True),
                                                          version=1)
    if isinstance(event, MemoryCorrected):
        return "memory.corrected", events_pb2.MemoryCorrected(
            tenant=_tenant(event.new), key=event.new.key, old_memory_id=event.old.memory_id,
            new_memory_id=event.new.memory_id, changed_by=event.new.written_by, reason=event.new.reason,
            corrected_at=_ts(event.new.created_at))
    if isinstance(event, MemoryConfirmed):
        r = event.record
        return "memory.confirmed", events_pb2.MemoryConfirmed(
            tenant=_tenant(r), memory_id=r.memory_id, key=r.key, confidence=int(r.confidence),
            supersedes=event.supersedes, changed_by=event.confirmed_by, reason=r.reason, expires_at=_ts(r.expires_at))
    if isinstance(event, MemoryExpired | MemoryArchived):
        kind, message = (("memory.expired", events_pb2.MemoryExpired) if isinstance(event, MemoryExpired)
                         else ("memory.archived", events_pb2.MemoryArchived))
        payload = message(memory_ids=list(event.memory_ids))
        payload.tenant.tenant_id = event.tenant_id
        getattr(payload, "expired_at" if isinstance(event, MemoryExpired) else "archived_at").CopyFrom(_ts(event.at))
        return kind, payload
    if isinstance(event, SessionCompressed):
        return "memory.session_compressed", events_pb2.SessionCompressed(
            tenant=_tenant(event.summary), summary_memory_id=event.summary.memory_id,
            covered_memory_ids=list(event.covered), strategy=event.strategy, trigger=event.trigger,
            tokens_before=event.tokens_before, tokens_after=event.tokens_after)
    if isinstance(event, MemoryMerged):
        k, w = event.kept, event.write
        return "memory.merged", events_pb2.MemoryMerged(
            tenant=_tenant(w), memory_id=k.memory_id, source=int(w.source), derived_from=list(w.derived_from),
            tags=list(w.tags), merged_count=k.merged_count, engagement=k.engagement)
    if isinstance(event, MemoryQuarantined):
        r = event.record
        return "memory.quarantined", events_pb2.MemoryQuarantined(
            tenant=_tenant(r), memory_id=r.memory_id, key=r.key, layer=int(r.layer),
            reasons=list(r.quarantine_reasons), quarantined_at=_ts(r.created_at))
    if isinstance(event, MemoryReleased):
        return "memory.released", events_pb2.MemoryReleased(
            tenant=_tenant(event.record), memory_id=event.record.memory_id, released_by=event.released_by,
            reason=event.reason)
    payload = events_pb2.MemoryForgotten(memory_ids=list(event.memory_ids), reason=event.reason)
    payload.tenant.tenant_id, payload.tenant.user_id = event.tenant_id, event.user_id
    return "memory.forgotten", payload

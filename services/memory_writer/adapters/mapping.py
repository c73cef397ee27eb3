"""Memory records <-> protobuf messages, for the gRPC and stream entry points and the event payloads."""

from __future__ import annotations

from datetime import UTC

from google.protobuf import json_format, struct_pb2, timestamp_pb2

from libs.protogen.mnemesh.v1 import common_pb2, events_pb2, memory_pb2
from services.memory_writer.domain import MemoryForgotten, MemoryRecord, MemoryWritten, WriteMemory

__all__ = ["command_from_proto", "event_to_proto", "memory_to_proto"]


def _ts(value) -> timestamp_pb2.Timestamp | None:
    if value is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value)
    return ts


def memory_to_proto(r: MemoryRecord) -> common_pb2.Memory:
    attributes = struct_pb2.Struct()
    attributes.update(r.attributes)
    return common_pb2.Memory(
        memory_id=r.memory_id,
        tenant=common_pb2.TenantContext(tenant_id=r.tenant_id, user_id=r.user_id, session_id=r.session_id),
        layer=int(r.layer), source=int(r.source), content=r.content, key=r.key, created_at=_ts(r.created_at),
        expires_at=_ts(r.expires_at), confidence=int(r.confidence), engagement=r.engagement, tags=list(r.tags),
        derived_from=list(r.derived_from), step_id=r.step_id, attributes=attributes,
    )


def command_from_proto(msg: memory_pb2.WriteMemoryRequest) -> WriteMemory:
    """The gRPC request and the stream command are the same message."""
    return WriteMemory(
        tenant_id=msg.tenant.tenant_id, user_id=msg.tenant.user_id, session_id=msg.tenant.session_id,
        layer=msg.layer, source=msg.source, content=msg.content, key=msg.key, confidence=msg.confidence,
        tags=tuple(msg.tags), derived_from=tuple(msg.derived_from), step_id=msg.step_id,
        expires_at=msg.expires_at.ToDatetime(tzinfo=UTC) if msg.HasField("expires_at") else None,
        idempotency_key=msg.idempotency_key, attributes=json_format.MessageToDict(msg.attributes),
    )


def event_to_proto(event: MemoryWritten | MemoryForgotten) -> tuple[str, object]:
    """(event type, payload message) of a domain event."""
    if isinstance(event, MemoryWritten):
        return "memory.written", events_pb2.MemoryWritten(memory=memory_to_proto(event.record), version=1)
    payload = events_pb2.MemoryForgotten(memory_ids=list(event.memory_ids), reason=event.reason)
    payload.tenant.tenant_id, payload.tenant.user_id = event.tenant_id, event.user_id
    return "memory.forgotten", payload

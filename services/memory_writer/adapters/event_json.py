"""The proto3 JSON of a `memory.written` payload, built directly from the record.

`json_format.MessageToJson` walks the message through descriptors and costs more than the rest of a
write's event handling; this builds the same object (same keys, same order, same value forms:
enum names, int64 as strings, RFC 3339 timestamps, base64 bytes, defaults left out), so
`json.dumps` of it is byte for byte what `MessageToJson(MemoryWritten(memory=memory_to_proto(r,
sealed=True), version=1), indent=None)` prints. A record the direct path does not cover (attributes,
whose Struct numbers print as doubles; a non-finite or negative-zero engagement) returns None, and
the caller prints it through protobuf. tests/unit/test_memory_event_json.py checks the equality.
"""

from __future__ import annotations

import base64
import math
from datetime import UTC, datetime

from libs.protogen.mnemesh.v1 import common_pb2
from services.memory_writer.domain import MemoryRecord

__all__ = ["PERSONAL_EVENTS", "PERSONAL_FIELDS", "SUBJECT_EVENTS", "UNPUBLISHED_FIELDS", "written_payload"]

# The fields (proto3 JSON names) by which an event carries a user's words besides a memory's content:
# the event store keeps them only sealed, Forget deletes the published copies.
PERSONAL_FIELDS = {"memory.written": ("tags", "attributes"),  # of its `memory`
                   "memory.corrected": ("reason",), "memory.confirmed": ("reason",), "memory.released": ("reason",),
                   "memory.merged": ("tags",)}
PERSONAL_EVENTS = frozenset(PERSONAL_FIELDS)
# Personal fields the published copy leaves out: the read side has no use for them.
UNPUBLISHED_FIELDS = frozenset({"reason"})
# The events whose published copy is about one memory alone (its `memoryId`): forgetting that memory
# deletes them. A correction or confirmation also tells the read side about another memory.
SUBJECT_EVENTS = frozenset({"memory.written", "memory.merged"})


def _names(enum) -> dict[int, str]:
    return {v.number: v.name for v in enum.DESCRIPTOR.values}


_LAYER, _SOURCE = _names(common_pb2.MemoryLayer), _names(common_pb2.SourceKind)
_CONFIDENCE, _STATUS = _names(common_pb2.Confidence), _names(common_pb2.MemoryStatus)


def _timestamp(value: datetime) -> str:
    """As protobuf's Timestamp.ToJsonString after FromDatetime: UTC, 0, 3 or 6 fractional digits."""
    at = value.astimezone(UTC) if value.tzinfo else value
    micros = at.microsecond
    text = at.replace(tzinfo=None, microsecond=0).isoformat()
    if micros == 0:
        return text + "Z"
    if micros % 1000 == 0:
        return f"{text}.{micros // 1000:03d}Z"
    return f"{text}.{micros:06d}Z"


def _enum(names: dict[int, str], value: int) -> str | int:
    return names.get(value, value)  # open enums print an unknown number as the number


def written_payload(r: MemoryRecord) -> dict | None:
    """The proto3 JSON object of memory.written for `r` (version 1), or None: print it through protobuf."""
    engagement = float(r.engagement)
    if r.attributes or not math.isfinite(engagement) or (engagement == 0.0 and math.copysign(1.0, engagement) < 0):
        return None
    m: dict = {}
    if r.memory_id:
        m["memoryId"] = r.memory_id
    tenant = {}
    if r.tenant_id:
        tenant["tenantId"] = r.tenant_id
    if r.user_id:
        tenant["userId"] = r.user_id
    if r.session_id:
        tenant["sessionId"] = r.session_id
    m["tenant"] = tenant
    if int(r.layer):
        m["layer"] = _enum(_LAYER, int(r.layer))
    if int(r.source):
        m["source"] = _enum(_SOURCE, int(r.source))
    content = r.redacted if r.sensitive_kind else r.content
    if content:
        m["content"] = content
    if r.key:
        m["key"] = r.key
    if r.created_at is not None:
        m["createdAt"] = _timestamp(r.created_at)
    if r.expires_at is not None:
        m["expiresAt"] = _timestamp(r.expires_at)
    if int(r.confidence):
        m["confidence"] = _enum(_CONFIDENCE, int(r.confidence))
    if engagement:
        m["engagement"] = engagement
    if r.tags:
        m["tags"] = list(r.tags)
    if r.derived_from:
        m["derivedFrom"] = list(r.derived_from)
    if r.step_id:
        m["stepId"] = r.step_id
    m["attributes"] = {}
    if int(r.status):
        m["status"] = _enum(_STATUS, int(r.status))
    if r.must_confirm:
        m["mustConfirm"] = True
    if r.sensitive_kind:
        m["sensitiveKind"] = r.sensitive_kind
    if r.sealed:
        m["sealedContent"] = base64.b64encode(r.sealed).decode()
    if r.sensitive_hashes:
        m["sensitiveHashes"] = list(r.sensitive_hashes)
    if r.near_duplicate_of:
        m["nearDuplicateOf"] = r.near_duplicate_of
    if r.merged_count:
        m["mergedCount"] = int(r.merged_count)
    return {"memory": m, "version": "1"}

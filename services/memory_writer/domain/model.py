"""Memories as the write side sees them, and the rules a write must pass. No I/O here."""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from datetime import UTC, datetime, timedelta
from enum import IntEnum

from libs.errors import ValidationFailed
from libs.validation import check_content, check_tenant_id, shows_something
from services.memory_writer.domain.entities import check_entity
from services.memory_writer.domain.sensitive import find_sensitive, redact, redacted_tree

__all__ = ["Confidence", "Layer", "MemoryRecord", "Source", "Status", "WriteMemory", "WriteResult", "WriteStatus",
           "new_memory"]

MAX_CONTENT_CHARS = 16_000
MAX_TAGS = 32
MAX_TAG_CHARS = 64
WEAK_TTL = timedelta(hours=24)


class Layer(IntEnum):  # values mirror mnemesh.v1.MemoryLayer
    SESSION = 1
    STEP = 2
    ENTITY = 3
    SHORT_TERM = 4
    LONG_TERM = 5
    PROCEDURAL = 6


class Source(IntEnum):  # values mirror mnemesh.v1.SourceKind
    AUTHORITATIVE_API = 1
    USER_STATEMENT = 2
    MODEL_INFERENCE = 3
    THIRD_PARTY = 4


class Confidence(IntEnum):  # values mirror mnemesh.v1.Confidence
    L1_STRONG = 1
    L2_MEDIUM = 2
    L3_WEAK = 3


class Status(IntEnum):  # values mirror mnemesh.v1.MemoryStatus
    CURRENT = 1
    CANDIDATE = 2  # a higher confidence level holds its key: kept, reported, never served
    SUPERSEDED = 3  # a later value of its key replaced it: kept for History
    QUARANTINED = 4  # held by the poisoning guard for review: never served
    ARCHIVED = 5  # idle past the archive period: out of default search, kept


class WriteStatus(IntEnum):  # values mirror mnemesh.v1.WriteStatus
    STORED = 1
    DUPLICATE = 2
    CANDIDATE = 3
    QUARANTINED = 5
    MERGED = 6


# Source trust (authoritative API > user statement > model inference > third party) bounds the level a
# write may claim: a model inference is never "used without asking", a third party is only advisory.
_STRONGEST_ALLOWED = {
    Source.AUTHORITATIVE_API: Confidence.L1_STRONG,
    Source.USER_STATEMENT: Confidence.L1_STRONG,
    Source.MODEL_INFERENCE: Confidence.L2_MEDIUM,
    Source.THIRD_PARTY: Confidence.L3_WEAK,
}

_DEFAULT_CONFIDENCE = {
    Source.AUTHORITATIVE_API: Confidence.L1_STRONG,
    Source.USER_STATEMENT: Confidence.L1_STRONG,
    Source.MODEL_INFERENCE: Confidence.L2_MEDIUM,
    Source.THIRD_PARTY: Confidence.L3_WEAK,
}


@dataclass(frozen=True)
class WriteMemory:
    """Write one memory (from gRPC Write or the memory commands stream)."""

    tenant_id: str
    user_id: str
    session_id: str
    layer: int
    source: int
    content: str
    key: str = ""
    confidence: int = 0
    tags: tuple[str, ...] = ()
    derived_from: tuple[str, ...] = ()
    step_id: str = ""
    expires_at: datetime | None = None
    idempotency_key: str = ""
    attributes: dict = field(default_factory=dict)
    reason: str = ""  # why (corrections); part of the write
    written_by: str = ""  # the caller (token subject or producer); not part of the write's fingerprint


@dataclass(frozen=True)
class MemoryRecord:
    memory_id: str
    tenant_id: str
    user_id: str
    session_id: str
    layer: Layer
    source: Source
    content: str
    key: str
    confidence: Confidence
    tags: tuple[str, ...]
    derived_from: tuple[str, ...]
    step_id: str
    created_at: datetime
    expires_at: datetime | None
    idempotency_key: str
    attributes: dict
    engagement: float = 0.0
    request_hash: str = ""  # the fingerprint of the write that created it (see request_fingerprint)
    status: Status = Status.CURRENT
    superseded_by: str = ""
    changed_at: datetime | None = None  # when it was superseded or confirmed
    written_by: str = ""
    reason: str = ""
    # Sensitive memories: `content` is the plaintext only inside the writer; `redacted` is what may leave.
    sensitive_kind: str = ""
    redacted: str = ""
    sensitive_values: tuple[str, ...] = ()  # found in the content; used for keyed hashes, never stored
    sensitive_hashes: tuple[str, ...] = ()
    content_hmac: str = ""  # keyed hash of the normalised content (sensitive memories)
    sealed: bytes = b""  # the content under the user's data key, as stored and announced
    quarantine_reasons: tuple[str, ...] = ()
    content_digest: str = ""  # identical memories (normalised) share it; sensitive ones: their keyed hash
    minhash: tuple[int, ...] = ()  # near duplicates: MinHash of the (redacted) content's shingles
    near_duplicate_of: str = ""
    merged_count: int = 0  # identical writes merged into this memory

    @property
    def must_confirm(self) -> bool:
        """L2 (model inference): the agent must confirm it with the user before use."""
        return self.confidence is Confidence.L2_MEDIUM


@dataclass(frozen=True)
class WriteResult:
    memory_id: str
    duplicate: bool
    version: int
    status: WriteStatus = WriteStatus.STORED
    supersedes: str = ""
    must_confirm: bool = False
    quarantine_reasons: tuple[str, ...] = ()
    near_duplicate_of: str = ""


def _enum(kind: type[IntEnum], value: int, field_name: str) -> IntEnum:
    try:
        return kind(value)
    except ValueError:
        names = ", ".join(m.name for m in kind)
        raise ValidationFailed(f"must be one of {names}", field=field_name,
                               hint=f"set {field_name} to a known value") from None


_FINGERPRINTED = tuple(f.name for f in dataclass_fields(WriteMemory) if f.name not in ("idempotency_key", "written_by"))


def request_fingerprint(cmd: WriteMemory) -> str:
    """What makes two writes the same write: every field the caller chose, but the idempotency key."""
    # A shallow dict (asdict deep-copies): the same JSON, since tuples and dicts encode the same either way.
    fields = {name: getattr(cmd, name) for name in _FINGERPRINTED}
    if not fields["reason"]:
        del fields["reason"]  # fingerprints of writes made before `reason` existed stay the same
    fields["expires_at"] = cmd.expires_at.isoformat() if cmd.expires_at else None
    canonical = json.dumps(fields, sort_keys=True, ensure_ascii=False, default=list)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _check_tags(tags: tuple[str, ...]) -> None:
    """At most MAX_TAGS tags, each 1 to MAX_TAG_CHARS characters with something to read (the edge checks
    a tag's characters, but lets an empty one through: whether it is required is this rule's to say)."""
    if len(tags) > MAX_TAGS:
        raise ValidationFailed(f"has {len(tags)} tags; the limit is {MAX_TAGS}", field="tags",
                               hint=f"keep the {MAX_TAGS} tags that matter most")
    for i, tag in enumerate(tags):
        if not shows_something(tag):
            said = "is empty" if not tag else "has no visible characters"
            raise ValidationFailed(said, field=f"tags[{i}]",
                                   hint=f"remove it, or give the tag 1 to {MAX_TAG_CHARS} visible characters")
        if len(tag) > MAX_TAG_CHARS:
            raise ValidationFailed(f"is {len(tag)} characters; the limit is {MAX_TAG_CHARS}",
                                   field=f"tags[{i}]", hint="shorten the tag")


def _without_secrets(cmd: WriteMemory, contacts: bool) -> tuple[tuple[str, ...], dict]:
    """The tags and attributes to store. They are stored as sent (searches filter by them), so a sensitive value
    there (contacts, where the tenant seals them) is redacted as in content (`[sensitive:<kind>]`), never kept:
    content is where such a value goes, sealed."""
    tags = tuple(redact(tag, contacts=contacts) for tag in cmd.tags)
    return tags, redacted_tree(dict(cmd.attributes), contacts=contacts)


def new_memory(cmd: WriteMemory, now: datetime | None = None, schema: dict | None = None, *,
               contacts_sensitive: bool = False) -> MemoryRecord:
    """Validate `cmd` and build the record; ValidationFailed names the first bad field.

    `schema` is the JSON Schema the tenant registered for `cmd.key`, if any: it decides the
    value's format instead of the built-in one.
    """
    now = now or datetime.now(UTC)
    check_tenant_id(cmd.tenant_id, "tenant.tenant_id")
    if not shows_something(cmd.user_id):
        raise ValidationFailed("is required", field="tenant.user_id", hint="say which user the memory belongs to")
    layer = _enum(Layer, cmd.layer, "layer")
    source = _enum(Source, cmd.source, "source")
    # The same rule on gRPC and on the stream: visible text, no NUL, no word the index cannot hold.
    content = check_content(cmd.content, "content", MAX_CONTENT_CHARS).strip()
    if layer is Layer.STEP and not cmd.step_id:
        raise ValidationFailed("is required for the step layer", field="step_id",
                               hint="give each tool result its unique step_id")
    if layer is Layer.ENTITY and not cmd.key:
        raise ValidationFailed("is required for the entity layer", field="key", hint="e.g. user.phone")
    _check_tags(cmd.tags)
    tags, attributes = _without_secrets(cmd, contacts_sensitive)
    confidence = _enum(Confidence, cmd.confidence, "confidence") if cmd.confidence else _DEFAULT_CONFIDENCE[source]
    allowed = _STRONGEST_ALLOWED[source]
    if confidence < allowed:  # L1 < L2 < L3 in value, strongest first
        raise ValidationFailed(
            f"is {confidence.name}, but a {source.name.lower()} is at most {allowed.name}", field="confidence",
            hint="leave confidence empty for the source's default; the user can Confirm the memory later")
    if cmd.key:
        content = check_entity(cmd.key, content, schema)
    finding = find_sensitive(cmd.key, content, contacts=contacts_sensitive)
    expires_at = cmd.expires_at
    if expires_at is not None and expires_at <= now:
        raise ValidationFailed("is in the past", field="expires_at", hint="leave it empty for no expiry")
    if confidence is Confidence.L3_WEAK and expires_at is None:
        expires_at = now + WEAK_TTL  # weak memories are advisory and short-lived by default
    return MemoryRecord(
        memory_id=str(uuid.uuid4()), tenant_id=cmd.tenant_id, user_id=cmd.user_id, session_id=cmd.session_id,
        layer=layer, source=source, content=content, key=cmd.key, confidence=confidence, tags=tags,
        derived_from=tuple(cmd.derived_from), step_id=cmd.step_id, created_at=now, expires_at=expires_at,
        idempotency_key=cmd.idempotency_key, attributes=attributes,
        request_hash=request_fingerprint(cmd) if cmd.idempotency_key else "",
        written_by=cmd.written_by, reason=cmd.reason,
        sensitive_kind=finding.kind if finding else "", redacted=finding.redacted if finding else "",
        sensitive_values=finding.values if finding else (),
    )

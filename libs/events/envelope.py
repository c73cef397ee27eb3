"""The event envelope: identity, type, schema version, tenant, time, causality, trace.

On a Redis stream the envelope's fields are the entry's string fields, with the
payload as proto3 JSON, so any producer can write one with a plain XADD.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from google.protobuf import json_format
from google.protobuf.message import Message

from libs.auth import TENANT_ID_RULE, is_tenant_id
from libs.errors import DomainError
from libs.events.fast_json import parse_plain
from libs.events.schema import EVENT_TYPES, EventType
from libs.events.upcasting import UpcastError, upcast_payload
from libs.telemetry import current_traceparent

__all__ = ["CREDENTIAL_FIELD", "ENVELOPE_FIELDS", "Envelope", "MalformedEvent"]

# The stream field carrying a producer's JWT on command streams (see libs/events/producers.py).
CREDENTIAL_FIELD = "auth"

# Every field an envelope is written with (to_fields); a stream entry's others are not the envelope's.
ENVELOPE_FIELDS = ("event_id", "event_type", "schema_version", "tenant_id", "occurred_at", "correlation_id",
                   "causation_id", "traceparent", "payload", CREDENTIAL_FIELD)
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_REQUIRED = ("event_id", "event_type", "schema_version", "tenant_id", "occurred_at", "payload")


class MalformedEvent(DomainError):
    """A stream entry that can never be handled; it goes to the dead-letter stream."""

    error_type = "malformed_event"


@dataclass(frozen=True)
class Envelope:
    event_type: str
    tenant_id: str
    payload: str  # proto3 JSON
    event_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    schema_version: int = 1
    occurred_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    correlation_id: str = ""
    causation_id: str = ""
    traceparent: str = ""
    # A producer's JWT; set on command streams only, never logged or printed.
    credential: str = field(default="", repr=False, compare=False)

    @classmethod
    def wrap(
        cls,
        message: Message,
        *,
        event_type: str,
        tenant_id: str,
        causation: Envelope | None = None,
        correlation_id: str = "",
        credential: str = "",
    ) -> Envelope:
        """Build an envelope for `message`, caused by `causation` when given, in the current trace."""
        spec = EVENT_TYPES[event_type]
        if not isinstance(message, spec.message):
            raise TypeError(f"{event_type} carries {spec.message.__name__}, not {type(message).__name__}")
        return cls.wrap_json(json_format.MessageToJson(message, indent=None), event_type=event_type,
                             tenant_id=tenant_id, causation=causation, correlation_id=correlation_id,
                             credential=credential)

    @classmethod
    def wrap_json(
        cls,
        payload: str,
        *,
        event_type: str,
        tenant_id: str,
        causation: Envelope | None = None,
        correlation_id: str = "",
        credential: str = "",
    ) -> Envelope:
        """As wrap, for a payload already printed as the proto3 JSON of the type's message (a producer
        that builds it directly, without protobuf's printer, on a hot path)."""
        spec = EVENT_TYPES[event_type]
        event_id = str(uuid.uuid4())
        return cls(
            event_type=event_type,
            tenant_id=tenant_id,
            payload=payload,
            event_id=event_id,
            schema_version=spec.version,
            correlation_id=correlation_id or (causation.correlation_id if causation else "") or event_id,
            causation_id=causation.event_id if causation else "",
            traceparent=current_traceparent(),
            credential=credential,
        )

    @property
    def spec(self) -> EventType:
        return EVENT_TYPES[self.event_type]

    @property
    def stream(self) -> str:
        return self.spec.stream

    def message(self) -> Message:
        """The typed payload, a copy of its own; MalformedEvent when it does not parse."""
        message = self.spec.message()
        message.CopyFrom(self.peek())
        return message

    def peek(self) -> Message:
        """The typed payload as parsed once for this envelope, shared: read it, never change it (`message()`
        gives a copy to change). MalformedEvent when it does not parse."""
        if not self.payload.lstrip().startswith("{"):  # json_format would take `[]` for an empty message
            raise MalformedEvent(field="payload", reason=f"must be a JSON object (a {self.spec.message.__name__})",
                                 hint="publish the payload as proto3 JSON of the message named in the AsyncAPI "
                                      "document")
        # Parsed once per envelope (checked on receipt, then read by the handler).
        parsed = self.__dict__.get("_parsed")
        if parsed is None:
            try:
                # A newer version than this consumer knows is read tolerantly: known fields only.
                # The plain payloads without protobuf's pure-Python walk; any other, json_format reads.
                parsed = parse_plain(self.payload, self.spec.message())
                if parsed is None:
                    parsed = json_format.Parse(self.payload, self.spec.message(),
                                               ignore_unknown_fields=self.schema_version > self.spec.version)
            except json_format.ParseError as exc:
                raise MalformedEvent(
                    field="payload", reason=f"not a valid {self.spec.message.__name__}: {exc}",
                    hint="publish the payload as proto3 JSON of the message named in the AsyncAPI document",
                ) from None
            object.__setattr__(self, "_parsed", parsed)  # not a field: equality and replace() ignore it
        return parsed

    def to_fields(self) -> dict[str, str]:
        return {
            "event_id": self.event_id,
            "event_type": self.event_type,
            "schema_version": str(self.schema_version),
            "tenant_id": self.tenant_id,
            "occurred_at": self.occurred_at.isoformat(),
            "correlation_id": self.correlation_id,
            "causation_id": self.causation_id,
            "traceparent": self.traceparent,
            "payload": self.payload,
        } | ({CREDENTIAL_FIELD: self.credential} if self.credential else {})

    @classmethod
    def from_fields(cls, fields: Mapping[str, str], *, check_payload: bool = True) -> Envelope:
        """Parse stream entry fields, naming the first bad field.

        `check_payload=False` checks the envelope's fields but not that a current-version payload parses
        as its message (the outbox relay, republishing what its own service printed from a message;
        a consumer still checks it). An older version's payload is upcast and checked either way.
        """
        for name in _REQUIRED:
            if not fields.get(name):
                raise MalformedEvent(field=name, reason="is missing or empty",
                                     hint=f"every event needs the fields {', '.join(_REQUIRED)}")
        event_type = fields["event_type"]
        if event_type not in EVENT_TYPES:
            raise MalformedEvent(field="event_type", reason=f"unknown event type {event_type[:40]!r}",
                                 hint=f"use one of {', '.join(sorted(EVENT_TYPES))}")
        if not is_tenant_id(fields["tenant_id"]):
            raise MalformedEvent(field="tenant_id", reason=f"{fields['tenant_id'][:40]!r} is not a tenant id: it must "
                                                           f"be {TENANT_ID_RULE}",
                                 hint="publish under the tenant your producer token was issued for")
        try:
            version = int(fields["schema_version"])
        except ValueError:
            raise MalformedEvent(field="schema_version", reason="must be an integer") from None
        if version < 1:
            raise MalformedEvent(field="schema_version", reason="must be 1 or more")
        try:
            occurred_at = datetime.fromisoformat(fields["occurred_at"])
        except ValueError:
            raise MalformedEvent(field="occurred_at", reason="must be an ISO 8601 timestamp") from None
        if not _UUID.fullmatch(fields["event_id"]):
            raise MalformedEvent(field="event_id", reason="must be a UUID (8-4-4-4-12 hexadecimal digits)",
                                 hint="e.g. the output of uuidgen")
        envelope = cls(
            event_type=event_type,
            tenant_id=fields["tenant_id"],
            payload=fields["payload"],
            event_id=fields["event_id"].lower(),  # the one form the processed-event table gives back
            schema_version=version,
            occurred_at=occurred_at if occurred_at.tzinfo else occurred_at.replace(tzinfo=UTC),
            correlation_id=fields.get("correlation_id", ""),
            causation_id=fields.get("causation_id", ""),
            traceparent=fields.get("traceparent", ""),
            credential=fields.get(CREDENTIAL_FIELD, ""),
        )
        current = envelope.upcast()
        if check_payload or current is not envelope:
            current.message()  # validate the payload now, not deep inside a handler
        return current

    def upcast(self) -> Envelope:
        """This envelope at the current schema version of its type (see upcasting.py).

        Older versions go through their upcasters; newer ones are kept as they are and
        read tolerantly by message(). MalformedEvent when no upcaster chain exists.
        """
        current = self.spec.version
        if self.schema_version >= current:
            return self
        try:
            payload = upcast_payload(self.event_type, self.schema_version, current, self.payload)
        except UpcastError as exc:
            raise MalformedEvent(field="schema_version", reason=f"version {self.schema_version} of "
                                 f"{self.event_type} cannot be read: {exc}",
                                 hint=f"publish version {current}, or register an upcaster") from None
        return replace(self, payload=payload, schema_version=current)


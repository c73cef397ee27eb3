"""Generate the AsyncAPI 3.0 document of every stream from the event table and the protos.

`mnemesh asyncapi -o docs/asyncapi.json` writes it; a test fails when the committed
copy is stale. Payload schemas are derived from the protobuf descriptors, in the
proto3 JSON mapping the events travel in.
"""

from __future__ import annotations

import json

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from libs.auth import TENANT_ID
from libs.events.envelope import CREDENTIAL_FIELD
from libs.events.producers import produce_scope
from libs.events.schema import EVENT_TYPES, STREAMS, dead_letter_stream

__all__ = ["document", "render"]

_SCALARS = {
    FieldDescriptor.TYPE_DOUBLE: {"type": "number"}, FieldDescriptor.TYPE_FLOAT: {"type": "number"},
    FieldDescriptor.TYPE_INT64: {"type": "string", "format": "int64"},
    FieldDescriptor.TYPE_UINT64: {"type": "string", "format": "uint64"},
    FieldDescriptor.TYPE_INT32: {"type": "integer"}, FieldDescriptor.TYPE_UINT32: {"type": "integer"},
    FieldDescriptor.TYPE_BOOL: {"type": "boolean"}, FieldDescriptor.TYPE_STRING: {"type": "string"},
    FieldDescriptor.TYPE_BYTES: {"type": "string", "contentEncoding": "base64"},
}
_WELL_KNOWN = {
    "google.protobuf.Timestamp": {"type": "string", "format": "date-time"},
    "google.protobuf.Struct": {"type": "object"},
}
_ENVELOPE_FIELDS = {
    "event_id": {"type": "string", "format": "uuid"},
    "event_type": {"type": "string"},
    "schema_version": {"type": "string", "pattern": "^[0-9]+$"},
    "tenant_id": {"type": "string", "pattern": f"^{TENANT_ID.pattern}$"},
    "occurred_at": {"type": "string", "format": "date-time"},
    "correlation_id": {"type": "string"},
    "causation_id": {"type": "string"},
    "traceparent": {"type": "string", "description": "W3C trace context"},
}


def _field_schema(field: FieldDescriptor, defs: dict) -> dict:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        schema = _message_ref(field.message_type, defs)
    elif field.type == FieldDescriptor.TYPE_ENUM:
        schema = {"type": "string", "enum": [v.name for v in field.enum_type.values]}
    else:
        schema = dict(_SCALARS[field.type])
    if field.is_repeated:
        return {"type": "array", "items": schema}
    return schema


def _message_ref(descriptor: Descriptor, defs: dict) -> dict:
    if descriptor.full_name in _WELL_KNOWN:
        return dict(_WELL_KNOWN[descriptor.full_name])
    name = descriptor.full_name.replace(".", "_")
    if name not in defs:
        defs[name] = {}  # placeholder first: messages may refer to themselves
        defs[name] = {
            "type": "object",
            "properties": {f.json_name: _field_schema(f, defs) for f in descriptor.fields},
            "additionalProperties": False,
        }
    return {"$ref": f"#/components/schemas/{name}"}


def document() -> dict:
    schemas: dict = {}
    messages: dict = {}
    channels: dict = {}
    operations: dict = {}
    for stream in STREAMS.values():
        key = stream.name.replace(".", "_")
        channels[key] = {"address": stream.name, "description": f"{stream.description} Written by {stream.owner}.",
                         "messages": {}}
        channels[f"{key}_dead"] = {
            "address": dead_letter_stream(stream.name),
            "description": "Dead letters of the stream: the original fields as original.<field>, plus dead.stream, "
                           "dead.entry_id, dead.group, dead.deliveries, dead.failed_at and dead.reason "
                           "(JSON {error_type, field, reason, retryable, hint}).",
        }
    for spec in EVENT_TYPES.values():
        key = spec.stream.replace(".", "_")
        msg_name = spec.name.replace(".", "_")
        payload_ref = _message_ref(spec.message.DESCRIPTOR, schemas)
        credential = {CREDENTIAL_FIELD: {
            "type": "string", "description": f"producer JWT with the scope {produce_scope(spec.stream)} (or "
                                             "produce:*) for the envelope's tenant_id; entries without a valid one "
                                             "are dead-lettered"}} if STREAMS[spec.stream].external else {}
        messages[msg_name] = {
            "name": spec.name,
            "title": spec.message.DESCRIPTOR.name,
            "summary": spec.description,
            "contentType": "application/json",
            "headers": {"type": "object", "required": [*_ENVELOPE_FIELDS, *credential],
                        "properties": {**_ENVELOPE_FIELDS, **credential,
                                       "event_type": {"const": spec.name},
                                       "schema_version": {"const": str(spec.version)}}},
            "payload": {**payload_ref, "description": "carried as proto3 JSON text in the stream field `payload`"},
        }
        channels[key]["messages"][msg_name] = {"$ref": f"#/components/messages/{msg_name}"}
    for stream in STREAMS.values():
        key = stream.name.replace(".", "_")
        refs = [{"$ref": f"#/channels/{key}/messages/{m}"} for m in channels[key]["messages"]]
        operations[f"publish_{key}"] = {"action": "send", "channel": {"$ref": f"#/channels/{key}"},
                                        "summary": f"{stream.owner} publishes", "messages": refs}
    return {
        "asyncapi": "3.0.0",
        "info": {"title": "Mnemesh streams", "version": "1.0.0",
                 "description": "Redis Streams between the Mnemesh services. Every entry's fields are the envelope "
                                "headers plus `payload`; consumers use consumer groups, at-least-once delivery, "
                                "idempotent handling by event_id, and a dead-letter stream per stream."},
        "defaultContentType": "application/json",
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "schemas": schemas},
    }


def render() -> str:
    return json.dumps(document(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"

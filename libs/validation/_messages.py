"""The edge check of a whole protobuf request: every field has a limit, and every value obeys it.

`check_message` walks the fields a request sets (nested messages, repeated fields, Struct
trees) and applies the shared rules: text without NUL or lone surrogates and within its
length, identifiers and tenants by format, known enum values, finite numbers, timestamps in
range, Struct values bounded in size and depth. The limits of each field live in `LIMITS`,
one table; the README's section 'Input limits' and the protos' comments state the same numbers.

It also puts the values it checks in their canonical form, in the message itself (a UUID
lower-case), so that every handler behind the edge compares the one form the store holds.
A repeated field of kind "each" (WriteBatch's writes) is checked for its count only: its items
are checked one by one with `check_items`, so that a bad item fails alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from google.protobuf import struct_pb2, timestamp_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from libs.errors import ValidationFailed
from libs.validation._rules import (
    check_content,
    check_finite,
    check_identifier,
    check_session_id,
    check_tenant_id,
    check_text,
    check_timestamp,
    check_uuid,
    quote,
)

__all__ = ["LIMITS", "Limit", "check_items", "check_message"]

MAX_STRUCT_DEPTH = 20
MAX_STRUCT_KEY_CHARS = 256
_DEFAULT_TEXT_CHARS = 1_024


@dataclass(frozen=True)
class Limit:
    """How one field is checked. `chars` applies to each string (each item of a repeated field)."""

    kind: str  # text | content | identifier | tenant | session | uuid | struct | message | each | enum
    chars: int = 0
    items: int = 0  # repeated fields: how many items at most
    bytes: int = 0  # Struct fields: serialized size at most


def _text(chars: int, items: int = 0) -> Limit:
    return Limit("text", chars, items)


def _ident(chars: int, items: int = 0) -> Limit:
    return Limit("identifier", chars, items)


def _struct(size: int, items: int = 0) -> Limit:
    return Limit("struct", items=items, bytes=size)


_TENANT = {"tenant": Limit("message")}
_KB = 1024

LIMITS: dict[str, dict[str, Limit]] = {
    "mnemesh.v1.TenantContext": {"tenant_id": Limit("tenant", 64), "user_id": _ident(128),
                                 "session_id": Limit("session", 128)},
    "mnemesh.v1.WriteMemoryRequest": {
        **_TENANT, "content": Limit("content", 16_000), "key": _ident(128), "tags": _ident(64, items=32),
        "derived_from": _ident(128, items=64), "step_id": _ident(128), "idempotency_key": _ident(128),
        "attributes": _struct(16 * _KB)},
    "mnemesh.v1.GetMemoryRequest": {**_TENANT, "memory_id": Limit("uuid", 36)},
    # Each write is checked by the service (check_items): a bad write fails alone, the call goes on.
    "mnemesh.v1.WriteBatchRequest": {**_TENANT, "writes": Limit("each", items=500)},
    "mnemesh.v1.CorrectRequest": {**_TENANT, "key": _ident(128), "content": Limit("content", 16_000),
                                  "reason": _text(500), "idempotency_key": _ident(128)},
    "mnemesh.v1.ConfirmRequest": {**_TENANT, "memory_id": Limit("uuid", 36), "reason": _text(500)},
    "mnemesh.v1.HistoryRequest": {**_TENANT, "key": _ident(128)},
    "mnemesh.v1.ListQuarantineRequest": {**_TENANT},
    "mnemesh.v1.SetTenantPolicyRequest": {**_TENANT},
    "mnemesh.v1.GetTenantPolicyRequest": {**_TENANT},
    "mnemesh.v1.ReleaseRequest": {**_TENANT, "memory_id": Limit("uuid", 36), "reason": _text(500)},
    "mnemesh.v1.DropQuarantinedRequest": {**_TENANT, "memory_id": Limit("uuid", 36), "reason": _text(500)},
    "mnemesh.v1.CompressSessionRequest": {**_TENANT, "strategy": _ident(16)},
    "mnemesh.v1.RegisterEntitySchemaRequest": {**_TENANT, "key": _ident(128), "schema": _struct(16 * _KB)},
    "mnemesh.v1.ForgetRequest": {**_TENANT, "memory_id": Limit("uuid", 36)},
    "mnemesh.v1.RotateTenantKeyRequest": {**_TENANT},
    "mnemesh.v1.ForgetTenantRequest": {**_TENANT, "confirm_tenant_id": _text(64)},  # compared by the handler
    "mnemesh.v1.SearchRequest": {**_TENANT, "query": _text(1_000), "layers": Limit("enum", items=16),
                                 "tags": _ident(64, items=32), "mode": _ident(16), "fusion": _ident(16), "route": _ident(16)},
    "mnemesh.v1.QueryRequest": {**_TENANT, "where": Limit("message", items=16), "order_by": _ident(256)},
    "mnemesh.v1.QueryCondition": {"field": _ident(256), "op": _ident(16), "value": Limit("message")},
    # A condition's value (google.protobuf.Value): one scalar, or a list of up to 100 with `in`.
    "google.protobuf.Value": {"string_value": _text(1_024), "struct_value": _struct(16 * _KB)},
    "google.protobuf.ListValue": {"values": Limit("message", items=100)},
    "mnemesh.v1.RebuildIndexRequest": {},
    "mnemesh.v1.SendRequest": {**_TENANT, "session_id": Limit("session", 128), "device_id": _ident(64),
                               "text": _text(8_000), "idempotency_key": _ident(128)},
    "mnemesh.v1.SubscribeRequest": {**_TENANT, "session_id": Limit("session", 128)},
    "mnemesh.v1.GetSessionRequest": {**_TENANT, "session_id": Limit("session", 128)},
    "mnemesh.v1.RegisterToolRequest": {"tool": Limit("message")},
    "mnemesh.v1.ToolSpec": {
        "name": _ident(128), "description": _text(4_000), "input_schema": _struct(64 * _KB),
        "output_schema": _struct(64 * _KB), "version": _ident(32), "scopes": _ident(64, items=16),
        "fallback": _ident(128, items=8), "requires": _ident(128, items=16),
        "examples": _struct(16 * _KB, items=16), "backend": _ident(512),
        "status_tool": _ident(128)},
    "mnemesh.v1.ListToolsRequest": {**_TENANT},
    "mnemesh.v1.CallToolRequest": {**_TENANT, "name": _ident(128), "arguments": _struct(256 * _KB),
                                   "version": _ident(32), "chain_id": _ident(128),
                                   "context": _ident(128)},
    "mnemesh.v1.RemoveToolRequest": {"name": _ident(128), "version": _ident(32)},
    "mnemesh.v1.GetCallRequest": {**_TENANT, "call_id": _ident(128)},
    "mnemesh.v1.GetTaskRequest": {**_TENANT, "task_id": _ident(128)},
    "mnemesh.v1.CancelTaskRequest": {**_TENANT, "task_id": _ident(128)},
    "mnemesh.v1.ListTasksRequest": {**_TENANT, "cursor": _ident(64)},
    "mnemesh.v1.ToolStatsRequest": {**_TENANT, "name": _ident(128), "context": _ident(128)},
    "mnemesh.v1.SetCanaryRequest": {"name": _ident(128), "version": _ident(32), "callers": _ident(128, items=100)},
    "mnemesh.v1.PromoteRequest": {"name": _ident(128)},
    "mnemesh.v1.RollbackRequest": {"name": _ident(128), "version": _ident(32)},
    # Upstream MCP servers: a command line or a URL, and the environment and headers they need.
    "mnemesh.v1.AddUpstreamRequest": {"upstream": Limit("message")},
    "mnemesh.v1.Upstream": {"name": _ident(64), "command": _text(1_024, items=64), "url": _text(2_048),
                            "prefix": _ident(32), "env": Limit("message", items=64),
                            "headers": Limit("message", items=32), "scopes": _ident(64, items=16)},
    "mnemesh.v1.Upstream.EnvEntry": {"key": _ident(128), "value": _text(4_096)},
    "mnemesh.v1.Upstream.HeadersEntry": {"key": _ident(128), "value": _text(4_096)},
    "mnemesh.v1.RemoveUpstreamRequest": {"name": _ident(64)},
    "mnemesh.v1.ListUpstreamsRequest": {},
    "mnemesh.v1.ListBackendsRequest": {},
    "mnemesh.v1.InvokeRequest": {"backend_id": _ident(64), "operation": _ident(128),
                                 "arguments": _struct(256 * _KB)},
    # Adapter administration: a WSDL and its companions travel as bytes (bounded by the adapter: 20 MB).
    "mnemesh.v1.ImportWsdlRequest": {"backend_id": _ident(64), "url": _text(2_048), "path": _text(1_024),
                                     "base_url": _text(2_048), "documents": Limit("message", items=200),
                                     "options": Limit("message")},
    "mnemesh.v1.ImportWsdlRequest.DocumentsEntry": {"key": _text(2_048)},
    "mnemesh.v1.ImportOptions": {"service": _ident(256), "port": _ident(256), "address": _text(2_048),
                                 "credentials": _ident(64), "operations": Limit("message", items=1_000)},
    "mnemesh.v1.ImportOptions.OperationsEntry": {"key": _ident(256), "value": Limit("message")},
    "mnemesh.v1.DescribeRequest": {"backend_id": _ident(64)},
    "mnemesh.v1.DropRequest": {"backend_id": _ident(64)},
}

# Each returns the value in its canonical form (the same string, but for a UUID: lower-case).
_STRING_RULES: dict[str, Callable[[str, str, int], str]] = {
    "text": check_text, "content": check_content, "identifier": check_identifier,
    "tenant": lambda v, f, n: check_tenant_id(v, f), "session": lambda v, f, n: check_session_id(v, f),
    "uuid": lambda v, f, n: check_uuid(v, f),
}


def check_message(message: Message, prefix: str = "") -> None:
    """Raise ValidationFailed naming the first field of `message` that breaks its limit; put the values
    checked in their canonical form (in `message`)."""
    limits = LIMITS.get(message.DESCRIPTOR.full_name, {})
    for fd, value in message.ListFields():
        path = f"{prefix}{fd.name}"
        limit = limits.get(fd.name)
        if fd.is_repeated:
            _check_repeated(fd, value, path, limit)
            continue
        canonical = _check_value(fd, value, path, limit)
        if fd.type == FieldDescriptor.TYPE_STRING and canonical != value:
            setattr(message, fd.name, canonical)


def check_items(items: Sequence[Message]) -> list[ValidationFailed | None]:
    """Each item of a field of kind "each" checked as `check_message` would: its error (the field named
    within the item, e.g. "content"), or None."""
    return [_item_error(item) for item in items]


def _item_error(item: Message) -> ValidationFailed | None:
    try:
        check_message(item)
    except ValidationFailed as exc:
        return exc
    return None


def _check_repeated(fd: FieldDescriptor, values, path: str, limit: Limit | None) -> None:
    most = limit.items if limit and limit.items else 1_000
    if len(values) > most:
        raise ValidationFailed(f"has {len(values)} items; the limit is {most}", field=path,
                               hint="send fewer; the README's section 'Input limits' lists every limit")
    if limit is not None and limit.kind == "each":
        return  # the service checks each item (check_items) and reports a bad one alone
    if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
        _check_map(fd, values, path)
        return
    for i, item in enumerate(values):
        canonical = _check_value(fd, item, f"{path}[{i}]", limit)
        if fd.type == FieldDescriptor.TYPE_STRING and canonical != item:
            values[i] = canonical


def _check_map(fd: FieldDescriptor, mapping, path: str) -> None:
    """A map field iterates as its keys: check each key, and each value, by the entry's limits."""
    entry = fd.message_type
    limits = LIMITS.get(entry.full_name, {})
    key_fd, value_fd = entry.fields_by_name["key"], entry.fields_by_name["value"]
    for key in mapping:
        where = f"{path}[{quote(str(key), 24)}]"
        _check_value(key_fd, key, f"{where} key", limits.get("key"))
        _check_value(value_fd, mapping[key], where, limits.get("value"))


def _check_value(fd: FieldDescriptor, value, path: str, limit: Limit | None):
    """`value` checked; for a string, its canonical form (what the rule returned)."""
    if fd.type == FieldDescriptor.TYPE_STRING:
        return _check_string(value, path, limit)
    if fd.type == FieldDescriptor.TYPE_ENUM:
        if fd.enum_type.values_by_number.get(value) is None:
            names = ", ".join(v.name for v in fd.enum_type.values)
            raise ValidationFailed(f"is {value}, which is not a {fd.enum_type.name}", field=path,
                                   hint=f"use one of {names}")
    elif fd.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        check_finite(value, path)
    elif fd.type == FieldDescriptor.TYPE_MESSAGE:
        _check_submessage(value, path, limit)
    return value


def _check_string(value: str, path: str, limit: Limit | None) -> str:
    kind, chars = (limit.kind, limit.chars) if limit else ("text", _DEFAULT_TEXT_CHARS)
    if not value:
        return value
    if len(value) > max(chars, 1):
        raise ValidationFailed(f"is {len(value)} characters; the limit is {chars}", field=path,
                               hint="send less; the README's section 'Input limits' lists every limit")
    return _STRING_RULES[kind](value, path, chars)


def _check_submessage(value: Message, path: str, limit: Limit | None) -> None:
    if isinstance(value, timestamp_pb2.Timestamp):
        check_timestamp(value.seconds, value.nanos, path)
    elif isinstance(value, struct_pb2.Struct):
        size = limit.bytes if limit and limit.bytes else 16 * _KB
        if value.ByteSize() > size:
            raise ValidationFailed(f"is {value.ByteSize()} bytes encoded; the limit is {size}", field=path,
                                   hint="send a smaller object")
        _check_struct(value, path, 1)
    else:
        check_message(value, f"{path}.")


def _check_struct(struct: struct_pb2.Struct, path: str, depth: int) -> None:
    if depth > MAX_STRUCT_DEPTH:
        raise ValidationFailed(f"nests deeper than {MAX_STRUCT_DEPTH} levels", field=path,
                               hint="flatten the object")
    for key, value in struct.fields.items():
        where = f"{path}[{quote(key, 24)}]"
        check_text(key, f"{path} key {quote(key, 24)}", MAX_STRUCT_KEY_CHARS)
        _check_json_value(value, where, depth)


def _check_json_value(value: struct_pb2.Value, path: str, depth: int) -> None:
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        check_text(value.string_value, path, 1 << 20)  # the Struct's size limit bounds it already
    elif kind == "number_value":
        check_finite(value.number_value, path)
    elif kind == "struct_value":
        _check_struct(value.struct_value, path, depth + 1)
    elif kind == "list_value":
        if depth + 1 > MAX_STRUCT_DEPTH:
            raise ValidationFailed(f"nests deeper than {MAX_STRUCT_DEPTH} levels", field=path,
                                   hint="flatten the object")
        for i, item in enumerate(value.list_value.values):
            _check_json_value(item, f"{path}[{i}]", depth + 1)

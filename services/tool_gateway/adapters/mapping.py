"""Protobuf <-> tool specs."""

from __future__ import annotations

from google.protobuf import json_format, struct_pb2

from libs.protogen.mnemesh.v1 import common_pb2
from services.tool_gateway.domain import ToolSpec

__all__ = ["spec_from_proto", "spec_to_proto"]


def _struct(value: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(value)
    return s


def spec_from_proto(t: common_pb2.ToolSpec) -> ToolSpec:
    return ToolSpec(
        name=t.name, description=t.description, input_schema=json_format.MessageToDict(t.input_schema),
        output_schema=json_format.MessageToDict(t.output_schema), version=t.version or "1.0.0",
        scopes=tuple(t.scopes), timeout_seconds=t.timeout_seconds or 10.0, retries=t.retries,
        fallback=tuple(t.fallback), requires=tuple(t.requires),
        examples=tuple(json_format.MessageToDict(e) for e in t.examples), backend=t.backend,
    )


def spec_to_proto(s: ToolSpec) -> common_pb2.ToolSpec:
    return common_pb2.ToolSpec(
        name=s.name, description=s.description, input_schema=_struct(s.input_schema),
        output_schema=_struct(s.output_schema), version=s.version, scopes=list(s.scopes),
        timeout_seconds=s.timeout_seconds, retries=s.retries, fallback=list(s.fallback), requires=list(s.requires),
        examples=[_struct(e) for e in s.examples], backend=s.backend,
    )

"""Protobuf <-> tool specs."""

from __future__ import annotations

from google.protobuf import json_format, struct_pb2

from libs.protogen.mnemesh.v1 import common_pb2, tools_pb2
from services.tool_gateway.domain import ToolSpec
from services.tool_gateway.domain.experience import Experience, note, percentile
from services.tool_gateway.domain.rollout import Rollout
from services.tool_gateway.domain.upstream import UpstreamConfig, UpstreamStatus

__all__ = ["rollout_to_proto", "spec_from_proto", "spec_to_proto", "stat_to_proto", "upstream_from_proto",
           "upstream_to_proto"]


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
        status_tool=t.status_tool,
    )


def spec_to_proto(s: ToolSpec) -> common_pb2.ToolSpec:
    return common_pb2.ToolSpec(
        name=s.name, description=s.description, input_schema=_struct(s.input_schema),
        output_schema=_struct(s.output_schema), version=s.version, scopes=list(s.scopes),
        timeout_seconds=s.timeout_seconds, retries=s.retries, fallback=list(s.fallback), requires=list(s.requires),
        examples=[_struct(e) for e in s.examples], backend=s.backend, status_tool=s.status_tool,
    )


def stat_to_proto(exp: Experience) -> tools_pb2.ToolStat:
    return tools_pb2.ToolStat(
        name=exp.tool, context=exp.context, calls=exp.calls, failures=exp.failures, success_rate=exp.success_rate,
        p50_ms=percentile(exp.buckets, 0.5), p95_ms=percentile(exp.buckets, 0.95),
        p99_ms=percentile(exp.buckets, 0.99), note=note(exp), best_arguments=_struct(exp.best_arguments()),
        common_errors=[tools_pb2.CommonError(error_type=e["error_type"], field=e["field"], reason=e.get("reason", ""),
                                             hint=e.get("hint", ""), count=e["count"])
                       for e in exp.common_errors()])


def rollout_to_proto(r: Rollout) -> tools_pb2.Rollout:
    return tools_pb2.Rollout(name=r.name, stable=r.stable, canary=r.canary, percent=r.percent, callers=list(r.callers),
                             max_error_rate_delta=r.max_error_rate_delta, min_calls=r.min_calls, state=r.state,
                             reason=r.reason)


def upstream_from_proto(u: tools_pb2.Upstream) -> UpstreamConfig:
    return UpstreamConfig(name=u.name, command=list(u.command), url=u.url,
                          prefix="" if u.no_prefix else (u.prefix or None), env=dict(u.env), headers=dict(u.headers),
                          timeout_seconds=u.timeout_seconds or 30.0, scopes=tuple(u.scopes))


def upstream_to_proto(config: UpstreamConfig, status: UpstreamStatus) -> tools_pb2.UpstreamStatus:
    # Header and environment values may be credentials: their names only.
    upstream = tools_pb2.Upstream(name=config.name, command=config.command, url=config.url,
                                  prefix=config.prefix or "", no_prefix=config.prefix == "",
                                  env={k: "***" for k in config.env}, headers={k: "***" for k in config.headers},
                                  timeout_seconds=config.timeout_seconds, scopes=list(config.scopes))
    return tools_pb2.UpstreamStatus(upstream=upstream, state=status.state, reason=status.reason,
                                    restarts=status.restarts, tools=status.tools)

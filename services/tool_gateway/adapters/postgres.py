"""The tool registry in PostgreSQL, with its events through the outbox."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from google.protobuf import struct_pb2

from libs.db import Database, rowcount
from libs.events import Envelope
from libs.outbox import Outbox
from libs.protogen.mnemesh.v1 import common_pb2, events_pb2
from services.tool_gateway.adapters.mapping import spec_to_proto
from services.tool_gateway.domain import CallRecord, ToolSpec
from services.tool_gateway.domain.rollout import Rollout

__all__ = ["PostgresCallLog", "PostgresRegistry", "Prepared", "registry_channel"]

Prepared = tuple[CallRecord, Envelope, datetime]  # an audit row, its event, when the call ended

# Tools are shared by every tenant of a deployment (the registry has no row-level security);
# their events carry this tenant id.
SYSTEM_TENANT = "_system"


def registry_channel(db: Database) -> str:
    """The NOTIFY channel of registry changes (tools and rollouts), for the replicas' caches."""
    return f"mnemesh_tools_{db.schema}"


class PostgresRegistry:
    def __init__(self, db: Database, outbox: Outbox) -> None:
        self.db, self.outbox = db, outbox
        self.channel = registry_channel(db)

    async def _announce(self, conn, name: str) -> None:
        await conn.execute("SELECT pg_notify($1, $2)", self.channel, name)  # delivered at commit, if any

    async def register(self, spec: ToolSpec) -> bool:
        async with self.db.transaction(SYSTEM_TENANT) as conn:
            status = await conn.execute(
                "INSERT INTO tools (name, version, spec) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                spec.name, spec.version, asdict(spec))
            if rowcount(status) == 0:
                return False
            await self._announce(conn, spec.name)
            event = events_pb2.ToolRegistered(tool=spec_to_proto(spec))
            await self.outbox.add(conn, Envelope.wrap(event, event_type="tool.registered", tenant_id=SYSTEM_TENANT))
            return True

    async def list(self) -> list[ToolSpec]:
        async with self.db.connection() as conn:
            rows = await conn.fetch("SELECT spec FROM tools ORDER BY name, registered_at DESC")
        return [_spec(row[0]) for row in rows]

    async def versions(self, name: str) -> list[ToolSpec]:
        async with self.db.connection() as conn:
            rows = await conn.fetch("SELECT spec FROM tools WHERE name = $1", name)  # the primary key's prefix
        return [_spec(row[0]) for row in rows]

    async def lookup(self, name: str) -> tuple[list[ToolSpec], Rollout | None]:
        async with self.db.connection() as conn:  # both primary keys: one round trip, no scan
            rows = await conn.fetch(
                "SELECT 'v' AS kind, spec, NULL::jsonb AS rollout FROM tools WHERE name = $1 UNION ALL "
                "SELECT 'r', NULL, to_jsonb(r) FROM tool_rollouts r WHERE name = $1", name)
        rollout = next((_rollout(row["rollout"]) for row in rows if row["kind"] == "r"), None)
        return [_spec(row["spec"]) for row in rows if row["kind"] == "v"], rollout

    async def remove(self, name: str, version: str = "") -> list[str]:
        async with self.db.transaction(SYSTEM_TENANT) as conn:
            # One removal of a name at a time, so that what is left is counted after the other's commit.
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext('mnemesh.tools'), hashtext($1))", name)
            rows = await conn.fetch("DELETE FROM tools WHERE name = $1 AND ($2 = '' OR version = $2)"
                                    " RETURNING version", name, version)
            left = await conn.fetchval("SELECT count(*) FROM tools WHERE name = $1", name)
            if not left:  # the tool is gone: its rollout too
                await conn.execute("DELETE FROM tool_rollouts WHERE name = $1", name)
            await self._announce(conn, name)
            removed = sorted(row[0] for row in rows)
            if removed:  # in the same transaction: the event is published exactly when the removal commits
                event = events_pb2.ToolRemoved(name=name, versions=removed, all_versions=left == 0)
                await self.outbox.add(conn, Envelope.wrap(event, event_type="tool.removed", tenant_id=SYSTEM_TENANT))
        return removed

    async def rollouts(self) -> dict[str, Rollout]:
        async with self.db.connection() as conn:
            rows = await conn.fetch("SELECT to_jsonb(r) FROM tool_rollouts r")
        return {r.name: r for r in (_rollout(row[0]) for row in rows)}

    async def save_rollout(self, rollout: Rollout, expect_canary: str | None = None) -> bool:
        async with self.db.transaction(SYSTEM_TENANT) as conn:
            status = await conn.execute(
                "INSERT INTO tool_rollouts AS t (name, stable, canary, percent, callers, max_error_rate_delta,"
                " min_calls, state, reason, epoch) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
                " ON CONFLICT (name) DO UPDATE SET stable = $2, canary = $3, percent = $4, callers = $5,"
                " max_error_rate_delta = $6, min_calls = $7, state = $8, reason = $9, epoch = $10, updated_at = now()"
                " WHERE $11::text IS NULL OR t.canary = $11",
                rollout.name, rollout.stable, rollout.canary, rollout.percent, list(rollout.callers),
                rollout.max_error_rate_delta, rollout.min_calls, rollout.state, rollout.reason, rollout.epoch,
                expect_canary)
            await self._announce(conn, rollout.name)
        return rowcount(status) == 1


def _spec(stored: dict) -> ToolSpec:
    return ToolSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in stored.items()})


def _rollout(row: dict) -> Rollout:
    return Rollout(name=row["name"], stable=row["stable"], canary=row["canary"], percent=row["percent"],
                   callers=tuple(row["callers"]), max_error_rate_delta=row["max_error_rate_delta"],
                   min_calls=row["min_calls"], state=row["state"], reason=row["reason"], epoch=row["epoch"])


class PostgresCallLog:
    """The audit row and its tool.called event commit together, in the caller's tenant."""

    def __init__(self, db: Database, outbox: Outbox) -> None:
        self.db, self.outbox = db, outbox

    async def record(self, record: CallRecord) -> None:
        await self.write([self.prepare(record)])

    @staticmethod
    def prepare(record: CallRecord) -> Prepared:
        """The row and its event, built now: the event carries the trace of the call that made it, the row
        the time the call ended (not the time a batch is written)."""
        return record, _called_event(record), datetime.now(UTC)

    async def write(self, prepared: list[Prepared]) -> None:
        """Many calls' rows and events: one transaction per tenant (each row stays in its tenant)."""
        by_tenant: dict[str, list[Prepared]] = {}
        for item in prepared:
            by_tenant.setdefault(item[0].tenant_id, []).append(item)
        for tenant_id, group in by_tenant.items():
            async with self.db.transaction(tenant_id) as conn:
                await conn.executemany(
                    "INSERT INTO tool_calls (call_id, tenant_id, caller, tool, version, args_sha256, outcome,"
                    " error_type, error, latency_ms, trace_id, context, chain_id, called_at)"
                    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
                    [(r.call_id, r.tenant_id, r.caller, r.tool, r.version, r.args_sha256, r.outcome,
                      str((r.error or {}).get("error_type", "")), r.error, r.latency_ms, r.trace_id, r.context,
                      r.chain_id, at) for r, _, at in group])
                await self.outbox.add_many(conn, [envelope for _, envelope, _ in group])

    async def find(self, tenant_id: str, call_id: str) -> CallRecord | None:
        async with self.db.transaction(tenant_id) as conn:
            row = await conn.fetchrow(
                "SELECT * FROM tool_calls WHERE tenant_id = $1 AND (call_id = $2 OR (chain_id = $2 AND $2 <> ''))"
                " ORDER BY called_at DESC LIMIT 1", tenant_id, call_id)
        if row is None:
            return None
        return CallRecord(call_id=row["call_id"], tenant_id=row["tenant_id"], caller=row["caller"], tool=row["tool"],
                          version=row["version"], args_sha256=row["args_sha256"], outcome=row["outcome"],
                          error=row["error"], latency_ms=row["latency_ms"], trace_id=row["trace_id"],
                          context=row["context"], chain_id=row["chain_id"])


def _called_event(record: CallRecord) -> Envelope:
    """The tool.called event of `record`. Its payload is printed here, as protobuf's printer prints the
    message (field order, camelCase names, defaults left out, Struct numbers as doubles): the printer costs
    more than the rest of the audit row together. A record the printer would treat otherwise (a value that
    is not JSON's, a number JSON cannot hold) goes through the message as before."""
    try:
        payload = _called_json(record)
    except (TypeError, ValueError, OverflowError):
        return Envelope.wrap(_called_message(record), event_type="tool.called", tenant_id=record.tenant_id)
    return Envelope.wrap_json(payload, event_type="tool.called", tenant_id=record.tenant_id)


def _called_message(record: CallRecord) -> events_pb2.ToolCalled:
    error = record.error or {}
    event = events_pb2.ToolCalled(
        tenant=common_pb2.TenantContext(tenant_id=record.tenant_id), call_id=record.call_id, tool=record.tool,
        version=record.version, caller=record.caller, args_sha256=record.args_sha256, outcome=record.outcome,
        latency_ms=record.latency_ms, context=record.context, served_by=record.served_by,
        attempts=record.attempts, error=common_pb2.ErrorDetail(**error) if error else None)
    if record.arguments:
        event.arguments.CopyFrom(_struct(record.arguments))
    return event


_ERROR_FIELDS = (("error_type", "errorType"), ("field", "field"), ("reason", "reason"), ("retryable", "retryable"),
                 ("hint", "hint"))


def _called_json(record: CallRecord) -> str:
    """ToolCalled's proto3 JSON, as json_format.MessageToJson(indent=None) prints it; raises what makes the
    caller take the message's way instead."""
    out: dict[str, Any] = {"tenant": {"tenantId": _string(record.tenant_id)} if record.tenant_id else {}}
    for name, key in (("call_id", "callId"), ("tool", "tool"), ("version", "version"), ("caller", "caller"),
                      ("args_sha256", "argsSha256"), ("outcome", "outcome")):
        if value := _string(getattr(record, name)):
            out[key] = value
    latency = record.latency_ms
    if type(latency) not in (float, int) or not math.isfinite(latency):
        raise ValueError("latency")
    if latency:
        out["latencyMs"] = float(latency)
    if record.error:
        error: dict[str, Any] = {}
        if set(record.error) - {name for name, _ in _ERROR_FIELDS}:
            raise TypeError("unknown error field")
        for name, key in _ERROR_FIELDS:
            value = record.error.get(name)
            if name == "retryable":
                if type(value) is not bool and value is not None:
                    raise TypeError("retryable")
                if value:
                    error[key] = True
            elif value := _string(value) if value is not None else "":
                error[key] = value
        out["error"] = error
    if value := _string(record.context):
        out["context"] = value
    if record.arguments:
        out["arguments"] = _json_value(record.arguments)
    if value := _string(record.served_by):
        out["servedBy"] = value
    attempts = record.attempts
    if type(attempts) is not int or not -2**31 <= attempts < 2**31:
        raise ValueError("attempts")
    if attempts:
        out["attempts"] = attempts
    return json.dumps(out, allow_nan=False)


def _string(value: object) -> str:
    if type(value) is not str:
        raise TypeError("not a string")
    return value


def _json_value(value: Any) -> Any:
    """A value as a Struct holds it: numbers as doubles, tuples as lists; anything else raises."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return value
    if kind is int or kind is float:
        number = float(value)
        if not math.isfinite(number):
            raise ValueError("not finite")
        return number
    if kind is dict:
        return {_string(k): _json_value(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [_json_value(v) for v in value]
    raise TypeError(kind.__name__)


def _struct(value: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(value)
    return s

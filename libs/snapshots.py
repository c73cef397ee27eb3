"""Snapshots for event-sourced aggregates: the latest state of a stream at a version.

Rebuilding = the snapshot + the stream's events after its version; an aggregate whose
`apply` is deterministic gets exactly the state a full replay gives (tested by the
orchestrator). A snapshot names the shape of its state (`schema`): after a change of
shape the old snapshots are ignored, never misread, and the next save replaces them.
Snapshots live beside the events (same schema, same tenant policy) and are written in
the appending transaction, so one never runs ahead of the events it summarises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg

__all__ = ["Snapshot", "SnapshotStore"]


@dataclass(frozen=True)
class Snapshot:
    stream_id: str
    version: int
    state: dict[str, Any]


class SnapshotStore:
    """`every`: take a snapshot when the stream has moved this many events past the last one."""

    def __init__(self, every: int = 100) -> None:
        if every < 1:
            raise ValueError("every must be at least 1")
        self.every = every

    @staticmethod
    async def load(conn: asyncpg.Connection, stream_id: str, schema: str) -> Snapshot | None:
        row = await conn.fetchrow("SELECT version, state FROM snapshots WHERE stream_id = $1 AND schema = $2",
                                  stream_id, schema)
        return Snapshot(stream_id, row["version"], row["state"]) if row else None

    def due(self, last_snapshot_version: int, version: int) -> bool:
        return version - last_snapshot_version >= self.every

    @staticmethod
    async def save(conn: asyncpg.Connection, tenant_id: str, stream_id: str, schema: str, version: int,
                   state: dict[str, Any]) -> None:
        """Keep `state` as the stream's snapshot at `version`, unless a newer one is already kept."""
        await conn.execute(
            "INSERT INTO snapshots (stream_id, tenant_id, schema, version, state) VALUES ($1, $2, $3, $4, $5)"
            " ON CONFLICT (stream_id) DO UPDATE SET schema = excluded.schema, version = excluded.version,"
            " state = excluded.state, taken_at = now()"
            " WHERE snapshots.version < excluded.version OR snapshots.schema <> excluded.schema",
            stream_id, tenant_id, schema, version, state)

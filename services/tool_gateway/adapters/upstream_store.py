"""Upstream MCP servers added at run time, in PostgreSQL: every replica connects to each of them."""

from __future__ import annotations

from libs.db import Database, rowcount
from services.tool_gateway.domain.upstream import UpstreamConfig, config_from_dict, config_to_dict

__all__ = ["PostgresUpstreams"]

SYSTEM_TENANT = "_system"


class PostgresUpstreams:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def add(self, config: UpstreamConfig) -> bool:
        async with self.db.transaction(SYSTEM_TENANT) as conn:
            status = await conn.execute("INSERT INTO tool_upstreams (name, config) VALUES ($1, $2)"
                                        " ON CONFLICT DO NOTHING", config.name, config_to_dict(config))
        return rowcount(status) == 1

    async def remove(self, name: str) -> bool:
        async with self.db.transaction(SYSTEM_TENANT) as conn:
            return rowcount(await conn.execute("DELETE FROM tool_upstreams WHERE name = $1", name)) == 1

    async def list(self) -> list[UpstreamConfig]:
        async with self.db.connection() as conn:
            rows = await conn.fetch("SELECT config FROM tool_upstreams ORDER BY name")
        return [config_from_dict(dict(row[0])) for row in rows]
